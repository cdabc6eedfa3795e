"""What a pipeline measured: per stage, and which stage held the consumer up.

::

    StageStats   name, elements out, seconds busy, seconds the stage below waited on it,
                 workers (now, and the most it ran), CPU share of a worker, queue occupancy
    PipelineStats  the stages in order, the consumer's stall and wall time;
                   str() is a table naming the bottleneck
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PipelineStats", "StageStats"]


@dataclass
class StageStats:
    """One stage's counters (updated while the pipeline runs).

    Attributes:
        name: ``map(decode)``, ``batch(32)``...
        kind: ``"thread"``, ``"process"`` or ``"inline"`` (runs in the consumer's thread).
        elements: elements the stage gave downstream.
        wait_seconds: time the stage below (or the consumer) waited on this stage's own
            workers: how much this stage held the pipeline up.
        workers: workers the stage runs now (its concurrency; 1 for inline stages).
        max_workers: the most workers it ran.
        cpu_seconds: CPU time its workers used (threads' own, processes' own).
        busy_seconds: wall time its workers spent in the user's function.
        queue: elements done and waiting to be taken, at the last look.
        capacity: the most elements it holds at once (in flight plus ready).
    """

    name: str
    kind: str
    elements: int = 0
    wait_seconds: float = 0.0
    workers: int = 1
    max_workers: int = 1
    cpu_seconds: float = 0.0
    busy_seconds: float = 0.0
    queue: int = 0
    capacity: int = 0
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, workers)
    relay: bool = False  # a prefetch: its waits are those of the stage above it

    @property
    def cpu_share(self) -> float:
        """CPU a worker uses while busy (1.0: a whole CPU; ~0 for I/O waits)."""
        return self.cpu_seconds / self.busy_seconds if self.busy_seconds > 0 else 1.0

    def set_workers(self, n: int) -> None:
        self.workers = n
        self.max_workers = max(self.max_workers, n)
        self.history.append((time.perf_counter(), n))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "elements": self.elements,
            "wait_seconds": self.wait_seconds,
            "workers": self.workers,
            "max_workers": self.max_workers,
            "cpu_seconds": self.cpu_seconds,
            "busy_seconds": self.busy_seconds,
            "cpu_share": self.cpu_share,
            # (seconds from the stage's start, workers from then on)
            "history": [[round(t - self.history[0][0], 3), n] for t, n in self.history],
        }


@dataclass
class PipelineStats:
    """A pipeline run: its stages (source first), the consumer's stall and the wall time.

    Attributes:
        stages: per stage counters.
        stall_seconds: time the consumer's ``for`` loop waited for the next element.
        wall_seconds: from the first ``next`` to now (or to the end).
        cpus: the CPU budget the tuner kept within.
    """

    stages: list[StageStats]
    stall_seconds: float
    wall_seconds: float
    cpus: int

    @property
    def consumer_busy(self) -> float:
        """The share of the wall time the consumer spent on its own work."""
        if self.wall_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.stall_seconds / self.wall_seconds)

    @property
    def bottleneck(self) -> StageStats | None:
        """The stage the pipeline waited on most, or None when nothing waited."""
        waited = [s for s in self.stages if s.wait_seconds > 0]
        own = [s for s in waited if not s.relay] or waited  # a prefetch only passes it on
        return max(own, key=lambda s: s.wait_seconds) if own else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [s.to_dict() for s in self.stages],
            "stall_seconds": self.stall_seconds,
            "wall_seconds": self.wall_seconds,
            "consumer_busy": self.consumer_busy,
            "cpus": self.cpus,
            "bottleneck": self.bottleneck.name if self.bottleneck else None,
        }

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``pipeline.json`` into ``directory`` (made if needed), for
        ``paralela report``; returns its path."""
        from paralela._files import atomic_write, make_dirs

        folder = Path(directory)
        make_dirs(folder)
        path = folder / "pipeline.json"
        body = {"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **self.to_dict()}
        atomic_write(path, json.dumps(body, indent=1).encode())
        return path

    def __str__(self) -> str:
        rows = [("stage", "kind", "elements", "elem/s", "workers", "cpu/worker", "waited s")]
        for s in self.stages:
            rate = s.elements / self.wall_seconds if self.wall_seconds > 0 else 0.0
            workers = (
                str(s.workers)
                if s.workers == s.max_workers
                else f"{s.workers} (max {s.max_workers})"
            )
            rows.append(
                (
                    s.name,
                    s.kind,
                    str(s.elements),
                    f"{rate:,.0f}",
                    workers,
                    f"{s.cpu_share:.2f}" if s.busy_seconds else "-",
                    f"{s.wait_seconds:.2f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        bottleneck = self.bottleneck
        lines.append(
            f"consumer busy {self.consumer_busy:.0%} of {self.wall_seconds:.2f} s "
            f"(waited {self.stall_seconds:.2f} s); CPU budget {self.cpus}; "
            + (f"bottleneck: {bottleneck.name}" if bottleneck else "no stage held it up")
        )
        return "\n".join(lines)
