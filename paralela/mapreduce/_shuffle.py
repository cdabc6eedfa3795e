"""The shuffle of a MapReduce job, between map tasks and reduce tasks.

    map task ──pairs──> MapOutput (_spill) ──sorted spill files──> segments per partition
    reduce task <──(key, result)── reduce_partition (_merge) <──segments of one partition

:func:`partition_of` (:mod:`._hashing`) sends a key to the same partition in every
process; :class:`MapOutput` buffers, combines, sorts and spills under a memory limit
(:mod:`._spill`; the on-disk format is drawn in :mod:`._segments`);
:func:`reduce_partition` merges the segments of one partition with bounded memory
(:mod:`._merge`).
"""

from __future__ import annotations

from paralela.mapreduce._hashing import canonical, order, partition_of
from paralela.mapreduce._merge import read_segment, reduce_partition
from paralela.mapreduce._spill import MapOutput, Segment, ShuffleStats

__all__ = [
    "MapOutput",
    "Segment",
    "ShuffleStats",
    "canonical",
    "order",
    "partition_of",
    "read_segment",
    "reduce_partition",
]
