"""The search-space language: the parameters a sweep or a comparison searches over.

A space comes from code (``Space((Float("lr", 1e-5, 0.1, log=True), ...))``), from a
mapping or a YAML/TOML file (one entry per parameter), or from a CSV of configurations
(one row, one trial)::

    file / mapping --space_from_dict--> Space(params)              sampled by Optuna
    CSV            --load_space-------> Space(params, configurations)   run as listed
    Space.distributions() -> {name: optuna distribution}   (Fixed values left out)
    Space.grid()          -> [{name: value}, ...]          (cartesian product, fixed included)

A :class:`Choice` makes a space conditional: each option has parameters of its own,
named ``option.param`` in a trial's flat parameters, and only the chosen option's are
drawn::

    Space.sample(trial)   -> {"model": "forest", "forest.n_estimators": 120}  (define-by-run)
    Space.grid()          -> every option with its own grid

Contract: every bad input raises :class:`~paralela.errors.ConfigError` naming the file,
the line or row, the parameter (inside a choice: its path), what is allowed and what to
do. Optuna, PyYAML and tomllib are imported only when used, so importing this package is
cheap. Used by ``paralela.sweeping`` and ``paralela.comparing``; imports nothing of
paralela but ``paralela.errors``.

Modules: ``_checks`` (the checks and their error), ``_params`` (the parameters that
hold values), ``_space`` (:class:`Space` and :class:`Choice`), ``_forms`` (the file
form, mappings and paths), ``_files`` (YAML, TOML and CSV files, with line numbers).
"""

from __future__ import annotations

from paralela.space._checks import MAX_GRID_POINTS
from paralela.space._files import as_space, load_space, load_sweep_file
from paralela.space._forms import space_from_dict, sweep_from_dict
from paralela.space._params import Categorical, Fixed, Float, Grid, Int, Param
from paralela.space._space import Choice, Space, branch_params

__all__ = [
    "MAX_GRID_POINTS",
    "Categorical",
    "Choice",
    "Fixed",
    "Float",
    "Grid",
    "Int",
    "Param",
    "Space",
    "as_space",
    "branch_params",
    "load_space",
    "load_sweep_file",
    "space_from_dict",
    "sweep_from_dict",
]
