"""Data-parallel map: a function over many items, on every core, crash-safe."""

from paralela.mapping._api import imap, map
from paralela.mapping._engine import MapIterator
from paralela.mapping._summary import ChunkTiming, MapSummary, Results, WorkerStats

__all__ = ["ChunkTiming", "MapIterator", "MapSummary", "Results", "WorkerStats", "imap", "map"]
