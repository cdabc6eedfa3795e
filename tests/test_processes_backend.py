"""The processes backend with real worker processes: deaths, broadcasts, zero-copy buffers,
remote tracebacks, and what cannot be sent."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy
import psutil
import pytest

from paralela.backends import Broadcast, ProcessBackend, RemoteTraceback
from paralela.errors import ParalelaError, UnpicklableError, WorkerDiedError

MIB = 2**20


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)


def pid_after(seconds: float) -> int:
    time.sleep(seconds)  # the task's work, not a wait
    return os.getpid()


def array_facts(a: numpy.ndarray) -> tuple[bool, float, tuple[int, ...], str]:
    return bool(a.flags.writeable), float(a.sum()), a.shape, str(a.dtype)


def write_into(a: numpy.ndarray) -> None:
    a[0] = 1


def double(a: numpy.ndarray) -> numpy.ndarray:
    return a * 2


def raise_value_error(x: int) -> None:
    raise ValueError(f"bad input {x}")


def raise_unpicklable_exception() -> None:
    raise ValueError(threading.Lock())


def return_a_lock() -> object:
    return threading.Lock()


def getenv(name: str) -> str | None:
    return os.environ.get(name)


class Counted:
    """A value whose every unpickling appends the unpickling process's pid to a file."""

    def __init__(self, log: str, data: list[int]) -> None:
        self.log = log
        self.data = data

    def __reduce__(self) -> tuple[object, ...]:
        return (rebuild_counted, (self.log, self.data))


def rebuild_counted(log: str, data: list[int]) -> Counted:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return Counted(log, data)


def use_counted(value: Counted, i: int) -> tuple[int, int]:
    time.sleep(0.002)  # spread the tasks over both workers
    return os.getpid(), sum(value.data) + i


