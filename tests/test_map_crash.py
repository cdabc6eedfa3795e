"""The promises, tested by killing real processes: a dead worker's chunk is re-run and
nothing is lost or counted twice; a killed driver resumes from its run directory; no
worker outlives its driver; a huge generator runs in bounded memory; shared memory
leaves nothing behind.

No mocks: workers are killed with real signals (SIGKILL, a real segfault, ``os._exit``),
and drivers are separate Python processes killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy
import psutil
import pytest
from helpers import CountingItems

import paralela
from paralela.backends import ProcessBackend
from paralela.errors import WorkerDiedError
from paralela.mapping._chunking import MAX_CHUNK_ITEMS
from paralela.mapping._engine import IN_FLIGHT_PER_WORKER

pytestmark = pytest.mark.timeout(60)

WORKERS = 2
MIB = 2**20
DEATHS = {
    "kill": ("killed by SIGKILL", -signal.SIGKILL),
    "segv": ("killed by SIGSEGV", -signal.SIGSEGV),
    "exit": ("exit code 3", 3),
}


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segv":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the repository
        ctypes.string_at(0)  # a real segmentation fault in C code
    elif how == "exit":
        os._exit(3)
    raise AssertionError(f"still alive after {how}")


def first_time(marker: str) -> bool:
    """True for exactly one caller across all processes (O_EXCL creation of ``marker``)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def die_once_on(x: int, target: int, marker: str, how: str) -> int:
    if x == target and first_time(marker):
        die(how)
    return x * x


def always_die_on(x: int, target: int, how: str) -> int:
    if x == target:
        die(how)
    return x * x


def slow_square(x: int) -> int:
    time.sleep(0.01)  # the work
    return x * x


def square(x: int) -> int:
    return x * x


def array_sum_die_once(a: object, marker: str) -> float:
    import numpy

    assert isinstance(a, numpy.ndarray)
    if a[0] == 7 and first_time(marker):
        os.kill(os.getpid(), signal.SIGKILL)
    return float(a.sum())


def shm_files() -> set[str]:
    """Named shared memory in /dev/shm (POSIX semaphores of other programs left out)."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def arena_inodes() -> set[int]:
    """The memfd shared-memory blocks this process holds open (one inode per block)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
        try:
            if "paralela-arena" in os.readlink(path):
                found.add(os.stat(path).st_ino)
        except OSError:  # closed meanwhile
            continue
    return found


def assert_covers_exactly(timeline: list[tuple[int, int]], n: int) -> None:
    """``(start, end)`` ranges are disjoint and cover ``0..n`` exactly once."""
    ranges = sorted(timeline)
    assert ranges, "no ranges"
    assert ranges[0][0] == 0
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert start == end, f"gap or overlap at {end}..{start}"
    assert ranges[-1][1] == n


def chunk_ranges(summary: paralela.MapSummary) -> list[tuple[int, int]]:
    return [(t.start, t.start + t.n_items) for t in summary.timeline]


# -- 1. a dead worker's chunk is re-run ---------------------------------------------


@pytest.mark.parametrize("how", sorted(DEATHS))
def test_a_worker_dying_mid_run_loses_nothing(how: str, tmp_path: Path) -> None:
    fn = functools.partial(die_once_on, target=17, marker=str(tmp_path / "died"), how=how)
    results = paralela.map(fn, range(60), workers=WORKERS, chunksize=3)
    assert (tmp_path / "died").exists(), "the worker was supposed to die once"
    assert results == [x * x for x in range(60)]
    s = results.summary
    assert s.retries == 1
    assert (s.items, s.computed_items, s.chunks) == (60, 60, 20)  # nothing counted twice
    assert_covers_exactly(chunk_ranges(s), 60)
    retried = [t for t in s.timeline if t.attempt > 1]
    assert [(t.start, t.attempt) for t in retried] == [(15, 2)]
    # the shared pool replaced its worker and goes on
    assert paralela.map(square, range(10), workers=WORKERS) == [x * x for x in range(10)]


def test_a_worker_killed_from_outside_loses_nothing(
    process_backend: ProcessBackend, poll: Callable[..., None]
) -> None:
    poll(lambda: len(process_backend.worker_pids()) == WORKERS, what="the workers")
    got: list[int] = []
    iterator = paralela.imap(slow_square, range(80), backend=process_backend, chunksize=2)
    victim = None
    for value in iterator:
        got.append(value)
        if len(got) == 6:
            victim = process_backend.worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
    assert got == [x * x for x in range(80)]
    s = iterator.summary
    # The chunk it was running is run again; the one queued behind it just moves. On a
    # loaded machine the worker can be between chunks when the signal lands, and then
    # nothing needs a retry (test_a_worker_dying_mid_run_loses_nothing kills mid-chunk
    # deterministically).
    assert s.retries in (0, 1)
    assert (s.items, s.computed_items) == (80, 80)
    assert_covers_exactly(chunk_ranges(s), 80)
    retried = [t for t in s.timeline if t.attempt > 1]
    assert len(retried) == s.retries
    assert victim is not None
    assert all(t.worker != str(victim) for t in retried)  # re-run on a live worker
    poll(
        lambda: (
            len(process_backend.worker_pids()) == WORKERS
            and victim not in process_backend.worker_pids()
        ),
        what="a replacement worker",
    )


