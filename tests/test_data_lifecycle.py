"""``paralela.data`` under the ways runs end: errors carry their stage and position,
leaving the loop, Ctrl-C and the interpreter's exit leave no worker behind, memory stays
bounded under a slow consumer, and ``workers="auto"`` keeps within the CPU budget."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import default_sigint

from paralela.data import Pipeline
from paralela.errors import WorkerDiedError
from tests.data_helpers import (
    cpu_work,
    die_on_10,
    die_once_on_10,
    fail_on_7,
    megabyte,
    pid_of,
    slow_io,
    square,
)

ROOT = Path(__file__).parent.parent


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"}


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_error_is_the_users_own_with_its_stage_and_position(kind: str) -> None:
    pipeline = Pipeline.from_iterable(range(20)).map(fail_on_7, kind=kind, workers=2).map(square)
    seen: list[int] = []
    with pytest.raises(ValueError, match="cannot handle 7") as caught:
        seen.extend(pipeline)  # what came before the failure is kept: extend adds as it goes
    assert seen == [x * x for x in range(7)], "in order: everything before the failure"
    error = caught.value
    assert error.paralela_stage == "map(fail_on_7)"  # type: ignore[attr-defined]
    assert error.paralela_position == 7  # type: ignore[attr-defined]
    assert "in stage map(fail_on_7), on its element 7" in " ".join(error.__notes__)
    if kind == "process":  # the worker's traceback, as the cause
        assert "fail_on_7" in str(error.__cause__)


def test_a_dead_process_worker_is_blamed_on_its_element_and_nothing_before_is_lost() -> None:
    # Elements go to a process in chunks (up to 64 of fast ones): the chunk whose worker
    # died is run again one element at a time, so the element that kills its worker is
    # the one named, and every element before it is delivered.
    pipeline = Pipeline.from_iterable(range(40)).map(die_on_10, kind="process", workers=1)
    seen: list[int] = []
    with pytest.raises(WorkerDiedError, match="killed by SIGKILL") as caught:
        seen.extend(pipeline)
    assert seen == list(range(10))
    error = caught.value
    assert error.paralela_position == 10  # type: ignore[attr-defined]
    assert error.indices == [10]
    assert "in stage map(die_on_10), on its element 10" in " ".join(error.__notes__)
    assert "retries=" not in str(error)  # a pipeline's map has no retries= to raise


def test_a_chunk_whose_worker_was_killed_once_is_delivered_whole(tmp_path: Path) -> None:
    dies_once = functools.partial(die_once_on_10, str(tmp_path / "died"))
    pipeline = Pipeline.from_iterable(range(40)).map(dies_once, kind="process", workers=1)
    assert list(pipeline) == list(range(40))
    assert (tmp_path / "died").exists()  # its worker did die


def test_an_error_in_a_filter_or_interleave_names_its_stage() -> None:
    with pytest.raises(ZeroDivisionError) as caught:
        list(Pipeline.from_iterable([1, 2, 0, 3]).filter(lambda x: 1 / x))
    assert caught.value.paralela_position == 2  # type: ignore[attr-defined]

    def broken(n: int) -> list[int]:
        if n == 1:
            raise OSError("unreadable shard 1")
        return [n]

    with pytest.raises(OSError, match="unreadable shard 1") as caught_io:
        list(Pipeline.from_iterable([0, 1, 2]).interleave(broken, cycle_length=2))
    assert "interleave(" in caught_io.value.paralela_stage  # type: ignore[attr-defined]


def test_leaving_the_loop_stops_every_process_and_thread() -> None:
    me = psutil.Process()
    before_children = {c.pid for c in me.children(recursive=True)}
    before_threads = {t.ident for t in threading.enumerate()}
    pipeline = (
        Pipeline.from_iterable(range(10_000))
        .map(slow_io, workers=8)
        .map(pid_of, kind="process", workers=2)
        .prefetch(4)
    )
    workers = set()
    for pid in pipeline:
        workers.add(pid)
        if len(workers) == 2:
            break
    assert _alive(workers) == set() or _wait_gone(workers)
    assert {c.pid for c in me.children(recursive=True)} - before_children == set()
    deadline = time.monotonic() + 5
    while {t.ident for t in threading.enumerate()} - before_threads:
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.05)
    assert pipeline.stats().stages[1].elements < 10_000


def _wait_gone(pids: set[int]) -> bool:
    deadline = time.monotonic() + 5
    while _alive(pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_ctrl_c_stops_the_run_and_its_workers(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, sys, time
        sys.path.insert(0, sys.argv[1])
        from paralela.data import Pipeline
        from tests.data_helpers import pid_of
        pipeline = Pipeline.from_iterable(range(10**9)).map(pid_of, kind="process", workers=2)
        try:
            for pid in pipeline:
                print(pid, flush=True)
                time.sleep(0.01)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        """,
    )
    process = subprocess.Popen(
        [sys.executable, str(script), str(ROOT)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None
    pids = {int(process.stdout.readline()) for _ in range(20)}
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "interrupted" in out
    assert _wait_gone(pids), "a worker outlived the Ctrl-C"


def test_the_interpreter_exits_while_a_thread_stage_is_stuck(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        from paralela.data import Pipeline
        from tests.data_helpers import sleep_forever
        pipeline = Pipeline.from_iterable(range(100)).map(sleep_forever, workers=4).prefetch(2)
        iterator = iter(pipeline)
        print("leaving", flush=True)   # never waits for an element: the threads sleep on
        """,
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 15


def test_memory_stays_bounded_under_a_slow_consumer() -> None:
    # 400 arrays of 1 MiB from fast workers, taken slowly: the queues between the stages
    # are bounded, so the process holds a few MiB of them, never the whole 400 MiB.
    process = psutil.Process()
    pipeline = Pipeline.from_iterable(range(400)).map(megabyte, workers=4).prefetch(4)
    baseline = process.memory_info().rss
    peak = baseline
    for i, array in enumerate(pipeline):
        assert array[0] == i
        if i % 20 == 0:
            time.sleep(0.05)  # the consumer is the slow stage
            peak = max(peak, process.memory_info().rss)
    assert peak - baseline < 64 << 20, f"grew by {(peak - baseline) >> 20} MiB"


def test_auto_grows_an_io_stage_beyond_the_cpus_and_a_cpu_stage_up_to_them() -> None:
    io = Pipeline.from_iterable(range(400)).map(slow_io)  # 10 ms of sleep each
    started = time.perf_counter()
    assert len(list(io)) == 400
    elapsed = time.perf_counter() - started
    stage = io.stats().stages[1]
    assert stage.max_workers > 2, "an I/O stage uses little CPU: it may exceed the CPUs"
    assert elapsed < 2.5, f"400 x 10 ms took {elapsed:.1f} s: the waits did not overlap"
    cpus = len(os.sched_getaffinity(0))
    cpu = Pipeline.from_iterable(range(300)).map(cpu_work, kind="process")
    assert len(list(cpu)) == 300
    assert 1 <= cpu.stats().stages[1].max_workers <= cpus


def test_auto_keeps_within_a_declared_allocation_smaller_than_the_machine(
    tmp_path: Path,
) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        from paralela.data import Pipeline
        from tests.data_helpers import cpu_work
        pipeline = Pipeline.from_iterable(range(300)).map(cpu_work, kind="process")
        assert len(list(pipeline)) == 300
        stats = pipeline.stats()
        print(stats.cpus, stats.stages[1].max_workers)
        """,
    )
    # An allocation of one CPU (as Slurm's --cpus-per-task=1 pins it): the tuner's budget
    result = subprocess.run(
        ["taskset", "-c", "0", sys.executable, str(script), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    cpus, workers = map(int, result.stdout.split())
    assert cpus == 1
    assert workers == 1
    limited = Pipeline.from_iterable(range(200)).map(cpu_work, kind="process").with_options(cpus=1)
    assert len(list(limited)) == 200
    assert limited.stats().cpus == 1
    assert limited.stats().stages[1].max_workers == 1
