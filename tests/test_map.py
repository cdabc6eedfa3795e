"""``paralela.map`` and ``imap`` on real worker processes: order, laziness, chunking,
initializers, shared data, and what the summary reports."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import CountingItems

import paralela
from paralela.mapping import _chunking
from paralela.mapping._engine import IN_FLIGHT_PER_WORKER

WORKERS = 2
WINDOW = WORKERS * IN_FLIGHT_PER_WORKER  # chunks in flight at most
_STATE: dict[str, object] = {}  # per worker process: what the initializer left


def square(x: int) -> int:
    return x * x


def slow_square(x: int) -> int:
    time.sleep(0.002)  # the work
    return x * x


def costlier_first(x: int) -> int:
    time.sleep(0.0005 * max(0, 40 - x))  # early items finish last
    return x * x


def block_on_zero(x: int, gate: str) -> int:
    """Item 0 waits (up to 20 s) until the test lets it finish; the rest are instant."""
    if x == 0:
        deadline = time.monotonic() + 20
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.002)
    return x


def remember_init(log: str, token: str) -> None:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    _STATE["token"] = token


def seen_token(x: int) -> tuple[int, int, object]:
    time.sleep(0.001)
    return x, os.getpid(), _STATE.get("token")


class Counted:
    """Shared data whose every unpickling appends the unpickling process's pid to a file."""

    def __init__(self, log: str, weights: list[int]) -> None:
        self.log = log
        self.weights = weights

    def __reduce__(self) -> tuple[object, ...]:
        return (rebuild_counted, (self.log, self.weights))


def rebuild_counted(log: str, weights: list[int]) -> Counted:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return Counted(log, weights)


def weigh(x: int, shared: Counted) -> int:
    time.sleep(0.001)
    return shared.weights[x % len(shared.weights)] * x


