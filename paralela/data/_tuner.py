"""``workers="auto"``: each parallel stage's concurrency, tuned while the pipeline runs,
within the CPUs of the allocation.

::

    every INTERVAL seconds, per auto stage:
      the stage below waited on it > WAIT_SHARE of the time, and a worker more fits the
        budget ──> grow (by half its workers, at least 1)
      nobody waited and its finished elements pile up (ready >= workers) for IDLE_TICKS
        intervals ──> shrink by 1
    budget: sum over stages of workers x (CPU a worker uses while busy, measured)
            + the consumer's own CPU share  <=  usable CPUs (affinity, cgroup quota),
            to the nearest worker (a share of 0.95 CPU left takes a 1.0 worker)

A stage of I/O (threads that wait on files or the network) measures a small CPU share, so
it may run many workers; a stage of pure-Python decoding measures ~1.0 and gets at most
the CPUs the consumer leaves. The numbers are those that settled fastest without
overshoot on ``bench/bench_data.py``'s pipeline (5 ms reads, 2 ms decodes, 2 CPUs).
"""

from __future__ import annotations

import time

from paralela.data._stats import StageStats

__all__ = ["Tuner"]

INTERVAL = 0.05  # seconds between decisions: a few batches of a fast consumer
WAIT_SHARE = 0.02  # the stage below waited more than this share of an interval: grow
IDLE_TICKS = 20  # intervals with nobody waiting and a full queue before shrinking


class _Tuned:
    __slots__ = ("idle", "last_time", "last_wait", "maximum", "stats")

    def __init__(self, stats: StageStats, maximum: int) -> None:
        self.stats = stats
        self.maximum = maximum
        self.last_time = time.perf_counter()
        self.last_wait = 0.0
        self.idle = 0


class Tuner:
    """Shared by the stages of one pipeline run.

    Args:
        cpus: the CPU budget (usable CPUs of this process: its affinity, cgroup quota).
    """

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.consumer_share = 0.0  # measured by the pipeline's iterator
        self._stages: list[_Tuned] = []

    def register(self, stats: StageStats, maximum: int) -> _Tuned:
        """Tune ``stats``'s stage (again, when a repeat rebuilds it: the same entry)."""
        for tuned in self._stages:
            if tuned.stats is stats:
                return tuned
        tuned = _Tuned(stats, maximum)
        self._stages.append(tuned)
        return tuned

    def used(self) -> float:
        """CPUs the workers of every tuned stage use, by their measured shares."""
        return sum(t.stats.workers * min(1.0, t.stats.cpu_share) for t in self._stages)

    def tick(self, tuned: _Tuned, ready: int) -> int:
        """The stage's workers from now on (called by the stage as it hands elements
        downstream; decides at most once per ``INTERVAL``)."""
        stats = tuned.stats
        now = time.perf_counter()
        elapsed = now - tuned.last_time
        if elapsed < INTERVAL:
            return stats.workers
        waited = (stats.wait_seconds - tuned.last_wait) / elapsed
        tuned.last_time, tuned.last_wait = now, stats.wait_seconds
        workers = stats.workers
        if waited > WAIT_SHARE and workers < tuned.maximum:
            tuned.idle = 0
            share = min(1.0, stats.cpu_share)
            room = self.cpus - self.consumer_share - self.used()
            grow = min(max(1, workers // 2), tuned.maximum - workers)
            if share > 0:  # to the nearest worker: 0.95 of a CPU left fits one more
                grow = min(grow, int(room / share + 0.5))
            if grow > 0:
                stats.set_workers(workers + grow)
        elif waited == 0 and ready >= workers and workers > 1:
            tuned.idle += 1
            if tuned.idle >= IDLE_TICKS:
                tuned.idle = 0
                stats.set_workers(workers - 1)
        else:
            tuned.idle = 0
        return stats.workers
