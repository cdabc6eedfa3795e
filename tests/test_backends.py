"""The backend contract, run against every backend: sequential, threads, processes."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, as_completed, wait
from pathlib import Path

import pytest

import paralela
from paralela.backends import (
    _FACTORIES,
    Backend,
    Broadcast,
    ProcessBackend,
    RemoteTraceback,
    SequentialBackend,
    ThreadBackend,
    available_backends,
    discard_backend,
    get_backend,
    make_backend,
    register_backend,
)
from paralela.errors import ConfigError

MAKERS: dict[str, Callable[[], Backend]] = {
    "sequential": lambda: SequentialBackend(),
    "threads": lambda: ThreadBackend(2),
    "processes": lambda: ProcessBackend(2),
}
# name -> (isolated, needs_pickling, retries_dead_workers, debuggable)
EXPECTED_FLAGS = {
    "sequential": (False, False, False, True),
    "threads": (False, False, False, False),
    "processes": (True, True, True, False),
}


def square(x: int) -> int:
    return x * x


def add(a: int, b: int = 0, *, c: int = 0) -> int:
    return a + b + c


def fail(message: str) -> None:
    raise LookupError(message)


def where() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def length(value: object, extra: int) -> int:
    return len(value) + extra  # type: ignore[arg-type]


def wait_for_file(path: str, timeout: float = 20.0) -> bool:
    """The workload of a task that blocks until the test lets it go."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


