"""Data-parallel map: a function over many items, on every core, crash-safe.

Workers import ``paralela.tasks`` only; the rest loads when the API is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.mapping._api import check_picklable, choose_backend, imap, map
    from paralela.mapping._engine import MapIterator
    from paralela.mapping._summary import ChunkTiming, MapSummary, Results, WorkerStats

__all__ = [
    "ChunkTiming",
    "MapIterator",
    "MapSummary",
    "Results",
    "WorkerStats",
    "imap",
    "map",
    # for capabilities built on map's pieces (mapreduce)
    "check_picklable",
    "choose_backend",
]

_LAZY = {
    "imap": "paralela.mapping._api",
    "map": "paralela.mapping._api",
    "check_picklable": "paralela.mapping._api",
    "choose_backend": "paralela.mapping._api",
    "MapIterator": "paralela.mapping._engine",
    "ChunkTiming": "paralela.mapping._summary",
    "MapSummary": "paralela.mapping._summary",
    "Results": "paralela.mapping._summary",
    "WorkerStats": "paralela.mapping._summary",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.mapping' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
