"""One run of a pipeline: :class:`PipelineIterator`, and what its stages share.

::

    iter(pipeline) ──> PipelineIterator: _Run (tuner, epoch, collate, counters)
                       pipeline._build(run): the steps' stages, each made by its _Step
                       __next__: an element from the last stage; the consumer's stall and
                       CPU share measured (the tuner gives the stages what is left)
                       close(): every thread and process stops; the stats are kept
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paralela.data._parallel import Stage
from paralela.data._stats import PipelineStats, StageStats
from paralela.data._tuner import Tuner

if TYPE_CHECKING:
    from paralela.data._pipeline import Pipeline

__all__ = ["PipelineIterator"]


@dataclass
class _Run:
    """What the stages of one run share.

    ``epoch`` seeds the run's shuffles (with each shuffle's own seed and pass); ``collate``
    makes the batches of ``batch()`` steps that name no collate (``None``: the pipeline's
    :func:`default_collate`; ``TorchIterable`` gives torch's).
    """

    tuner: Tuner
    deterministic: bool
    epoch: int | str = 0
    collate: Callable[[list[Any]], Any] | None = None
    stats: dict[int, StageStats] = field(default_factory=dict)
    passes: dict[int, int] = field(default_factory=dict)
    identities: dict[int, Any] = field(default_factory=dict)  # a cache's, once a run

    def pass_of(self, stats: StageStats) -> int:
        """How many times the stage of ``stats`` was built before in this run (a repeat
        rebuilds the stages above it for each pass)."""
        built = self.passes.get(id(stats), 0)
        self.passes[id(stats)] = built + 1
        return built

    def stage_stats(self, index: int, name: str, kind: str) -> StageStats:
        """The counters of step ``index``, the same across rebuilds (repeat, cache)."""
        if index not in self.stats:
            self.stats[index] = StageStats(name, kind)
        return self.stats[index]


@dataclass(frozen=True)
class _Step:
    name: str
    kind: str
    make: Callable[[_Run, StageStats, Any], Stage]
    rebuilds: bool = False  # gets a function that builds the steps above, not a stage
    # Its output's length from its input's (a source's ignores it); None: not known.
    length: Callable[[int], int] | None = None
    # What decides its output, for a cache's fingerprint: functions, parameters, and a
    # source's SourceId.
    identity: tuple[Any, ...] = ()
    # A cache in memory: its own elements (and those of its parts, by TorchIterable).
    store: dict[Any, Any] | None = None


class PipelineIterator(Iterator[Any]):
    """One run of a pipeline. Closed at the end, on an error, when the loop is left (the
    iterator is collected) or explicitly with :meth:`close` or ``with``."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        epoch: int | str = 0,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        from paralela.backends import usable_cpus

        cpus = pipeline._cpus or usable_cpus()
        self._pipeline = pipeline
        self._run = _Run(Tuner(cpus), pipeline._deterministic, epoch, collate)
        self._closed = True  # until its stages are built: a refused cache builds none
        self._started = time.perf_counter()
        self._ended: float | None = None
        self._stall = 0.0
        self._last_return: float | None = None
        self._last_cpu = 0.0
        self._stage = pipeline._build(self._run)
        self._closed = False

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        now = time.perf_counter()
        if self._last_return is not None:
            wall = now - self._last_return
            if wall > 0:  # the consumer's own CPU share, smoothed
                share = (time.thread_time() - self._last_cpu) / wall
                tuner = self._run.tuner
                tuner.consumer_share = 0.8 * tuner.consumer_share + 0.2 * min(1.0, share)
        try:
            element = next(self._stage)
        except BaseException:
            self.close()
            raise
        self._last_return = time.perf_counter()
        self._last_cpu = time.thread_time()
        self._stall += self._last_return - now
        return element

    def close(self) -> None:
        """Stop every thread and process of the run (idempotent)."""
        if not self._closed:
            self._closed = True
            self._ended = time.perf_counter()
            self._stage.close()
            stats = self._pipeline._last_stats = self.stats()
            if self._pipeline._run_dir is not None:
                stats.save(self._pipeline._run_dir)

    def __enter__(self) -> PipelineIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At the interpreter's exit the threads are daemons and the processes end with
        # their connection: nothing to wait for (and waiting could hang the exit).
        if not getattr(self, "_closed", True) and not sys.is_finalizing():
            self.close()

    def stats(self) -> PipelineStats:
        end = self._ended if self._ended is not None else time.perf_counter()
        stages = [self._run.stats[i] for i in sorted(self._run.stats)]
        return PipelineStats(stages, self._stall, end - self._started, self._run.tuner.cpus)
