"""`paralela map`: the real command in a subprocess (cwd = a tmp dir holding the user's
module), and Typer's CliRunner in-process for the cases that start no workers."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import default_sigint
from typer.testing import CliRunner

from paralela.cli import app

TASKS = """
import os
import signal
import sys

def square(x):
    return x * x

def square_logged(x):
    # One line per call: tells a resumed run (no calls) from a recomputed one.
    with open("calls.log", "a") as log:
        log.write(f"{x}\\n")
    return x * x

def cube(x):
    return x ** 3

def skewed(x):
    # Item 0 costs far more than the others (a busy loop, not a sleep).
    total = 0
    for i in range(300_000 if x == 0 else 100):
        total += i % 7
    return {"x": x, "total": total}

def fails_on_3(x):
    if x == 3:
        raise ValueError(f"cannot handle {x}")
    return x * 10

def dies_on_3(x):
    if x == 3:
        os._exit(7)
    return x

def interrupts_on_3(x):
    # Ctrl-C, as the driver would get it from the terminal, while item 3 runs.
    if x == 3:
        os.kill(os.getppid(), signal.SIGINT)
    return x

def returns_a_set(x):
    return {x}

def nan_on_2(x):
    with open("calls.log", "a") as log:
        log.write(f"{x}\\n")
    return {"loss": float("nan") if x == 2 else x}

def result_of_kind(kind):
    # A result that strict JSON cannot hold, of the kind the item names.
    if kind == "nan":
        return {"loss": float("nan")}
    if kind == "inf":
        return [1.0, float("-inf")]
    if kind == "surrogate":
        return b"caf\\xe9".decode("utf-8", "surrogateescape")
    if kind == "deep":
        value = []
        for _ in range(100_000):
            value = [value]
        return value
    if kind == "set":
        return {1}
    return kind

class Stop(BaseException):
    pass

def keyboard_interrupt_on_3(x):
    if x == 3:
        raise KeyboardInterrupt  # raised by the function: not a Ctrl-C
    return x

def system_exit_on_3(x):
    if x == 3:
        sys.exit(3)
    return x

def stop_on_3(x):
    if x == 3:
        raise Stop("enough")
    return x

def count_lines(path):
    with open(path) as f:
        return {"lines": sum(1 for _ in f)}

NOT_A_FUNCTION = 42
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tasks.py").write_text(TASKS)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(6)))
    return tmp_path


