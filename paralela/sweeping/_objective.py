"""What a sweep's function objective takes: a dict of parameters, or an Optuna trial.

``objective(params)`` is paralela's own form: the driver samples the space and hands the
worker the values. ``objective(trial)`` is Optuna's define-by-run form: the objective
calls ``trial.suggest_*`` itself, in its worker, so code written for ``study.optimize``
runs unchanged, conditional parameters and all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from paralela.errors import ConfigError

__all__ = ["takes_trial"]

# Annotations that say "an Optuna trial", as text (``from __future__ import annotations``
# leaves them unevaluated) or as the classes' names.
_TRIAL_TYPES = ("Trial", "BaseTrial", "FrozenTrial", "FixedTrial")


def takes_trial(objective: Callable[..., Any], *, space_given: bool) -> bool:
    """Whether ``objective`` is define-by-run: its first parameter is named ``trial`` or
    annotated as an Optuna trial, or no space was given (then it must be).

    A parameter annotated as a mapping, or named ``params``/``config``, takes the dict.
    """
    try:
        parameters = list(inspect.signature(objective).parameters.values())
    except (TypeError, ValueError):  # a builtin or an extension: no signature to read
        return not space_given
    if not parameters:
        raise ConfigError(
            f"The objective {_name(objective)} takes no argument; it must take the trial's "
            "parameters (objective(params): a dict) or an Optuna trial (objective(trial))."
        )
    first = parameters[0]
    annotation = first.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if str(text).strip("'\"").rpartition(".")[2] in _TRIAL_TYPES or first.name == "trial":
        return True
    return not space_given


def _name(objective: Callable[..., Any]) -> str:
    return getattr(objective, "__qualname__", None) or repr(objective)