@pytest.mark.parametrize("how", sorted(DEATHS))
def test_a_chunk_that_kills_every_worker_gives_up_and_says_how(how: str) -> None:
    fn = functools.partial(always_die_on, target=6, how=how)
    with pytest.raises(WorkerDiedError) as info:
        paralela.map(fn, range(12), workers=WORKERS, chunksize=4, retries=1)
    words, exitcode = DEATHS[how]
    exc = info.value
    assert exc.exitcode == exitcode
    assert exc.indices == [4, 5, 6, 7]
    assert exc.attempts == 2
    text = str(exc)
    assert words in text
    assert "while running items 4..7" in text
    assert "tried 2 time(s)" in text
    assert paralela.map(square, range(10), workers=WORKERS) == [x * x for x in range(10)]


def test_retries_zero_fails_at_the_first_death() -> None:
    fn = functools.partial(always_die_on, target=0, how="kill")
    with pytest.raises(WorkerDiedError, match=r"item 0: killed by SIGKILL.*tried 1 time"):
        paralela.map(fn, range(3), workers=WORKERS, chunksize=1, retries=0)


# -- 2 and 3. a killed driver resumes; its workers do not outlive it ------------------

JOB = '''
import os
import time


def record(i):
    """Appends i to $CRASH_LOG once computed (O_APPEND: whole lines, any process)."""
    started = os.environ.get("CRASH_STARTED")
    if started:
        with open(started, "a") as f:
            f.write(f"{i}\\n")
    time.sleep(float(os.environ["CRASH_SLEEP"]))
    fd = os.open(os.environ["CRASH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\\n".encode())
    finally:
        os.close(fd)
    return i * i
'''

DRIVER = """
import json
import sys
import time

import paralela
import crash_job

run_dir, n = sys.argv[1], int(sys.argv[2])
backend = paralela.get_backend("processes", 2)
deadline = time.monotonic() + 30
while len(backend.worker_pids()) < 2 and time.monotonic() < deadline:
    time.sleep(0.005)
print(json.dumps({"pids": backend.worker_pids()}), flush=True)
results = paralela.map(crash_job.record, range(n), workers=2, chunksize=2, run_dir=run_dir)
s = results.summary
print(json.dumps({"results": results, "computed": s.computed_items, "resumed": s.resumed_items}))
"""

_CHUNK = re.compile(r"^(\d{12})-(\d{12})\.pkl$")


@pytest.fixture
def driver_dir(tmp_path: Path) -> Path:
    (tmp_path / "crash_job.py").write_text(textwrap.dedent(JOB))
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    return tmp_path