def unpickled_by(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_worker_pids_are_live_children(
    process_backend: ProcessBackend, poll: Callable[..., None]
) -> None:
    poll(lambda: len(process_backend.worker_pids()) == 2, what="two workers")
    me = psutil.Process()
    children = {p.pid for p in me.children()}
    assert set(process_backend.worker_pids()) <= children


def test_the_workers_are_spawned_when_the_constructor_returns() -> None:
    """The constructor waits for the manager's spawns, so that a caller importing
    modules meanwhile does not hold them back for the GIL (a cold map's start)."""
    backend = ProcessBackend(2)
    try:
        assert len(backend.worker_pids()) == 2  # at once: no polling
    finally:
        backend.shutdown()


@pytest.mark.parametrize(
    ("how", "exitcode", "words"),
    [("kill", -signal.SIGKILL, "killed by SIGKILL"), ("exit", 3, "exit code 3")],
)
def test_a_dead_worker_fails_its_task_with_worker_died_error(
    process_backend: ProcessBackend, how: str, exitcode: int, words: str
) -> None:
    future = process_backend.submit(die, how)
    with pytest.raises(WorkerDiedError, match=words) as info:
        future.result(timeout=30)
    assert info.value.exitcode == exitcode
    assert info.value.pid is not None
    assert f"pid {info.value.pid}" in str(info.value)
    # the pool replaced the worker and goes on
    assert process_backend.submit(abs, -5).result(timeout=30) == 5


def test_tasks_queued_behind_a_dying_task_run_elsewhere(poll: Callable[..., None]) -> None:
    backend = ProcessBackend(1)
    try:
        poll(lambda: len(backend.worker_pids()) == 1, what="the worker")
        (first_pid,) = backend.worker_pids()
        doomed = backend.submit(die, "kill")
        queued = [backend.submit(pid_after, 0.0) for _ in range(4)]
        with pytest.raises(WorkerDiedError):
            doomed.result(timeout=30)
        pids = {f.result(timeout=30) for f in queued}
        assert first_pid not in pids  # they ran on the replacement worker
        assert len(pids) == 1
        poll(lambda: len(backend.worker_pids()) == 1, what="the replacement")
        assert backend.worker_pids() != [first_pid]
    finally:
        backend.shutdown(wait=True)


def test_a_worker_killed_from_outside_fails_only_its_running_task(
    process_backend: ProcessBackend, poll: Callable[..., None]
) -> None:
    poll(lambda: len(process_backend.worker_pids()) == 2, what="two workers")
    futures = [process_backend.submit(pid_after, 0.3) for _ in range(6)]
    poll(lambda: sum(f.running() for f in futures) == 4, what="four tasks dispatched")
    victim = process_backend.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    died = [f for f in futures if isinstance(f.exception(timeout=30), WorkerDiedError)]
    assert len(died) == 1  # the running one; the one queued behind it was re-run
    assert died[0].exception().exitcode == -signal.SIGKILL  # type: ignore[union-attr]
    survivors = [f.result(timeout=30) for f in futures if f not in died]
    assert len(survivors) == 5


def test_shutdown_stops_every_worker(poll: Callable[..., None]) -> None:
    backend = ProcessBackend(2)
    poll(lambda: len(backend.worker_pids()) == 2, what="two workers")
    procs = [psutil.Process(pid) for pid in backend.worker_pids()]
    backend.shutdown(wait=True)
    for proc in procs:
        assert not proc.is_running()
    assert backend.worker_pids() == []
    backend.shutdown(wait=True)  # a second shutdown is harmless


def test_broadcast_is_sent_once_per_worker(process_backend: ProcessBackend, tmp_path: Path) -> None:
    log = tmp_path / "unpickled"
    shared = Broadcast(Counted(str(log), list(range(100))))
    futures = [process_backend.submit(use_counted, shared, i) for i in range(30)]
    results = [f.result(timeout=30) for f in futures]
    assert [value for _, value in results] == [4950 + i for i in range(30)]
    ran_on = {pid for pid, _ in results}
    assert sorted(unpickled_by(log)) == sorted(ran_on)  # once per worker that used it

    process_backend.forget(shared)  # workers drop it; a later task brings it again
    again = [process_backend.submit(use_counted, shared, 0) for _ in range(4)]
    again_on = {f.result(timeout=30)[0] for f in again}
    assert sorted(unpickled_by(log)) == sorted([*ran_on, *again_on])


def test_unpicklable_broadcast_is_refused_at_submit(process_backend: ProcessBackend) -> None:
    with pytest.raises(UnpicklableError, match="Cannot send the shared object"):
        process_backend.submit(len, Broadcast(threading.Lock()))


def test_big_arrays_arrive_read_only_and_correct(process_backend: ProcessBackend) -> None:
    if not process_backend.capabilities.zero_copy_buffers:
        pytest.skip("no memfd on this platform")
    arrays = [numpy.full(MIB // 8, float(i), dtype=numpy.float64) for i in range(12)]
    futures = [process_backend.submit(array_facts, a) for a in arrays]
    for i, future in enumerate(futures):
        writeable, total, shape, dtype = future.result(timeout=30)
        assert writeable is False  # a view of shared memory, not a private copy
        assert total == float(i) * (MIB // 8)
        assert (shape, dtype) == ((MIB // 8,), "float64")


def test_big_arrays_of_every_layout_arrive_intact(process_backend: ProcessBackend) -> None:
    rng = numpy.random.default_rng(0)
    cases = [
        rng.random((256, 512)),  # 1 MiB, two dimensions
        rng.integers(0, 255, size=3 * MIB, dtype=numpy.uint8),  # odd length
        numpy.asfortranarray(rng.random((512, 256))),  # Fortran order
        rng.random((1024, 512))[:, ::2],  # not contiguous: pickled in-band
    ]
    for a in cases:
        assert numpy.array_equal(process_backend.submit(double, a).result(timeout=30), a * 2)


def test_small_arrays_are_private_copies(process_backend: ProcessBackend) -> None:
    writeable, total, _, _ = process_backend.submit(array_facts, numpy.arange(10.0)).result(
        timeout=30
    )
    assert writeable is True
    assert total == 45.0


def test_writing_into_a_shared_array_fails_in_the_worker(process_backend: ProcessBackend) -> None:
    if not process_backend.capabilities.zero_copy_buffers:
        pytest.skip("no memfd on this platform")
    big = numpy.zeros(MIB, dtype=numpy.uint8)
    with pytest.raises(ValueError, match="read-only"):
        process_backend.submit(write_into, big).result(timeout=30)
    assert big[0] == 0


def test_remote_traceback_is_the_cause(process_backend: ProcessBackend) -> None:
    with pytest.raises(ValueError, match="bad input 7") as info:
        process_backend.submit(raise_value_error, 7).result(timeout=30)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "Traceback (most recent call last)" in cause.tb
    assert "raise_value_error" in cause.tb
    assert "ValueError: bad input 7" in cause.tb


def test_an_exception_that_cannot_travel_comes_back_as_text(
    process_backend: ProcessBackend,
) -> None:
    with pytest.raises(ParalelaError, match=r"builtins\.ValueError: <unlocked _thread\.lock"):
        process_backend.submit(raise_unpicklable_exception).result(timeout=30)


def test_a_result_that_cannot_travel_is_an_error_not_a_hang(
    process_backend: ProcessBackend,
) -> None:
    with pytest.raises(TypeError, match="pickle") as info:
        process_backend.submit(return_a_lock).result(timeout=30)
    assert isinstance(info.value.__cause__, RemoteTraceback)


def test_unpicklable_function_is_refused_at_submit(process_backend: ProcessBackend) -> None:
    lock = threading.Lock()
    with pytest.raises(UnpicklableError, match=r"Cannot send .*lambda.* to a worker process"):
        process_backend.submit(lambda: lock.locked())
    with pytest.raises(UnpicklableError, match="backend='threads'"):
        process_backend.submit(len, lock)
    assert process_backend.submit(abs, -1).result(timeout=30) == 1


def test_lambdas_and_closures_travel(process_backend: ProcessBackend) -> None:
    offset = 10
    assert process_backend.submit(lambda x: x + offset, 5).result(timeout=30) == 15


def test_environment_reaches_the_workers() -> None:
    backend = ProcessBackend(2, env={"PARALELA_TEST_MARK": "on"})
    try:
        assert backend.submit(getenv, "PARALELA_TEST_MARK").result(timeout=30) == "on"
        cpus = len(os.sched_getaffinity(0))
        assert backend.submit(getenv, "OMP_NUM_THREADS").result(timeout=30) == str(
            max(1, cpus // 2)
        )
    finally:
        backend.shutdown(wait=True)


def test_workers_that_die_at_start_up_stop_the_pool(poll: Callable[..., None]) -> None:
    # A worker that cannot even start Python: the pool must give up, not respawn forever.
    backend = ProcessBackend(1, env={"PYTHONHOME": "/nonexistent"})
    try:
        poll(lambda: backend._broken is not None, timeout=30, what="the pool to give up")
        with pytest.raises(WorkerDiedError, match="die at start-up") as info:
            backend.submit(abs, -1)
        assert "3 in a row, last: exit code 1" in str(info.value)
    finally:
        backend.shutdown(wait=True)


def test_grow_starts_more_workers_while_it_runs() -> None:
    from paralela.backends import ProcessBackend

    backend = ProcessBackend(1)
    try:
        assert backend.submit(os.getpid).result(timeout=30) > 0
        backend.grow(2)
        backend.grow(1)  # never fewer
        assert backend.effective_workers() == 2
        deadline = time.monotonic() + 30
        while len(backend.worker_pids()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        backend.shutdown()


ORPHAN_JOB = '''
import os
import pathlib
import time


def until_orphaned(x):
    """Notes that it started, then returns as soon as its driver is gone (its parent
    changes), so that the worker sends its result to a dead driver."""
    parent = os.getppid()
    pathlib.Path(os.environ["STARTED_DIR"], str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.001)
    return x
'''


def test_workers_of_a_sigkilled_driver_exit_quietly(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    """`paralela map` in a session of its own, its driver alone SIGKILLed (the README's
    kill-and-resume walkthrough): the workers, whose stderr is the driver's, exit without
    a word (no BrokenPipeError traceback from sending a result to the dead driver)."""
    import subprocess
    import sys

    (tmp_path / "orphan_job.py").write_text(ORPHAN_JOB)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(8)))
    started = tmp_path / "started"
    started.mkdir()
    driver = subprocess.Popen(
        [sys.executable, "-m", "paralela", "map", "orphan_job:until_orphaned", "--input",
         "items.jsonl", "--output", "out.jsonl", "--workers", "2", "--chunksize", "1",
         "--run-dir", "run", "--no-progress"],
        cwd=tmp_path,
        env={**os.environ, "STARTED_DIR": str(started)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        poll(lambda: len(os.listdir(started)) == 2, timeout=60, what="both workers busy")
        workers = [psutil.Process(int(pid)) for pid in os.listdir(started)]
        driver.kill()  # the driver only, not its session
        # stderr ends once every process holding it (the workers too) has exited.
        _, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == -signal.SIGKILL
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err, err

    # Gone (a zombie left for init to reap counts as gone). The kernel closes a dying
    # process's files (stderr's end of file above) a moment before it is a zombie: wait
    # out that moment, not a worker that lives on (it would stay "running" for 60 s).
    def gone(worker: psutil.Process) -> bool:
        try:
            return worker.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    poll(lambda: all(gone(w) for w in workers), timeout=10, what="the workers to exit")


# Run by every worker's interpreter at start-up (before paralela is imported): the first
# worker to make the directory starts at once, the other waits until the test lets it.
SLOW_START = """
import os, pathlib, time
gate = pathlib.Path(os.environ["SLOW_START_GATE"])
try:
    (gate / "first").mkdir()
except FileExistsError:
    deadline = time.monotonic() + 60
    while not (gate / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_tasks_go_to_the_worker_that_started_while_another_still_boots(
    tmp_path: Path,
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    env = {
        "SLOW_START_GATE": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    backend = ProcessBackend(2, env=env)
    try:
        futures = [backend.submit(pid_after, 0) for _ in range(3)]
        pids = {f.result(timeout=60) for f in futures}  # the held-back worker runs none
        assert len(pids) == 1
        assert len(backend.worker_pids()) == 2
        (tmp_path / "go").touch()
        more = [backend.submit(pid_after, 0.5) for _ in range(2)]
        assert {f.result(timeout=60) for f in more} <= set(backend.worker_pids())
    finally:
        (tmp_path / "go").touch()
        backend.shutdown()


def loaded(name: str) -> bool:
    import sys

    return name in sys.modules


def import_it(name: str) -> str:
    import importlib

    return importlib.import_module(name).__name__


def test_preloaded_modules_are_imported_before_the_first_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make_backend(..., preload=...)``: each worker imports them as it starts (the
    driver's sys.path is the worker's); one that fails to import is skipped there, and
    the task that imports it gets the error."""
    from paralela.backends import make_backend

    (tmp_path / "preloaded_here.py").write_text("MARK = 1\n", encoding="utf-8")
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = make_backend(
        "processes", 2, preload=["broken_on_import", "preloaded_here", "no_such_module_x"]
    )
    try:
        assert pool.submit(loaded, "preloaded_here").result(timeout=60)
        assert pool.submit(loaded, "preloaded_here").result(timeout=60)
        with pytest.raises(RuntimeError, match="no GPU here"):
            pool.submit(import_it, "broken_on_import").result(timeout=60)
    finally:
        pool.shutdown()
    plain = make_backend("processes", 1)
    try:
        assert not plain.submit(loaded, "preloaded_here").result(timeout=60)
    finally:
        plain.shutdown()
