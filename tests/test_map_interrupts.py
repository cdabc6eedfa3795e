"""Stopping a map: Ctrl-C, a failed item, a killed driver, and BaseExceptions from fn.

The Ctrl-C and kill tests run a real program in a subprocess of its own session, send
the signal the way a terminal does (to the whole process group), and look at what
the program and its workers left behind: marker files of the items that started, the
run directory, the processes still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import default_sigint

import paralela
from paralela.errors import MapError, TaskError

BACKENDS = ["sequential", "threads", "processes"]

# Items that would take this long: a map that waits for them is plainly seen to wait.
LONG_S = 60

PROGRAM = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import paralela

    MARKERS = sys.argv[1]

    def work(x):
        open(os.path.join(MARKERS, f"started-{x}"), "w").close()
        if x == 0:
            return x
        if x == 1 and os.environ.get("FAIL_ON_1"):
            raise ValueError("item 1 is bad")
        if os.environ.get("WITH_CHILD"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            temp = os.path.join(MARKERS, f".tmp-child-{x}")  # renamed whole into place:
            with open(temp, "w") as f:  # the test never reads a marker half-written
                f.write(str(child.pid))
            os.replace(temp, os.path.join(MARKERS, f"child-{x}"))
        time.sleep(LONG_S)
        return x

    if __name__ == "__main__":
        try:
            paralela.map(work, range(8), workers=2, chunksize=1,
                         backend=os.environ.get("BACKEND", "processes"),
                         run_dir=os.path.join(MARKERS, "run"), progress=False)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        except ValueError as exc:
            print(f"failed: {exc}", flush=True)
            sys.exit(1)
    """
).replace("LONG_S", str(LONG_S))


def started(markers: Path) -> set[int]:
    return {int(p.name.split("-")[1]) for p in markers.glob("started-*")}


def start_program(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "job.py"
    script.write_text(PROGRAM)
    markers = tmp_path / "markers"
    markers.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(script), str(markers)],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=default_sigint,
    )
    return process, markers


