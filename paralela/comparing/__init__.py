"""Compare models: cross-validate many estimators and grids on every slot at once.

``import paralela.comparing`` is cheap; scikit-learn and Optuna load when a comparison
starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.comparing._api import compare
    from paralela.comparing._data import is_classification, load_table
    from paralela.comparing._families import DEFAULT_SEED, families_from
    from paralela.comparing._results import CandidateRecord, CompareError, CompareResult

__all__ = [
    "CandidateRecord",
    "CompareError",
    "CompareResult",
    "compare",
    # what `paralela compare` reads before it compares: the table and the families
    "DEFAULT_SEED",
    "families_from",
    "is_classification",
    "load_table",
]

_LAZY = {
    "compare": "paralela.comparing._api",
    "load_table": "paralela.comparing._data",
    "is_classification": "paralela.comparing._data",
    "families_from": "paralela.comparing._families",
    "DEFAULT_SEED": "paralela.comparing._families",
    "CompareResult": "paralela.comparing._results",
    "CandidateRecord": "paralela.comparing._results",
    "CompareError": "paralela.comparing._results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
