"""What a MapReduce job returns: a lazy, re-iterable result and its summary."""

from __future__ import annotations

import itertools
import shutil
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from paralela.mapreduce._output import Part, read_part

__all__ = ["MapReduceResult", "MapReduceSummary"]


@dataclass
class MapReduceSummary:
    """Counters and timings of one job, filled in as it runs.

    Attributes:
        engine: ``"local"`` or ``"spark"``.
        records: input records the mapper was called on (in this call; records of map
            tasks reused from the run directory are counted too).
        pairs_emitted: pairs the mapper yielded.
        pairs_after_combining: pairs written to spill files after the map-side combiner
            (equal to ``pairs_emitted`` without a combiner).
        bytes_shuffled: bytes of spill files the reduce tasks read.
        spills: spill files written (a map task writes one each time its buffer
            reaches ``memory_limit``, and one at its end).
        peak_buffer_bytes: the largest map-side buffer any map task held (its estimate).
        keys: distinct keys in the result (pairs written by the reduce tasks).
        splits: input splits; a map task reads one, or several small ones joined.
        map_tasks, reduce_tasks: tasks of each phase (``reduce_tasks`` = partitions).
        map_tasks_reused, reduce_tasks_reused: tasks read back from the run directory
            instead of run again.
        retries: tasks run again because their worker died.
        plan_seconds, map_seconds, reduce_seconds, wall_seconds: time per phase, and in all.
        workers: workers of the backend; memory_limit: the map-side buffer per task.
    """

    engine: str = "local"
    records: int = 0
    pairs_emitted: int = 0
    pairs_after_combining: int = 0
    bytes_shuffled: int = 0
    spills: int = 0
    peak_buffer_bytes: int = 0
    keys: int = 0
    splits: int = 0
    map_tasks: int = 0
    reduce_tasks: int = 0
    map_tasks_reused: int = 0
    reduce_tasks_reused: int = 0
    retries: int = 0
    plan_seconds: float = 0.0
    map_seconds: float = 0.0
    reduce_seconds: float = 0.0
    wall_seconds: float = 0.0
    workers: int = 0
    memory_limit: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        reused = ""
        if self.map_tasks_reused or self.reduce_tasks_reused:
            reused = (
                f" ({self.map_tasks_reused} map and {self.reduce_tasks_reused} reduce "
                "tasks reused from the run directory)"
            )
        return (
            f"{self.records:,} records -> {self.pairs_emitted:,} pairs "
            f"({self.pairs_after_combining:,} after combining) -> {self.keys:,} keys "
            f"in {self.wall_seconds:.2f} s [plan {self.plan_seconds:.2f} s, map "
            f"{self.map_seconds:.2f} s, reduce {self.reduce_seconds:.2f} s]; "
            f"{self.splits} splits, {self.map_tasks} map / {self.reduce_tasks} reduce "
            f"tasks{reused}, {self.retries} retried; {self.spills} spills, "
            f"{_size(self.bytes_shuffled)} shuffled; engine {self.engine}, "
            f"{self.workers} workers"
        )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


class MapReduceResult:
    """The ``(key, value)`` pairs of a job: lazy and re-iterable.

    Each iteration reads the partition files again, one after the other (partition 0
    first; within a partition, keys come in the order the reduce task wrote them: sorted
    by the shuffle's key order). Nothing is held in memory, so a result of any size can
    be walked; :meth:`to_dict` builds a dict when it fits.

    Attributes:
        summary: the job's :class:`MapReduceSummary`.
        parts: the partition files.
        output_files: the files written under ``output=`` (empty without it).
    """

    def __init__(
        self,
        parts: Sequence[Part],
        summary: MapReduceSummary,
        *,
        output: bool,
        cleanup_dir: str | None = None,
    ) -> None:
        self.parts = sorted(parts, key=lambda p: p.partition)
        self.summary = summary
        self.output_files = [p.path for p in self.parts] if output else []
        self._length = sum(p.pairs for p in self.parts)
        if cleanup_dir is not None:  # the job's temporary directory lives as long as we do
            self._finalizer = weakref.finalize(self, shutil.rmtree, cleanup_dir, True)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return itertools.chain.from_iterable(read_part(p) for p in self.parts)

    def __len__(self) -> int:
        return self._length

    def to_dict(self) -> dict[Any, Any]:
        """Every pair in a dict (keys that JSON turned into lists become tuples)."""
        return {(tuple(k) if isinstance(k, list) else k): v for k, v in self}

    def __repr__(self) -> str:
        return f"<MapReduceResult: {self._length} keys in {len(self.parts)} partitions>"