class NoLength:
    """Iterable without ``__len__``: the total is unknown."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(123))


def test_map_returns_the_results_in_order() -> None:
    results = paralela.map(costlier_first, range(60), workers=WORKERS, chunksize=1)
    assert results == [i * i for i in range(60)]
    assert isinstance(results, list)
    assert isinstance(results, paralela.Results)


def test_map_of_nothing() -> None:
    results = paralela.map(square, [], workers=WORKERS)
    assert results == []
    assert results.summary.items == 0
    assert results.summary.chunks == 0


def test_unordered_yields_results_as_they_finish(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    fn = functools.partial(block_on_zero, gate=str(gate))
    got: list[int] = []
    for value in paralela.imap(fn, range(40), workers=WORKERS, chunksize=1, ordered=False):
        got.append(value)
        if len(got) == 10:
            assert 0 not in got  # item 0 is still running: the others did not wait for it
            gate.touch()
    assert sorted(got) == list(range(40))


def test_imap_is_lazy_about_its_input() -> None:
    items = CountingItems(10**7)
    iterator = paralela.imap(square, items, workers=WORKERS)
    assert items.produced == 0  # nothing is read before the first next()
    first = next(iterator)
    assert first == 0
    # Before the first result, at most WINDOW chunks are in flight and WINDOW more wait
    # in the reorder buffer, each of at most MAX_CHUNK_ITEMS. (Not WINDOW chunks grown
    # once: when the first probe's worker is slow to start, the other worker's chunks
    # finish first and the chunker grows on them; seen in 4 runs of 10 under load.)
    assert items.produced <= 2 * WINDOW * _chunking.MAX_CHUNK_ITEMS
    rest = [next(iterator) for _ in range(999)]
    assert rest == [i * i for i in range(1, 1000)]
    iterator.close()
    assert items.produced < 10**7
    assert iterator.summary.wall_seconds > 0  # the summary is finished on close


def test_breaking_out_of_imap_leaves_the_pool_usable() -> None:
    for i, value in enumerate(paralela.imap(slow_square, range(10**6), workers=WORKERS)):
        assert value == i * i
        if i == 20:
            break
    assert paralela.map(square, range(10), workers=WORKERS) == [i * i for i in range(10)]


def test_input_of_unknown_length() -> None:
    results = paralela.map(square, NoLength(), workers=WORKERS)
    assert results == [i * i for i in range(123)]
    assert results.summary.items == 123
    generated = paralela.map(square, (i for i in range(77)), workers=WORKERS)
    assert generated == [i * i for i in range(77)]


def test_explicit_chunksize_makes_equal_chunks() -> None:
    results = paralela.map(square, range(50), workers=WORKERS, chunksize=7)
    assert results == [i * i for i in range(50)]
    timeline = sorted(results.summary.timeline, key=lambda t: t.start)
    assert [(t.start, t.n_items) for t in timeline] == [
        *((s, 7) for s in range(0, 49, 7)),
        (49, 1),
    ]


def test_auto_chunksize_starts_with_single_items_then_grows() -> None:
    results = paralela.map(square, range(5000), workers=WORKERS)
    assert results == [i * i for i in range(5000)]
    timeline = sorted(results.summary.timeline, key=lambda t: t.start)
    sizes = [t.n_items for t in timeline]
    assert sizes[:WORKERS] == [1] * WORKERS  # one probe per worker: nothing measured yet
    assert max(sizes) > 1
    assert len(sizes) < 5000 / 4  # bunched, not one item per task
    ends = [t.start + t.n_items for t in timeline]
    assert [t.start for t in timeline] == [0, *ends[:-1]]
    assert ends[-1] == 5000


def test_initializer_runs_once_per_worker_before_its_items(tmp_path: Path) -> None:
    log = tmp_path / "init"
    token = str(tmp_path)
    results = paralela.map(
        seen_token,
        range(60),
        workers=WORKERS,
        chunksize=2,
        initializer=remember_init,
        initargs=(str(log), token),
    )
    assert [x for x, _, _ in results] == list(range(60))
    assert {t for _, _, t in results} == {token}  # every item saw its worker initialised
    ran_on = {pid for _, pid, _ in results}
    inits = [int(line) for line in log.read_text().split()]
    assert sorted(inits) == sorted(ran_on)  # once per worker, no more
    assert {t.worker for t in results.summary.timeline} == {str(p) for p in ran_on}


def test_initializer_runs_once_per_thread_on_threads(tmp_path: Path) -> None:
    log = tmp_path / "init"
    results = paralela.map(
        seen_token,
        range(40),
        backend="threads",
        workers=WORKERS,
        chunksize=1,
        initializer=remember_init,
        initargs=(str(log), "t"),
    )
    assert [x for x, _, _ in results] == list(range(40))
    threads = {t.worker for t in results.summary.timeline}
    assert len(log.read_text().split()) == len(threads)


def test_shared_is_sent_once_per_worker(tmp_path: Path) -> None:
    log = tmp_path / "unpickled"
    weights = [1, 2, 3]
    results = paralela.map(
        weigh, range(90), workers=WORKERS, chunksize=3, shared=Counted(str(log), weights)
    )
    assert results == [weights[x % 3] * x for x in range(90)]
    summary = results.summary
    assert summary.chunks == 30
    workers = {t.worker for t in summary.timeline}
    unpickled_in = log.read_text().split()
    assert sorted(unpickled_in) == sorted(workers)  # one copy per worker, not per chunk


def test_shared_is_the_same_object_on_threads() -> None:
    shared = {"k": 5}
    results = paralela.map(
        lambda x, s: (x * s["k"], id(s)), range(20), backend="threads", shared=shared
    )
    assert [v for v, _ in results] == [5 * x for x in range(20)]
    assert {i for _, i in results} == {id(shared)}


def test_summary_reports_items_wall_workers_and_timeline() -> None:
    results = paralela.map(slow_square, range(60), workers=WORKERS, chunksize=3)
    assert results == [i * i for i in range(60)]
    s = results.summary
    assert (s.items, s.computed_items, s.resumed_items) == (60, 60, 0)
    assert (s.chunks, s.retries, s.failures) == (20, 0, 0)
    assert s.wall_seconds >= 60 * 0.002 / WORKERS
    pids = {str(p) for p in paralela.get_backend("processes", WORKERS).worker_pids()}

    assert {w.worker for w in s.workers} <= pids
    assert sum(w.items for w in s.workers) == 60
    assert sum(w.chunks for w in s.workers) == 20
    for w in s.workers:
        assert w.host == socket.gethostname()
        assert 0 < w.busy_seconds <= s.wall_seconds * 1.05
        assert w.busy_fraction == pytest.approx(w.busy_seconds / s.wall_seconds)
        assert 0 < w.busy_fraction <= 1.05
    assert 0 < s.busy_fraction <= 1.05

    timeline = sorted(s.timeline, key=lambda t: t.start)
    assert [(t.start, t.n_items) for t in timeline] == [(i, 3) for i in range(0, 60, 3)]
    for t in timeline:
        assert t.started <= t.finished
        assert t.finished - t.started >= 3 * 0.002 * 0.9
        assert t.worker in pids
        assert t.host == socket.gethostname()
        assert t.attempt == 1

    data = json.loads(json.dumps(s.to_dict()))
    expected = dataclasses.asdict(s)
    expected["busy_fraction"] = s.busy_fraction
    assert s.to_dict() == expected  # built directly, the same as asdict's deep copy
    assert data["items"] == 60
    assert len(data["timeline"]) == 20
    assert str(s).startswith("60 items (60 computed, 0 resumed) in ")


def test_summary_fills_in_as_imap_runs() -> None:
    iterator = paralela.imap(square, range(100), workers=WORKERS, chunksize=10)
    assert next(iterator) == 0
    assert 10 <= iterator.summary.items <= 100  # the first chunk was yielded
    assert list(iterator) == [i * i for i in range(1, 100)]
    assert iterator.summary.items == 100
    assert iterator.summary.wall_seconds > 0


def test_sequential_and_threads_give_the_same_results() -> None:
    expected = paralela.map(square, range(300), workers=WORKERS)
    for backend in ("sequential", "threads"):
        assert paralela.map(square, range(300), backend=backend, workers=WORKERS) == expected


def test_sequential_map_runs_in_the_calling_thread() -> None:
    me = threading.get_ident()
    assert set(paralela.map(lambda _: threading.get_ident(), range(5), backend="sequential")) == {
        me
    }


def test_progress_bar_when_asked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from paralela.mapping import _progress

    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.01)  # the bar waits for long runs
    results = paralela.map(slow_square, range(100), backend="sequential", progress=True)
    assert results == [i * i for i in range(100)]
    err = capsys.readouterr().err
    assert "slow_square" in err
    assert "100/100" in err


def test_no_progress_bar_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    paralela.map(square, range(10), backend="sequential")
    assert capsys.readouterr().err == ""


@pytest.fixture
def counted_calls() -> Iterator[Callable[[int], int]]:
    calls: list[int] = []

    def fn(x: int) -> int:
        calls.append(x)
        return x

    yield fn
    assert sorted(calls) == sorted(set(calls)), "an item was computed twice"


def test_no_item_is_computed_twice_without_failures(counted_calls: Callable[[int], int]) -> None:
    assert paralela.map(counted_calls, range(500), backend="threads", workers=WORKERS) == list(
        range(500)
    )