def paralela(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m paralela ARGS` in ``cwd``, as a user would from a shell."""
    return subprocess.run(
        [sys.executable, "-m", "paralela", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=default_sigint,  # the Ctrl-C tests: even under a runner ignoring SIGINT
    )


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name]


def kept_before_3(path: Path, result: Any = lambda x: x * 10) -> list[int]:
    """The indices of the results a run stopped by item 3 kept in ``path``: each with its
    right result, item 3 never among them (none kept: ``path`` was not written)."""
    got = records(path) if path.exists() else []
    assert all(r == {"index": r["index"], "item": r["index"], "result": result(r["index"])}
               for r in got), got  # fmt: skip
    indices = [r["index"] for r in got]
    assert 3 not in indices
    assert indices == sorted(indices)
    return indices


def strict_records(data: bytes) -> list[dict[str, Any]]:
    """The lines of ``data`` as any strict JSON reader sees them: UTF-8, no NaN."""

    def no_constant(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return [json.loads(line, parse_constant=no_constant) for line in data.decode().splitlines()]


# -- results --------------------------------------------------------------------------


def test_results_file_is_exact_and_in_input_order(workdir: Path) -> None:
    items = [3, "ab", [1, 2], {"k": 1.5}, 0, -2]
    (workdir / "mixed.jsonl").write_text("\n".join(json.dumps(i) for i in items) + "\n\n")
    (workdir / "lengths.py").write_text(
        "def kind(x):\n    return {'type': type(x).__name__, 'repr': repr(x)}\n"
    )
    proc = paralela(
        workdir,
        "map",
        "lengths:kind",
        "--input",
        "mixed.jsonl",
        "--output",
        "out.jsonl",
        "--workers",
        "2",
        "--chunksize",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert records(workdir / "out.jsonl") == [
        {"index": i, "item": item, "result": {"type": type(item).__name__, "repr": repr(item)}}
        for i, item in enumerate(items)
    ]
    line = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"paralela map: 6 items \(6 computed, 0 resumed\) in [\d.]+ s", line), line
    assert "items/s" in line
    assert re.search(r"\d+ workers \d+% busy", line), line
    assert leftovers(workdir) == []


def test_unordered_keeps_the_output_in_input_order(workdir: Path) -> None:
    (workdir / "many.jsonl").write_text("".join(f"{i}\n" for i in range(40)))
    proc = paralela(
        workdir,
        "map",
        "tasks:skewed",
        "-i",
        "many.jsonl",
        "-o",
        "out.jsonl",
        "--unordered",
        "--chunksize",
        "1",
        "--workers",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    got = records(workdir / "out.jsonl")
    assert [r["index"] for r in got] == list(range(40))
    assert [r["item"] for r in got] == list(range(40))
    assert got[0]["result"] == {"x": 0, "total": sum(i % 7 for i in range(300_000))}
    assert got[5]["result"] == {"x": 5, "total": sum(i % 7 for i in range(100))}


def test_glob_mode_passes_sorted_file_paths(workdir: Path) -> None:
    data = workdir / "data"
    data.mkdir()
    for name, n in [("b.csv", 2), ("a.csv", 1), ("c.csv", 3)]:
        (data / name).write_text("row\n" * n)
    (data / "notes.txt").write_text("not matched\n")
    (data / "d.csv").mkdir()  # a directory matching the pattern is not an item
    proc = paralela(workdir, "map", "tasks:count_lines", "--glob", "data/*.csv", "-o", "out.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert records(workdir / "out.jsonl") == [
        {"index": 0, "item": "data/a.csv", "result": {"lines": 1}},
        {"index": 1, "item": "data/b.csv", "result": {"lines": 2}},
        {"index": 2, "item": "data/c.csv", "result": {"lines": 3}},
    ]


def test_output_dash_writes_results_to_stdout_and_the_summary_to_stderr(workdir: Path) -> None:
    proc = paralela(workdir, "map", "tasks:square", "-i", "items.jsonl", "-o", "-")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"index": i, "item": i, "result": i * i} for i in range(6)
    ]
    assert "paralela map: 6 items" in proc.stderr
    assert not (workdir / "-").exists()


def test_output_into_a_named_pipe_is_written_directly(workdir: Path) -> None:
    fifo = workdir / "results.pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    proc = paralela(workdir, "map", "tasks:square", "-i", "items.jsonl", "-o", str(fifo))
    if reader.is_alive():  # the command never opened the pipe: unblock the reader
        with open(fifo, "w"):
            pass
    reader.join(timeout=10)
    assert proc.returncode == 0, proc.stderr
    assert fifo.is_fifo()  # not replaced by a regular file
    assert [json.loads(line)["result"] for line in received[0].splitlines()] == [
        i * i for i in range(6)
    ]


def test_output_through_a_symlink_replaces_its_target(workdir: Path) -> None:
    (workdir / "store").mkdir()
    link = workdir / "latest.jsonl"
    link.symlink_to(workdir / "store" / "results.jsonl")
    proc = paralela(workdir, "map", "tasks:square", "-i", "items.jsonl", "-o", "latest.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink()
    assert len(records(workdir / "store" / "results.jsonl")) == 6
    assert leftovers(workdir / "store") == []


def test_input_dash_reads_stdin_and_a_file_path_names_the_module(workdir: Path) -> None:
    lib = workdir / "lib"
    lib.mkdir()
    (lib / "textfeat.py").write_text("def words(s):\n    return len(s.split())\n")
    proc = paralela(
        workdir,
        "map",
        "lib/textfeat.py:words",
        "-i",
        "-",
        "-o",
        "-",
        stdin='"a b c"\n"hello"\n',
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["result"] for line in proc.stdout.splitlines()] == [3, 1]


def test_run_dir_resumes_without_computing_again(workdir: Path) -> None:
    args = ["map", "tasks:square_logged", "-i", "items.jsonl", "-o", "out.jsonl"]
    first = paralela(workdir, *args, "--run-dir", "run")
    assert first.returncode == 0, first.stderr
    assert "(6 computed, 0 resumed)" in first.stderr
    assert sorted((workdir / "calls.log").read_text().split()) == [str(i) for i in range(6)]
    (workdir / "out.jsonl").unlink()

    second = paralela(workdir, *args, "--run-dir", "run")
    assert second.returncode == 0, second.stderr
    assert "(0 computed, 6 resumed)" in second.stderr
    assert len((workdir / "calls.log").read_text().split()) == 6  # no new calls
    assert records(workdir / "out.jsonl") == [
        {"index": i, "item": i, "result": i * i} for i in range(6)
    ]


# -- exit codes -----------------------------------------------------------------------


def test_exit_1_when_the_function_raises_keeps_the_results_before_it(workdir: Path) -> None:
    (workdir / "out.jsonl").write_text("previous results\n")
    proc = paralela(workdir, "map", "tasks:fails_on_3", "-i", "items.jsonl", "-o", "out.jsonl",
                    "--workers", "1", "--chunksize", "1")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ValueError in item 3 (3): cannot handle 3\n")
    assert "Remote traceback" in proc.stderr
    assert 'raise ValueError(f"cannot handle {x}")' in proc.stderr  # the user's frame
    assert 'Traceback (most recent call last):\n  File "<frozen runpy>"' not in proc.stderr
    # The ordered prefix that finished is written, as a finished run writes it (was:
    # nothing, all of it lost without --run-dir).
    assert records(workdir / "out.jsonl") == [
        {"index": i, "item": i, "result": i * 10} for i in range(3)
    ]
    assert (
        "The 3 results that finished (items 0-2) are in out.jsonl. With --run-dir DIR, "
        "running again would skip them instead of computing them again."
    ) in proc.stderr
    assert leftovers(workdir) == []


def test_exit_1_with_collect_writes_error_lines(workdir: Path) -> None:
    proc = paralela(
        workdir,
        "map",
        "tasks:fails_on_3",
        "-i",
        "items.jsonl",
        "-o",
        "out.jsonl",
        "--on-error",
        "collect",
    )
    assert proc.returncode == 1
    assert "1 of 6 items failed" in proc.stderr
    assert "ValueError in item 3 (3)" in proc.stderr
    assert "1 failed" in proc.stderr  # in the summary line
    got = records(workdir / "out.jsonl")
    assert got[3] == {"index": 3, "item": 3, "error": "ValueError: cannot handle 3"}
    assert [r.get("result") for r in got] == [0, 10, 20, None, 40, 50]


def test_exit_1_when_a_result_is_not_json(workdir: Path) -> None:
    proc = paralela(workdir, "map", "tasks:returns_a_set", "-i", "items.jsonl", "-o", "out.jsonl")
    assert proc.returncode == 1
    assert "The result of item 0 (0) cannot be written as JSON" in proc.stderr
    assert "set is not JSON serializable" in proc.stderr
    assert not (workdir / "out.jsonl").exists()
    assert leftovers(workdir) == []


def test_exit_3_when_a_worker_dies_more_often_than_retries_allow(workdir: Path) -> None:
    proc = paralela(
        workdir,
        "map",
        "tasks:dies_on_3",
        "-i",
        "items.jsonl",
        "-o",
        "out.jsonl",
        "--retries",
        "0",
        "--chunksize",
        "1",
        "--workers",
        "2",
    )
    assert proc.returncode == 3, proc.stderr
    assert "died while running item 3: exit code 7; tried 1 time(s)" in proc.stderr
    assert "--retries" in proc.stderr
    kept_before_3(workdir / "out.jsonl", lambda x: x)


def test_exit_4_when_the_run_dir_belongs_to_another_function(workdir: Path) -> None:
    first = paralela(
        workdir, "map", "tasks:square", "-i", "items.jsonl", "-o", "a.jsonl", "--run-dir", "run"
    )
    assert first.returncode == 0, first.stderr
    proc = paralela(
        workdir, "map", "tasks:cube", "-i", "items.jsonl", "-o", "b.jsonl", "--run-dir", "run"
    )
    assert proc.returncode == 4
    assert "holds results of another computation" in proc.stderr
    assert "made for square" in proc.stderr
    assert "--run-dir" in proc.stderr
    assert not (workdir / "b.jsonl").exists()


def test_exit_130_on_ctrl_c_keeps_finished_chunks(workdir: Path) -> None:
    proc = paralela(
        workdir, "map", "tasks:interrupts_on_3", "-i", "items.jsonl", "-o", "out.jsonl",
        "--chunksize", "1", "--workers", "2", "--run-dir", "run",
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert "Interrupted. Finished chunks are kept in run; run again to resume." in proc.stderr
    assert not (workdir / "out.jsonl").exists()
    assert (workdir / "run" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("function", "head"),
    [
        ("keyboard_interrupt_on_3", "Error: KeyboardInterrupt in item 3 (3)\n"),
        ("system_exit_on_3", "Error: SystemExit in item 3 (3): 3\n"),
        ("stop_on_3", "Error: tasks.Stop in item 3 (3): enough\n"),
    ],
)
def test_exit_1_when_the_function_raises_a_base_exception(
    workdir: Path, function: str, head: str
) -> None:
    proc = paralela(workdir, "map", f"tasks:{function}", "-i", "items.jsonl", "-o", "out.jsonl")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(head), proc.stderr  # no traceback of the command itself
    assert "Remote traceback" in proc.stderr
    kept_before_3(workdir / "out.jsonl", lambda x: x)


def test_stdin_is_decoded_as_strictly_as_a_file(workdir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "paralela", "map", "tasks:square", "-i", "-", "-o", "out.jsonl"],
        cwd=workdir,
        input=b'"ok"\n"caf\xe9"\n',
        capture_output=True,
        timeout=60,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert "Error: stdin line 2 is not UTF-8" in stderr
    assert not (workdir / "out.jsonl").exists()


@pytest.mark.parametrize("to_stdout", [False, True], ids=["output-file", "stdout"])
def test_exit_1_on_a_full_disk_keeps_the_results_in_the_run_dir(
    workdir: Path, to_stdout: bool
) -> None:
    args = ["map", "tasks:square", "-i", "items.jsonl", "--run-dir", "run"]
    with open("/dev/full", "w") as full:  # every write: "No space left on device"
        proc = subprocess.run(
            [sys.executable, "-m", "paralela", *args, "-o", "-" if to_stdout else "/dev/full"],
            cwd=workdir,
            stdout=full if to_stdout else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    where = "standard output" if to_stdout else "--output /dev/full"
    assert f"Error: Cannot write {where}: No space left on device." in proc.stderr
    assert "The results are kept in run" in proc.stderr
    assert "Traceback" not in proc.stderr
    again = paralela(workdir, *args, "-o", "out.jsonl")
    assert again.returncode == 0, again.stderr
    assert "(0 computed, 6 resumed)" in again.stderr
    assert records(workdir / "out.jsonl") == [
        {"index": i, "item": i, "result": i * i} for i in range(6)
    ]


def test_exit_2_for_a_module_that_does_not_exist(workdir: Path) -> None:
    proc = paralela(workdir, "map", "no_such_module:f", "-i", "items.jsonl", "-o", "out.jsonl")
    assert proc.returncode == 2
    assert f"No module named 'no_such_module' in the current directory ({workdir.resolve()})" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_help_lists_the_commands_and_the_exit_codes(workdir: Path) -> None:
    proc = paralela(workdir, "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("map", "info", "demo"):
        assert re.search(rf"^\W*{command}\s", proc.stdout, re.MULTILINE), proc.stdout
    help_text = paralela(workdir, "map", "--help")
    assert help_text.returncode == 0
    flat = " ".join(help_text.stdout.split())
    assert "Exit codes: 0 ok; 1 the function raised" in flat
    assert "4 the run directory belongs to another computation" in flat


# -- in-process, through CliRunner ----------------------------------------------------


@pytest.fixture
def here(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in-process from ``workdir``, undoing the command's sys.path and imports."""
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield workdir
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(workdir)):
            del sys.modules[name]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_sequential_backend_in_process(here: Path) -> None:
    result = invoke(
        "map",
        "tasks:square",
        "-i",
        "items.jsonl",
        "-o",
        "out.jsonl",
        "--backend",
        "sequential",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert records(here / "out.jsonl") == [
        {"index": i, "item": i, "result": i * i} for i in range(6)
    ]
    assert "paralela map: 6 items (6 computed, 0 resumed)" in result.stderr


def test_unordered_collect_in_process(here: Path) -> None:
    result = invoke(
        "map", "tasks:fails_on_3", "-i", "items.jsonl", "-o", "out.jsonl", "--unordered",
        "--on-error", "collect", "--backend", "sequential", "--chunksize", "2",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "1 of 6 items failed" in result.stderr
    assert "ValueError in item 3 (3): cannot handle 3" in result.stderr  # the item, not (3, 3)
    got = records(here / "out.jsonl")
    assert [r["index"] for r in got] == list(range(6))
    assert got[3] == {"index": 3, "item": 3, "error": "ValueError: cannot handle 3"}
    assert [r.get("result") for r in got] == [0, 10, 20, None, 40, 50]


def test_stdout_gets_nothing_when_a_result_is_not_json(here: Path) -> None:
    result = invoke(
        "map", "tasks:returns_a_set", "-i", "items.jsonl", "-o", "-", "-b", "sequential"
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "cannot be written as JSON" in result.stderr


def test_exit_1_in_process_names_the_item_and_the_functions_frame(here: Path) -> None:
    result = invoke(
        "map", "tasks:fails_on_3", "-i", "items.jsonl", "-o", "out.jsonl", "--unordered",
        "-b", "sequential",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: ValueError in item 3 (3): cannot handle 3\n")
    assert 'raise ValueError(f"cannot handle {x}")' in result.stderr
    kept_before_3(here / "out.jsonl")  # those that came back before item 3 failed


@pytest.mark.parametrize("to_collect", [False, True], ids=["raise", "collect"])
def test_base_exceptions_from_the_function_are_item_failures(here: Path, to_collect: bool) -> None:
    errors = {}
    for function, error in [
        ("keyboard_interrupt_on_3", "KeyboardInterrupt"),
        ("system_exit_on_3", "SystemExit: 3"),
        ("stop_on_3", "tasks.Stop: enough"),
    ]:
        result = invoke(
            "map", f"tasks:{function}", "-i", "items.jsonl", "-o", "out.jsonl", "-b",
            "sequential", "--on-error", "collect" if to_collect else "raise",
        )  # fmt: skip
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        if to_collect:
            errors[error] = records(here / "out.jsonl")[3]
            assert "1 of 6 items failed" in result.stderr
        else:
            assert result.stderr.startswith(f"Error: {error.split(':')[0]} in item 3 (3)")
    if to_collect:
        assert errors == {e: {"index": 3, "item": 3, "error": e} for e in errors}


def test_a_result_json_cannot_hold_stops_the_run_when_its_item_finishes(here: Path) -> None:
    (here / "many.jsonl").write_text("".join(f"{i}\n" for i in range(50)))
    result = invoke(
        "map", "tasks:nan_on_2", "-i", "many.jsonl", "-o", "out.jsonl", "-b", "sequential",
        "--chunksize", "1",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(
        "Error: The result of item 2 (2) cannot be written as JSON: the result['loss'] is NaN"
    )
    assert "--nan-as null" in result.stderr
    assert len((here / "calls.log").read_text().split()) < 50  # not after all the work
    assert records(here / "out.jsonl") == [  # the results before it
        {"index": i, "item": i, "result": {"loss": i}} for i in range(2)
    ]
    assert "The 2 results that finished (items 0-1) are in out.jsonl." in result.stderr


def test_results_json_cannot_hold_fail_their_items_with_collect(here: Path) -> None:
    kinds = ["ok", "nan", "inf", "surrogate", "deep", "set", "fine"]
    (here / "kinds.jsonl").write_text("".join(json.dumps(k) + "\n" for k in kinds))
    result = invoke(
        "map", "tasks:result_of_kind", "-i", "kinds.jsonl", "-o", "out.jsonl", "-b", "sequential",
        "--on-error", "collect",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "5 of 7 items failed" in result.stderr
    assert "5 failed" in result.stderr  # the summary line counts them
    got = strict_records((here / "out.jsonl").read_bytes())
    assert [r["item"] for r in got] == kinds
    assert [r.get("result") for r in got] == ["ok", None, None, None, None, None, "fine"]
    errors = {r["item"]: r["error"] for r in got if "error" in r}
    assert all(e.startswith("UnwritableResult: the result cannot be written as JSON: ")
               for e in errors.values())  # fmt: skip
    assert "the result['loss'] is NaN" in errors["nan"]
    assert "the result[1] is -Infinity" in errors["inf"]
    assert "lone surrogate" in errors["surrogate"]
    assert "nests too deeply" in errors["deep"]
    assert "Object of type set is not JSON serializable" in errors["set"]


@pytest.mark.parametrize(
    ("nan_as", "written"), [("null", None), ("string", "NaN")], ids=["null", "string"]
)
def test_nan_as_writes_nan_and_infinity_as_chosen(here: Path, nan_as: str, written: Any) -> None:
    (here / "nans.jsonl").write_text('"nan"\n"inf"\nNaN\n')
    result = invoke(
        "map", "tasks:result_of_kind", "-i", "nans.jsonl", "-o", "out.jsonl", "-b", "sequential",
        "--nan-as", nan_as,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    minus_inf = None if nan_as == "null" else "-Infinity"
    assert strict_records((here / "out.jsonl").read_bytes()) == [
        {"index": 0, "item": "nan", "result": {"loss": written}},
        {"index": 1, "item": "inf", "result": [1.0, minus_inf]},
        {"index": 2, "item": written, "result": written},
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("NaN", "the item is NaN, which JSON cannot hold"),
        ('{"x": [1, -Infinity]}', "the item['x'][1] is -Infinity, which JSON cannot hold"),
        ('"\\udcff"', "the item holds '\\udcff', a lone surrogate"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    ],
    ids=["nan", "infinity", "surrogate", "deep"],
)
def test_exit_2_for_input_json_cannot_hold_names_the_line(
    here: Path, line: str, message: str
) -> None:
    (here / "bad.jsonl").write_text(f"1\n2\n{line}\n4\n")
    result = invoke("map", "tasks:square", "-i", "bad.jsonl", "-o", "out.jsonl")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: bad.jsonl line 3 ")
    assert message in result.stderr
    assert not (here / "out.jsonl").exists()


def test_exit_2_names_the_real_line_of_a_byte_that_is_not_utf8(here: Path) -> None:
    lines = [f"{i}\n".encode() for i in range(2000)]
    (here / "bad.jsonl").write_bytes(b"".join([*lines, b'"caf\xe9"\n', b"1\n" * 50]))
    result = invoke("map", "tasks:square", "-i", "bad.jsonl", "-o", "out.jsonl")
    assert result.exit_code == 2, result.output
    assert "Error: bad.jsonl line 2001 is not UTF-8 (byte 0xe9 at byte 5 of the line)" in (
        result.stderr
    )


def test_exit_2_for_a_file_name_that_is_not_utf8(here: Path) -> None:
    (here / "data").mkdir()
    (here / "data" / "a.csv").write_text("row\n")
    (here / "data" / os.fsdecode(b"caf\xe9.csv")).write_text("row\n")
    result = invoke("map", "tasks:count_lines", "--glob", "data/*.csv", "-o", "out.jsonl")
    assert result.exit_code == 2, result.output
    assert "Error: The name of b'data/caf\\xe9.csv' (from --glob) is not UTF-8" in result.stderr
    assert not (here / "out.jsonl").exists()


def test_a_full_disk_while_writing_the_output_file_keeps_the_old_file(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (here / "out.jsonl").write_text("previous results\n")

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    result = invoke(
        "map", "tasks:square", "-i", "items.jsonl", "-o", "out.jsonl", "-b", "sequential"
    )
    assert result.exit_code == 1, result.output
    assert "Error: Cannot write --output out.jsonl: No space left on device." in result.stderr
    assert "--run-dir" in result.stderr  # how to keep the results next time
    assert (here / "out.jsonl").read_text() == "previous results\n"
    assert leftovers(here) == []


def test_exit_1_when_the_run_dir_fills_up_keeps_the_finished_chunks(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paralela.runs import _store

    real_write = _store.atomic_write

    def fills_up(path: Path, data: bytes) -> None:  # room for the first chunk only
        if path.parent.name == "chunks" and any(path.parent.glob("*.pkl")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    monkeypatch.setattr(_store, "atomic_write", fills_up)
    args = ["map", "tasks:square", "-i", "items.jsonl", "-o", "out.jsonl", "-b", "sequential",
            "--chunksize", "1", "--run-dir", "run"]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "Error: Cannot write to --run-dir run: No space left on device." in result.stderr
    assert "Finished chunks are kept in run" in result.stderr
    assert len(list((here / "run" / "chunks").glob("*.pkl"))) == 1
    assert not (here / "out.jsonl").exists()

    monkeypatch.setattr(_store, "atomic_write", real_write)  # space again
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert "(5 computed, 1 resumed)" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tasks", "-i", "items.jsonl"], "Expected MODULE:FUNC, got 'tasks'"),
        (
            ["tasks:nope", "-i", "items.jsonl"],
            "tasks has no attribute 'nope'. Functions defined there: count_lines, cube, dies_on_3",
        ),
        (["tasks:NOT_A_FUNCTION", "-i", "items.jsonl"], "is not a function (it is of type int)"),
        (["missing.py:f", "-i", "items.jsonl"], "No such file: missing.py"),
        (["tasks:square", "-i", "absent.jsonl"], "Input file absent.jsonl does not exist."),
        (
            ["tasks:square", "-i", "items.jsonl", "--backend", "gpu"],
            "Unknown backend 'gpu'; valid backends are: processes, sequential, slurm, threads.",
        ),
        (
            ["tasks:square", "-i", "items.jsonl", "--chunksize", "0"],
            "--chunksize must be 'auto' or a positive integer, got '0'",
        ),
        (
            ["tasks:square", "-i", "items.jsonl", "--chunksize", "lots"],
            "--chunksize must be 'auto' or a positive integer, got 'lots'",
        ),
        (["tasks:square"], "Pass the items: --input FILE"),
        (["tasks:square", "-i", "items.jsonl", "--glob", "*.py"], "not both"),
        (["tasks:square", "--glob", "nothing/*.csv"], "No files match --glob 'nothing/*.csv'"),
    ],
)
def test_exit_2_for_bad_usage(here: Path, args: list[str], message: str) -> None:
    result = invoke("map", *args, "-o", "out.jsonl")
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.startswith("Error: ")
    assert not (here / "out.jsonl").exists()


def test_exit_2_names_the_malformed_line(here: Path) -> None:
    (here / "bad.jsonl").write_text('1\n\n"two"\n{"three": 3\n4\n')
    result = invoke("map", "tasks:square", "-i", "bad.jsonl", "-o", "out.jsonl")
    assert result.exit_code == 2
    assert "bad.jsonl line 4 is not valid JSON" in result.stderr
    assert "Each line must hold one JSON value" in result.stderr


def test_exit_2_for_an_import_error_inside_the_module(here: Path) -> None:
    (here / "needs_torch.py").write_text("import not_installed_pkg\n\ndef f(x):\n    return x\n")
    result = invoke("map", "needs_torch:f", "-i", "items.jsonl", "-o", "out.jsonl")
    assert result.exit_code == 2
    assert "Importing 'needs_torch' failed: No module named 'not_installed_pkg'" in result.stderr
    assert 'needs_torch.py", line 1, in <module>' in result.stderr  # the traceback tail


def test_exit_2_for_an_output_directory_that_does_not_exist(here: Path) -> None:
    result = invoke("map", "tasks:square", "-i", "items.jsonl", "-o", "nowhere/out.jsonl")
    assert result.exit_code == 2
    assert "The directory nowhere for --output does not exist" in result.stderr


def test_workers_below_one_is_a_usage_error(here: Path) -> None:
    result = invoke("map", "tasks:square", "-i", "items.jsonl", "-o", "o.jsonl", "-w", "0")
    assert result.exit_code == 2
    assert "--workers" in result.output


def test_fingerprint_resumes_a_run_dir_after_an_edit_the_user_vouches_for(workdir: Path) -> None:
    args = ("map", "tasks:square", "-i", "items.jsonl", "-o", "out.jsonl", "--run-dir", "run")
    assert paralela(workdir, *args, "--fingerprint", "v1").returncode == 0
    tasks = workdir / "tasks.py"
    edited = tasks.read_text().replace(
        "def square(x):\n    return x * x", "def square(x):\n    return x**2"
    )
    tasks.write_text(edited)
    unvouched = paralela(workdir, *args)
    assert unvouched.returncode == 4, unvouched.stderr  # the edit is seen
    resumed = paralela(workdir, *args, "--fingerprint", "v1")
    assert resumed.returncode == 0, resumed.stderr
    assert "6 resumed" in resumed.stderr
    other = paralela(workdir, *args, "--fingerprint", "v2")
    assert other.returncode == 4, other.stderr
