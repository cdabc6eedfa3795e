"""What users of Pool, ProcessPoolExecutor and joblib rely on: ordered results up to a
failure, the parent's ``sys.argv`` in workers, nested maps that neither deadlock nor
oversubscribe, results that cannot travel named by item, and bounded idle pools."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from helpers import children_running

import paralela
from paralela.backends import ProcessBackend, worker_share
from paralela.errors import ConfigError, MapError, TaskError

BACKENDS = ["sequential", "threads", "processes"]


def drain(iterator: Iterator[int], into: list[int]) -> None:
    for value in iterator:
        into.append(value)


def fail_at_5_after_slow_start(x: int) -> int:
    if x == 5:
        raise ValueError("five")
    if x < 3:
        time.sleep(0.3)  # the failure comes back before the items before it
    return x * 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_ordered_imap_yields_every_result_before_the_failing_item(backend: str) -> None:
    got: list[int] = []
    iterator = paralela.imap(
        fail_at_5_after_slow_start, range(40), backend=backend, workers=2, chunksize=1
    )
    with pytest.raises(ValueError, match="five"):
        drain(iterator, got)
    assert got == [0, 10, 20, 30, 40]


def test_ordered_imap_keeps_the_results_of_the_failing_chunk_before_its_failure() -> None:
    got: list[int] = []
    iterator = paralela.imap(fail_at_5_after_slow_start, range(12), workers=2, chunksize=4)
    with pytest.raises(ValueError, match="five"):
        drain(iterator, got)
    assert got == [0, 10, 20, 30, 40]


def times_two(x: int) -> int:
    return x * 2


def breaks_after_seven() -> Iterator[int]:
    yield from range(7)
    raise OSError("the input went away")


@pytest.mark.parametrize("backend", BACKENDS)
def test_imap_yields_what_a_failing_generator_produced_then_raises(backend: str) -> None:
    got: list[int] = []
    iterator = paralela.imap(
        times_two, breaks_after_seven(), backend=backend, workers=2, chunksize=2
    )
    with pytest.raises(OSError, match="the input went away"):
        drain(iterator, got)
    assert got == [0, 2, 4, 6, 8, 10, 12]


def test_close_stops_yielding_at_once() -> None:
    iterator = paralela.imap(times_two, range(1000), workers=2, chunksize=100)
    assert next(iterator) == 0
    iterator.close()
    assert list(iterator) == []


def worker_argv(_: int) -> list[str]:
    return list(sys.argv)


def test_workers_see_the_parents_sys_argv(process_backend: ProcessBackend) -> None:
    got = paralela.map(worker_argv, range(2), backend=process_backend, chunksize=1)
    assert got == [sys.argv, sys.argv]


def inner_pids(n: int) -> list[int]:
    return paralela.map(_pid, range(n))


def inner_pids_on_processes(n: int) -> tuple[int, list[int]]:
    return worker_share() or 0, paralela.map(_pid, range(n), backend="processes", workers=8)


def _pid(_: int) -> int:
    time.sleep(0.01)
    return os.getpid()


def inner_threads(n: int) -> int:
    return sum(paralela.map(times_two, range(n), backend="threads", workers=2))


@pytest.mark.timeout(60)
def test_threads_inside_threads_do_not_deadlock() -> None:
    got = paralela.map(inner_threads, [10] * 6, backend="threads", workers=2, chunksize=1)
    assert got == [90] * 6


def test_a_map_inside_a_worker_runs_sequentially_by_default() -> None:
    got = paralela.map(inner_pids, [5, 5], workers=2, chunksize=1)
    for pids in got:
        assert len(set(pids)) == 1  # all in the worker's own process
    assert os.getpid() not in {p for pids in got for p in pids}


def test_a_pool_asked_for_inside_a_worker_stays_within_its_share() -> None:
    got = paralela.map(inner_pids_on_processes, [6, 6], workers=2, chunksize=1)
    for share, pids in got:
        assert share >= 1
        assert len(set(pids)) <= share  # never 8 processes per worker


def returns_a_lock_on_3(x: int) -> object:
    return threading.Lock() if x == 3 else x


def test_a_result_that_cannot_be_pickled_is_the_failure_of_its_item() -> None:
    with pytest.raises(MapError) as info:
        paralela.map(returns_a_lock_on_3, range(6), workers=2, chunksize=6, on_error="collect")
    (failure,) = info.value.failures
    assert failure.index == 3
    assert "the result of item 3" in str(failure)
    assert "initializer" not in str(failure)
    assert info.value.results == [0, 1, 2, None, 4, 5]


def test_a_result_that_cannot_be_pickled_stops_the_map_naming_the_item() -> None:
    with pytest.raises(TaskError, match="the result of item 3") as info:
        paralela.map(returns_a_lock_on_3, range(6), workers=2, chunksize=6)
    assert info.value.index == 3


def _only_in_a_worker() -> str:
    if worker_share() is None:
        raise RuntimeError("this result cannot be rebuilt outside a worker")
    return "rebuilt"


class OnlyInAWorker:
    def __reduce__(self) -> tuple[object, ...]:
        return (_only_in_a_worker, ())


def returns_unrebuildable_on_4(x: int) -> object:
    return OnlyInAWorker() if x == 4 else x


def test_a_result_that_cannot_be_rebuilt_in_the_driver_is_named_by_item() -> None:
    with pytest.raises(MapError) as info:
        paralela.map(
            returns_unrebuildable_on_4, range(8), workers=2, chunksize=8, on_error="collect"
        )
    (failure,) = info.value.failures
    assert failure.index == 4
    assert "The result of item 4" in str(failure)
    assert "cannot be rebuilt outside a worker" in str(failure)
    assert info.value.results == [0, 1, 2, 3, None, 5, 6, 7]
    # The pool survived it (no dead manager thread): the next map runs.
    assert paralela.map(times_two, range(4), workers=2) == [0, 2, 4, 6]


def idle_workers() -> list[psutil.Process]:
    return children_running("paralela.backends._worker")


def test_maps_with_many_worker_counts_leave_at_most_the_cpus_worth_of_idle_workers() -> None:
    cpus = len(os.sched_getaffinity(0))
    for n in range(1, 9):
        assert paralela.map(times_two, range(20), workers=n) == [x * 2 for x in range(20)]
    deadline = time.monotonic() + 10
    while len(idle_workers()) > cpus and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(idle_workers()) <= cpus


def test_workers_true_is_refused() -> None:
    with pytest.raises(ConfigError, match="workers must be a positive integer"):
        paralela.map(times_two, range(3), workers=True)