@pytest.fixture(params=sorted(MAKERS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = MAKERS[request.param]()
    try:
        yield b
    finally:
        b.shutdown(wait=True, cancel_futures=True)


def test_submit_returns_a_future_with_the_result(backend: Backend) -> None:
    future = backend.submit(add, 1, 2, c=3)
    assert isinstance(future, Future)
    assert future.result(timeout=30) == 6


def test_futures_work_with_wait_and_as_completed(backend: Backend) -> None:
    futures = {backend.submit(square, i): i for i in range(40)}
    done, not_done = wait(futures, timeout=30)
    assert not not_done
    assert {f.result() for f in done} == {i * i for i in range(40)}
    assert sorted(f.result() for f in as_completed(futures, timeout=30)) == sorted(
        i * i for i in range(40)
    )


def test_an_exception_in_the_task_fails_its_future_only(backend: Backend) -> None:
    bad = backend.submit(fail, "no such key")
    good = backend.submit(square, 7)
    wait([bad, good], timeout=30, return_when=FIRST_EXCEPTION)
    exc = bad.exception(timeout=30)
    assert isinstance(exc, LookupError)
    assert str(exc) == "no such key"
    with pytest.raises(LookupError, match="no such key"):
        bad.result()
    assert good.result(timeout=30) == 49


def test_broadcast_arguments_arrive_unwrapped(backend: Backend) -> None:
    shared = Broadcast(list(range(1000)))
    futures = [backend.submit(length, shared, i) for i in range(10)]
    assert [f.result(timeout=30) for f in futures] == [1000 + i for i in range(10)]


def test_effective_workers(backend: Backend) -> None:
    expected = 1 if backend.capabilities.name == "sequential" else 2
    assert backend.effective_workers() == expected


def test_capabilities_are_declared_as_data(backend: Backend) -> None:
    caps = backend.capabilities
    assert caps.name in available_backends()
    assert (
        caps.isolated,
        caps.needs_pickling,
        caps.retries_dead_workers,
        caps.debuggable,
    ) == EXPECTED_FLAGS[caps.name]
    # Local backends start tasks cheaply: a map sends them as many chunks as it likes.
    assert not caps.packs_tasks
    assert backend.max_tasks() is None


def test_tasks_run_where_the_capabilities_say(backend: Backend) -> None:
    pids_threads = {backend.submit(where).result(timeout=30) for _ in range(4)}
    pids = {pid for pid, _ in pids_threads}
    threads = {tid for _, tid in pids_threads}
    if backend.capabilities.isolated:
        assert os.getpid() not in pids
    else:
        assert pids == {os.getpid()}
    if backend.capabilities.debuggable:  # pdb works: the caller's own thread
        assert threads == {threading.get_ident()}
    else:
        assert threading.get_ident() not in threads


def test_submit_after_shutdown_is_refused(backend: Backend) -> None:
    backend.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        backend.submit(square, 2)


def test_context_manager_shuts_down(backend: Backend) -> None:
    with backend as b:
        assert b.submit(square, 3).result(timeout=30) == 9
    with pytest.raises(RuntimeError):
        backend.submit(square, 2)


def test_map_over_the_backend_gives_ordered_results(backend: Backend) -> None:
    results = paralela.map(square, range(200), backend=backend, chunksize=7)
    assert results == [i * i for i in range(200)]
    assert results.summary.items == 200
    covered = sorted((t.start, t.start + t.n_items) for t in results.summary.timeline)
    assert [a for a, _ in covered] == [0, *(b for _, b in covered[:-1])]
    assert covered[-1][1] == 200


@pytest.mark.parametrize("name", ["threads", "processes"])
def test_shutdown_with_cancel_futures_cancels_what_has_not_started(
    name: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    backend = MAKERS[name]()
    gate = tmp_path / "go"
    try:
        futures = [backend.submit(wait_for_file, str(gate)) for _ in range(12)]
        poll(lambda: sum(f.running() for f in futures) >= 2, what="two tasks to start")
        backend.shutdown(wait=False, cancel_futures=True)
        cancelled = [f for f in futures if f.cancelled()]
        ran = [f for f in futures if not f.cancelled()]
        gate.touch()
        assert cancelled, "tasks that had not started should be cancelled"
        assert futures[-1].cancelled()
        assert ran, "tasks already running finish"
        assert all(f.result(timeout=30) is True for f in ran)
    finally:
        gate.touch()
        backend.shutdown(wait=True)


# -- the registry ------------------------------------------------------------------


def test_available_backends() -> None:
    assert {"processes", "threads", "sequential"} <= set(available_backends())


@pytest.mark.parametrize("name", ["sequential", "threads", "processes"])
def test_get_backend_shares_one_instance_per_name_and_workers(name: str) -> None:
    first = get_backend(name, 2)
    assert get_backend(name, 2) is first
    assert first.capabilities.name == name


def test_get_backend_passes_an_instance_through() -> None:
    mine = SequentialBackend()
    assert get_backend(mine) is mine


def test_unknown_backend_lists_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"Unknown backend 'dask'; valid backends are: .*processes.*threads"
    ):
        get_backend("dask")


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2"])
def test_bad_worker_count_is_refused(workers: object) -> None:
    with pytest.raises(ConfigError, match="workers must be a positive integer"):
        get_backend("threads", workers)  # type: ignore[arg-type]


def test_a_registered_backend_serves_map(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int | None] = []

    def factory(workers: int | None) -> Backend:
        made.append(workers)
        return SequentialBackend(workers)

    monkeypatch.setitem(_FACTORIES, "mine", factory)
    register_backend("mine", factory)
    assert "mine" in available_backends()
    try:
        assert paralela.map(square, range(5), backend="mine") == [0, 1, 4, 9, 16]
        assert made == [None]
    finally:
        discard_backend(get_backend("mine"))


def test_a_broken_shared_backend_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    class Breakable(SequentialBackend):
        broken = False

        def healthy(self) -> bool:
            return not self.broken

    made: list[Breakable] = []

    def factory(workers: int | None) -> Backend:
        made.append(Breakable(workers))
        return made[-1]

    monkeypatch.setitem(_FACTORIES, "breakable", factory)
    try:
        first = get_backend("breakable")
        assert get_backend("breakable") is first  # healthy: shared
        made[0].broken = True
        second = get_backend("breakable")
        assert second is not first
        assert len(made) == 2
        assert paralela.map(square, range(3), backend="breakable") == [0, 1, 4]
    finally:
        discard_backend(get_backend("breakable"))


def test_make_backend_returns_a_fresh_backend_the_caller_owns() -> None:
    first, second = make_backend("threads", 2), make_backend("threads", 2)
    try:
        assert first is not second
        assert first is not get_backend("threads", 2)
        assert first.submit(os.getpid).result(timeout=30) == os.getpid()
    finally:
        first.shutdown()
        second.shutdown()


def test_the_public_seam_resolves_every_name() -> None:
    import paralela.backends as backends

    for name in backends.__all__:
        assert getattr(backends, name, None) is not None, name
    assert set(backends.__all__) <= set(dir(backends))


def test_importing_backends_loads_no_backend_module() -> None:
    code = (
        "import json, sys, paralela.backends; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('paralela'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(out.stdout))
    assert loaded <= {"paralela", "paralela._version", "paralela.errors", "paralela.backends",
                      "paralela.backends._base"}  # fmt: skip


def test_remote_traceback_is_named_by_its_public_home() -> None:
    cause = RemoteTraceback("Traceback (most recent call last): ...")
    assert f"{type(cause).__module__}.{type(cause).__qualname__}" == (
        "paralela.backends.RemoteTraceback"
    )
    again = pickle.loads(pickle.dumps(cause))
    assert isinstance(again, RemoteTraceback)
    assert again.tb == cause.tb
