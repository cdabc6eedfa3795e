"""A family's parameters given as scikit-learn grids: one grid, or a list of grids.

::

    {"C": [1, 10], "kernel": ["rbf"]}           ──> Space(Grid C, Grid kernel)
    {"C": {"type": "float", ...}}               ──> Space(Float C)       (space-file entries)
    [grid_a, grid_b]   (GridSearchCV's list)    ──> Space(Choice GRIDS {grid0: a, grid1: b})
                                                         │
    candidate params (plain_params) <── {"_grid": "grid1", "grid1.C": 10} ──┘

A list of grids, as ``GridSearchCV``'s ``param_grid`` and ``RandomizedSearchCV``'s
``param_distributions`` take it, is one choice among the grids: the grid search runs
each grid in turn (:func:`points`, ``ParameterGrid``'s order), a sampler draws a grid and
then its parameters. The choice is the comparison's bookkeeping, not the estimator's:
:func:`plain_params` takes it off, so a candidate's parameters are the estimator's
(``{"C": 10, "kernel": "linear"}``), as in ``cv_results_["params"]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence, Set
from typing import Any

from paralela.comparing._store import candidate_key
from paralela.errors import ConfigError
from paralela.space import Choice, Grid, Param, Space, space_from_dict

__all__ = ["GRIDS", "grid_space", "plain_params", "points"]

GRIDS = "_grid"  # the choice among a list of grids; its options are grid0, grid1, ...
_SCALARS = (type(None), bool, int, float, str)  # grid values Optuna stores as they are


def grid_space(family: str, grid: Any) -> tuple[Space, dict[str, dict[str, Any]]]:
    """A scikit-learn param grid (``{param: [values]}``, lists are grid axes),
    space-file entries (``{C: {type: float, ...}}``), a list of those, or a Space; and
    the labels of grid values that go by their ``repr`` (:func:`_grid_axis`)."""
    if grid is None:
        return Space(()), {}
    if isinstance(grid, Space):
        return grid, {}
    if isinstance(grid, Mapping):
        return _one_grid(family, grid, set())
    if not isinstance(grid, (list, tuple)):
        raise ConfigError(
            f"Family {family!r}: the grid must be a mapping of parameter to values "
            f"({{'C': [0.1, 1, 10]}}) or of parameter to space entry, or a list of those "
            f"(as GridSearchCV's param_grid), got {type(grid).__name__}."
        )
    if not grid:
        raise ConfigError(
            f"Family {family!r}: the list of grids is empty; give at least one grid "
            "({'C': [0.1, 1, 10]}), or no grid for the estimator's defaults."
        )
    for number, item in enumerate(grid, 1):
        if not isinstance(item, Mapping):
            raise ConfigError(
                f"Family {family!r}: grid {number} of the list is a {type(item).__name__}, "
                f"not a mapping of parameter to values ({{'C': [0.1, 1, 10]}})."
            )
    # A string value is kept apart from another grid's value labelled by the same repr.
    taken = {
        (name, v)
        for item in grid
        for name, values in item.items()
        if isinstance(values, (list, tuple))
        for v in values
        if isinstance(v, str)
    }
    spaces: dict[str, Space] = {}
    labels: dict[str, dict[str, Any]] = {}
    for number, item in enumerate(grid):
        try:
            spaces[f"grid{number}"], found = _one_grid(family, item, taken)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (grid {number + 1} of the list)") from None
        for name, named in found.items():
            labels.setdefault(name, {}).update(named)
    if len(spaces) == 1:
        return spaces["grid0"], labels
    return Space((Choice(GRIDS, spaces),)), labels


def _one_grid(
    family: str, grid: Mapping[Any, Any], taken: set[tuple[str, str]]
) -> tuple[Space, dict[str, dict[str, Any]]]:
    params: list[Param] = []
    labels: dict[str, dict[str, Any]] = {}
    for name, values in grid.items():
        try:
            if isinstance(values, (list, tuple)) or hasattr(values, "tolist"):
                # a list, or an array (np.logspace(-3, 3, 7)) as GridSearchCV takes it
                strings = {v for n, v in taken if n == name}
                axis, labels[name] = _grid_axis(name, list(values), strings)
                params.append(axis)
            else:
                params.extend(space_from_dict({name: values}, source=f"family {family!r}").params)
        except ConfigError as exc:
            raise ConfigError(f"Family {family!r}: {exc}") from None
    return Space(tuple(params)), {k: v for k, v in labels.items() if v}


def _grid_axis(
    name: str, values: Sequence[Any], strings: Set[str] = frozenset()
) -> tuple[Grid, dict[str, Any]]:
    """One axis of a scikit-learn grid. Values Optuna can store (numbers, strings,
    booleans, None) stay as they are; any other (``(64,)`` for ``hidden_layer_sizes``,
    an estimator for a pipeline step) goes by its ``repr`` as a label, turned back into
    the value itself when the estimator is built. ``strings``: string values of this
    parameter elsewhere (another grid of the list), which a label must not be."""
    labels: dict[str, Any] = {}
    shown: list[Any] = []
    taken = {v for v in values if isinstance(v, str)} | set(strings)
    for value in values:
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
            value = value.item()  # np.int64(3), np.float32(0.1): the number
        if isinstance(value, _SCALARS):
            shown.append(value)
            continue
        label = repr(value)
        while label in taken or label in labels:
            label += "'"  # a string value spelt like the repr: keep them apart
        labels[label] = value
        shown.append(label)
    return Grid(name, tuple(shown)), labels


def plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A candidate's parameters without the choice among a list of grids:
    ``{"_grid": "grid1", "grid1.C": 10}`` -> ``{"C": 10}``; others as they are."""
    chosen = params.get(GRIDS)
    if not isinstance(chosen, str):
        return dict(params)
    head = chosen + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


def points(space: Space) -> list[dict[str, Any]]:
    """Every grid point of one family, fixed values added, in ``ParameterGrid``'s order:
    each grid of a list in turn (a point already listed is not listed again), in each
    the names sorted and the last one fastest; :meth:`Space.grid`'s order for a family
    whose space has choices of its own."""
    if len(space.params) == 1 and isinstance(space.params[0], Choice):
        choice = space.params[0]
        if choice.name == GRIDS:
            out: dict[str, dict[str, Any]] = {}
            for branch in choice.options.values():
                for point in points(branch):
                    out.setdefault(candidate_key("", point), point)
            return list(out.values())
    if space.conditional:
        return space.grid()
    axes = space.grid_axes()
    names = sorted(axes)
    fixed = space.fixed()
    return [
        {**fixed, **dict(zip(names, combo, strict=True))}
        for combo in itertools.product(*(axes[n] for n in names))
    ]
