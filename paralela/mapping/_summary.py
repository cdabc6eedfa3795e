"""What a map run reports about itself: items, wall time, and each worker's busy time."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from paralela.errors import ConfigError

__all__ = ["RECORD_TIMINGS_ENV", "ChunkTiming", "MapSummary", "Results", "WorkerStats"]

R = TypeVar("R")

# Set to 0/false/no/off to keep a map from recording each chunk's ChunkTiming (the
# timeline and the per-worker stats stay empty); read once per map call. The cost of
# recording is measured by bench/bench_scaling.py (bench/results/scaling.md).
RECORD_TIMINGS_ENV = "PARALELA_RECORD_TIMINGS"


def record_timings() -> bool:
    """Whether a map records its chunks' timings: ``$PARALELA_RECORD_TIMINGS``, default on.

    Raises:
        ConfigError: the variable holds something other than a yes or a no.
    """
    raw = os.environ.get(RECORD_TIMINGS_ENV, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(
        f"Environment variable {RECORD_TIMINGS_ENV}={raw!r} is not valid; use 1 (record "
        "each chunk's timing, the default) or 0 (do not), or unset it."
    )


@dataclass(frozen=True)
class ChunkTiming:
    """One chunk: its items ``[start, start + n_items)``, when and where it ran."""

    start: int
    n_items: int
    started: float
    finished: float
    worker: str
    host: str
    attempt: int = 1


@dataclass(frozen=True)
class WorkerStats:
    worker: str
    host: str
    chunks: int
    items: int
    busy_seconds: float
    busy_fraction: float


@dataclass
class MapSummary:
    """Filled in as a run goes; complete when the results are.

    Attributes:
        items: items in the result (computed now plus loaded from the run directory).
        computed_items: items computed in this call.
        resumed_items: items loaded from the run directory.
        chunks: chunks computed in this call.
        retries: chunks run again after their worker died.
        failures: items whose function raised.
        wall_seconds: from the first submission to the last result.
        workers: busy time and share of the wall time per worker.
        timeline: every chunk computed in this call (for timelines and Amdahl fits).
            Empty, as is ``workers``, when ``PARALELA_RECORD_TIMINGS=0``.
    """

    items: int = 0
    computed_items: int = 0
    resumed_items: int = 0
    chunks: int = 0
    retries: int = 0
    failures: int = 0
    wall_seconds: float = 0.0
    workers: list[WorkerStats] = field(default_factory=list)
    timeline: list[ChunkTiming] = field(default_factory=list)

    @property
    def busy_fraction(self) -> float:
        """Mean share of the wall time the workers spent in the user's function."""
        if not self.workers:
            return 0.0
        return sum(w.busy_fraction for w in self.workers) / len(self.workers)

    def finish(self, wall_seconds: float) -> None:
        self.wall_seconds = wall_seconds
        per: dict[str, list[ChunkTiming]] = {}
        for t in self.timeline:
            per.setdefault(t.worker, []).append(t)
        self.workers = [
            WorkerStats(
                worker=name,
                host=ts[0].host,
                chunks=len(ts),
                items=sum(t.n_items for t in ts),
                busy_seconds=(busy := sum(t.finished - t.started for t in ts)),
                busy_fraction=busy / wall_seconds if wall_seconds > 0 else 0.0,
            )
            for name, ts in sorted(per.items())
        ]

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain data (what ``dataclasses.asdict`` gives, built directly:
        a timeline's chunks are flat records, and asdict deep-copies each field)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["workers"] = [dict(vars(w)) for w in self.workers]
        data["timeline"] = [dict(vars(t)) for t in self.timeline]
        data["busy_fraction"] = self.busy_fraction
        return data

    def __str__(self) -> str:
        rate = self.computed_items / self.wall_seconds if self.wall_seconds else 0.0
        return (
            f"{self.items} items ({self.computed_items} computed, {self.resumed_items} "
            f"resumed) in {self.wall_seconds:.3f} s, {rate:,.0f} items/s; "
            f"{len(self.workers)} workers {self.busy_fraction:.0%} busy; "
            f"{self.chunks} chunks, {self.retries} retried, {self.failures} failed"
        )


class Results(list[R], Generic[R]):
    """The list :func:`paralela.map` returns, with the run's :class:`MapSummary`."""

    summary: MapSummary

    def __init__(self, values: Iterable[R], summary: MapSummary) -> None:
        super().__init__(values)
        self.summary = summary
