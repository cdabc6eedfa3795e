"""Hyperparameter sweeps: one trial per device, early stopping, resumable.

``import paralela.sweeping`` is cheap; Optuna loads when a sweep starts.
"""

from __future__ import annotations

import importlib

# typing is not imported at run time: a sweep's function-trial workers import this package.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from paralela.space import (
        Categorical,
        Choice,
        Fixed,
        Float,
        Grid,
        Int,
        Space,
        load_space,
    )
    from paralela.sweeping._api import sweep
    from paralela.sweeping._context import TrialPruned
    from paralela.sweeping._driver import SweepError
    from paralela.sweeping._identity import identify
    from paralela.sweeping._report import current_params, report
    from paralela.sweeping._results import SweepResult, TrialRecord
    from paralela.sweeping._slurm import submit_sweep

__all__ = [
    "Categorical",
    "Choice",
    "Fixed",
    "Float",
    "Grid",
    "Int",
    "Space",
    "SweepError",
    "SweepResult",
    "TrialPruned",
    "TrialRecord",
    "current_params",
    "load_space",
    "report",
    "sweep",
    # what `paralela sweep --backend slurm` submits: the sweep as one Slurm job
    "identify",
    "submit_sweep",
]

_LAZY = {
    "sweep": "paralela.sweeping._api",
    "SweepError": "paralela.sweeping._driver",
    "TrialPruned": "paralela.sweeping._context",
    "current_params": "paralela.sweeping._report",
    "report": "paralela.sweeping._report",
    "SweepResult": "paralela.sweeping._results",
    "TrialRecord": "paralela.sweeping._results",
    "identify": "paralela.sweeping._identity",
    "submit_sweep": "paralela.sweeping._slurm",
    **dict.fromkeys(
        ("Categorical", "Choice", "Fixed", "Float", "Grid", "Int", "Space", "load_space"),
        "paralela.space",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.sweeping' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