def start_driver(
    where: Path, run_dir: Path, n: int, log: Path, sleep: float, started: Path | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "CRASH_LOG": str(log), "CRASH_SLEEP": str(sleep)}
    if started is not None:
        env["CRASH_STARTED"] = str(started)
    return subprocess.Popen(
        [sys.executable, str(where / "driver.py"), str(run_dir), str(n)],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def stored_ranges(run_dir: Path) -> list[tuple[int, int]]:
    chunks = run_dir / "chunks"
    if not chunks.exists():
        return []
    found = [_CHUNK.match(name) for name in os.listdir(chunks)]
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def logged(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def exited(proc: psutil.Process) -> bool:
    """The process is gone (a zombie waiting for init to reap it counts as gone)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def worker_processes(driver: subprocess.Popen[str]) -> list[psutil.Process]:
    assert driver.stdout is not None
    pids = json.loads(driver.stdout.readline())["pids"]
    assert len(pids) == 2
    procs = [psutil.Process(pid) for pid in pids]
    assert all(p.ppid() == driver.pid for p in procs)
    return procs


def test_a_killed_driver_resumes_from_its_run_directory(
    driver_dir: Path, poll: Callable[..., None]
) -> None:
    n = 60
    run_dir = driver_dir / "run"
    first_log, second_log = driver_dir / "first.log", driver_dir / "second.log"

    with start_driver(driver_dir, run_dir, n, first_log, sleep=0.02) as first:
        workers = worker_processes(first)
        poll(lambda: len(stored_ranges(run_dir)) >= 3, timeout=30, what="three stored chunks")
        first.kill()  # SIGKILL: no cleanup of any kind
        assert first.wait() == -signal.SIGKILL
    poll(lambda: all(exited(w) for w in workers), timeout=10, what="the workers to exit")

    stored = stored_ranges(run_dir)
    stored_items = {i for start, end in stored for i in range(start, end)}
    assert sum(end - start for start, end in stored) == len(stored_items)  # disjoint
    assert 0 < len(stored_items) < n, "the driver should die mid-run"

    with start_driver(driver_dir, run_dir, n, second_log, sleep=0.0) as second:
        out, _ = second.communicate(timeout=50)
        assert second.returncode == 0
    report = json.loads(out.splitlines()[-1])
    assert report["results"] == [i * i for i in range(n)]
    assert report["resumed"] == len(stored_items)
    assert report["computed"] == n - len(stored_items)
    recomputed = logged(second_log)
    assert sorted(recomputed) == sorted(set(range(n)) - stored_items)  # each exactly once
    assert_covers_exactly(stored_ranges(run_dir), n)  # no item stored twice


def test_workers_exit_when_their_driver_is_killed_mid_item(
    driver_dir: Path, poll: Callable[..., None]
) -> None:
    run_dir = driver_dir / "run"
    started, log = driver_dir / "started", driver_dir / "done.log"
    with start_driver(driver_dir, run_dir, 4, log, sleep=120, started=started) as driver:
        workers = worker_processes(driver)
        poll(lambda: len(logged(started)) == 2, timeout=30, what="both workers to be busy")
        assert not any(exited(w) for w in workers)
        driver.kill()
        driver.wait()
    poll(lambda: all(exited(w) for w in workers), timeout=5, what="orphaned workers to exit")
    assert logged(log) == []  # they stopped mid-item, not after it


# -- 4. bounded memory on a huge generator -------------------------------------------


def test_a_huge_generator_is_never_read_far_ahead() -> None:
    chunksize = 1000
    items = CountingItems(10**7)
    iterator = paralela.imap(abs, items, workers=WORKERS, chunksize=chunksize)
    # New chunks are read only while fewer than `window` wait to be yielded, and at most
    # `window` are in flight; with the one being yielded and the item peeked at:
    window = WORKERS * IN_FLIGHT_PER_WORKER
    bound = 2 * window * chunksize + 1
    consumed = 0
    lead = 0
    for value in iterator:
        assert value == consumed
        consumed += 1
        lead = max(lead, items.produced - consumed)
        if consumed == 1_000_000:
            break
    iterator.close()
    assert lead <= bound
    assert items.produced <= consumed + bound


def test_auto_chunks_of_a_huge_generator_are_never_read_far_ahead() -> None:
    # A trivial function makes auto chunks as large as they get: MAX_CHUNK_ITEMS.
    items = CountingItems(10**7)
    iterator = paralela.imap(abs, items, workers=WORKERS)
    window = WORKERS * IN_FLIGHT_PER_WORKER
    bound = 2 * window * MAX_CHUNK_ITEMS + 1
    lead = 0
    for index, value in enumerate(iterator):
        assert value == index
        lead = max(lead, items.produced - (index + 1))
        if index + 1 == 1_000_000:
            break
    iterator.close()
    assert lead <= bound


def test_a_huge_generator_runs_in_little_memory() -> None:
    items = CountingItems(10**7)
    tracemalloc.start()
    try:
        iterator = paralela.imap(abs, items, workers=WORKERS, chunksize=1000)
        last = -1
        for value in iterator:
            assert value == last + 1
            last = value
            if value == 199_999:
                break
        iterator.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last == 199_999
    assert peak < 8 * MIB  # 200,000 ints alone would take more than that


# -- 5. shared memory leaves nothing behind -----------------------------------------


@pytest.mark.parametrize("kill", [False, True], ids=["clean", "worker-killed"])
def test_big_arrays_leave_nothing_in_dev_shm(
    kill: bool, tmp_path: Path, poll: Callable[..., None]
) -> None:
    backend = paralela.get_backend("processes", WORKERS)
    paralela.map(square, range(4), backend=backend)  # the pool is up before counting
    poll(lambda: len(backend.worker_pids()) == WORKERS, what="the workers")
    shm_before = shm_files()
    arenas_before = arena_inodes()

    marker = tmp_path / "died"
    if not kill:
        marker.touch()
    arrays = [numpy.full(MIB // 8, float(i)) for i in range(50)]  # 50 arrays of 1 MiB
    fn = functools.partial(array_sum_die_once, marker=str(marker))
    results = paralela.map(fn, arrays, backend=backend)

    assert results == [float(i) * (MIB // 8) for i in range(50)]
    assert results.summary.retries == (1 if kill else 0)
    assert shm_files() - shm_before == set()
    poll(lambda: len(backend.worker_pids()) == WORKERS, what="a replacement worker")
    arenas_after = arena_inodes()
    # a dead worker's shared memory blocks are closed (so the kernel frees them), and its
    # replacement has its own: as many blocks as before
    assert len(arenas_after) == len(arenas_before)
    assert (arenas_after != arenas_before) is kill