def end(process: subprocess.Popen[str]) -> None:
    """Kill the program's whole process group if it still runs, and close its pipes."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def descendants_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_ctrl_c_stops_a_map_of_long_items_at_once_and_starts_nothing_more(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    process, markers = start_program(tmp_path)
    try:
        # Item 0 finishes at once; two long items run (1 and 2, or 1 and 3 when 2 was
        # queued behind 1: each worker holds a prefetched task); the rest wait.
        poll(lambda: len(started(markers)) >= 3, timeout=30, what="item 0 and two long items")
        running = started(markers)
        assert 0 in running
        poll(lambda: any((markers / "run" / "chunks").glob("*.pkl")), timeout=10)
        workers = descendants_of(process.pid)
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=LONG_S / 2)
        took = time.monotonic() - sent
    finally:
        end(process)
    assert process.returncode == 130, err
    assert "interrupted" in out
    assert took < 10, f"Ctrl-C took {took:.1f} s to return control"
    assert "Traceback" not in err, err  # no second Ctrl-C needed, no atexit traceback
    assert started(markers) == running, "an item started after Ctrl-C"
    assert [p.name for p in (markers / "run" / "chunks").glob("*.pkl")] == [
        "000000000000-000000000001.pkl"
    ]
    _gone, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive, f"workers outlived the program: {alive}"


def test_a_real_ctrl_c_stops_the_sequential_backend(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    # In the calling thread a real Ctrl-C must stop the map, not fail an item.
    process, markers = start_program(tmp_path, BACKEND="sequential")
    try:
        poll(lambda: started(markers) >= {0, 1}, timeout=30, what="item 1 to run")
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=LONG_S / 2)
    finally:
        end(process)
    assert process.returncode == 130, err
    assert "interrupted" in out
    assert started(markers) == {0, 1}


def test_resume_after_ctrl_c_keeps_what_finished(tmp_path: Path) -> None:
    # The same run directory, resumed with a quick function: item 0 comes from disk.
    process, markers = start_program(tmp_path)
    try:
        wait_for = time.monotonic() + 30
        while not any((markers / "run" / "chunks").glob("*.pkl")):
            assert time.monotonic() < wait_for
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=LONG_S / 2)
    finally:
        end(process)
    chunk = markers / "run" / "chunks" / "000000000000-000000000001.pkl"
    assert chunk.exists()
    assert process.returncode == 130


def test_a_failed_item_stops_the_map_at_once_and_the_program_exits(tmp_path: Path) -> None:
    process, markers = start_program(tmp_path, FAIL_ON_1="1")
    try:
        out, err = process.communicate(timeout=LONG_S / 2)
    finally:
        end(process)
    assert process.returncode == 1, err
    assert "failed: item 1 is bad" in out
    # Only what was already running or queued at the failure ever started.
    assert max(started(markers)) <= 4


def slow_unless_first(x: int) -> int:
    if x == 0:
        raise ValueError("first item fails")
    time.sleep(LONG_S)
    return x


def add_one(x: int) -> int:
    return x + 1


def test_after_a_failed_map_the_next_map_starts_at_once() -> None:
    with pytest.raises(ValueError, match="first item fails"):
        paralela.map(slow_unless_first, range(6), workers=2, chunksize=1)
    sent = time.monotonic()
    assert paralela.map(add_one, range(10), workers=2) == list(range(1, 11))
    took = time.monotonic() - sent
    assert took < LONG_S / 4, f"the next map waited {took:.1f} s behind abandoned items"


def test_processes_started_by_fn_die_with_a_killed_driver(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    process, markers = start_program(tmp_path, WITH_CHILD="1")
    try:
        poll(lambda: len(list(markers.glob("child-*"))) >= 2, timeout=30, what="children")
        children = [int(p.read_text()) for p in markers.glob("child-*")]
        everyone = descendants_of(process.pid)
        assert set(children) <= {p.pid for p in everyone}
        process.kill()  # SIGKILL: the driver cannot clean up anything itself
        process.communicate(timeout=10)
        _gone, alive = psutil.wait_procs(everyone, timeout=5)
        assert not alive, f"still alive 5 s after the driver was killed: {alive}"
    finally:
        end(process)


def sigint_disposition_of_a_child(_: int) -> str:
    code = "import signal; print(signal.getsignal(signal.SIGINT))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_programs_started_by_fn_still_stop_on_ctrl_c() -> None:
    # SIG_IGN survives exec; the worker's own no-op handler does not.
    got = paralela.map(sigint_disposition_of_a_child, range(2), workers=2, chunksize=1)
    assert got == ["<built-in function default_int_handler>"] * 2


def raise_base_exception(x: int) -> int:
    if x == 2:
        raise KeyboardInterrupt("fn raised it")
    if x == 4:
        raise SystemExit(3)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_and_system_exit_from_fn_are_item_failures(backend: str) -> None:
    with pytest.raises(MapError) as info:
        paralela.map(raise_base_exception, range(6), backend=backend, workers=2, on_error="collect")
    failures = info.value.failures
    assert [(f.index, f.exc_type) for f in failures] == [
        (2, "KeyboardInterrupt"),
        (4, "SystemExit"),
    ]
    assert info.value.results == [0, 1, None, 3, None, 5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_from_fn_with_raise_is_a_task_error(backend: str) -> None:
    # Never a fake Ctrl-C: the caller gets a TaskError naming the item.
    with pytest.raises(TaskError) as info:
        paralela.map(raise_base_exception, range(3), backend=backend, workers=2)
    assert info.value.index == 2
    assert info.value.exc_type == "KeyboardInterrupt"


class ExitsWhenLoaded:
    """An item whose unpickling raises SystemExit in the worker."""

    def __reduce__(self) -> tuple[object, ...]:
        return (sys.exit, (7,))


def identity(x: object) -> object:
    return x


def test_an_item_that_raises_system_exit_when_unpickled_is_that_items_failure() -> None:
    items: list[object] = [1, 2, ExitsWhenLoaded(), 4]
    with pytest.raises(MapError) as info:
        paralela.map(identity, items, workers=2, chunksize=4, on_error="collect")
    (failure,) = info.value.failures
    assert failure.index == 2
    assert failure.exc_type == "UnpicklableItem"
    assert "SystemExit: 7" in str(failure)
    assert info.value.results == [1, 2, None, 4]


CLI_TASKS = textwrap.dedent(
    """
    import os, time

    def work(x):
        open(os.path.join(os.environ["MARKERS"], f"started-{x}"), "w").close()
        if x == 0:
            return x
        if x == 1 and os.environ.get("FAIL_ON_1"):
            raise ValueError("item 1 is bad")
        time.sleep(LONG_S)
        return x
    """
).replace("LONG_S", str(LONG_S))


def start_cli(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    (tmp_path / "tasks.py").write_text(CLI_TASKS)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(8)))
    markers = tmp_path / "markers"
    markers.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "paralela", "map", "tasks:work", "--input", "items.jsonl",
         "--output", "out.jsonl", "--run-dir", "run", "--workers", "2", "--chunksize", "1",
         "--no-progress"],
        cwd=tmp_path,
        env={**os.environ, "MARKERS": str(markers), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )  # fmt: skip
    return process, markers


def test_ctrl_c_stops_the_map_command_at_once(tmp_path: Path, poll: Callable[..., None]) -> None:
    process, markers = start_cli(tmp_path)
    try:
        # Item 0 returns at once; then each worker runs a long item. Which ones depends on
        # where the pool queued them (a worker holds a second, prefetched task): item 2
        # may wait behind item 1 while the other worker runs 0, then 3.
        poll(lambda: len(started(markers)) >= 3, timeout=30, what="item 0 and two long items")
        running = started(markers)
        assert 0 in running
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=LONG_S / 2)
        took = time.monotonic() - sent
    finally:
        end(process)
    assert process.returncode == 130, err
    assert took < 10, f"Ctrl-C took {took:.1f} s to return control"
    assert "Interrupted." in err
    assert "Traceback" not in err, err
    assert started(markers) == running  # nothing started after Ctrl-C


def test_the_map_command_exits_right_after_a_failed_item(tmp_path: Path) -> None:
    process, _markers = start_cli(tmp_path, FAIL_ON_1="1")
    try:
        _, err = process.communicate(timeout=LONG_S / 2)
    finally:
        end(process)
    assert process.returncode == 1, err
    assert "Error: ValueError in item 1 (1): item 1 is bad" in err
    # The function's remote traceback is shown; nothing of paralela's own frames.
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "paralela/cli" not in err
