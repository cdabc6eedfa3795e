"""Faults of a MapReduce job: a worker SIGKILLed in a map or a reduce task, a driver
SIGKILLed in the map or the reduce phase (and resumed from its run directory)."""

from __future__ import annotations

import collections
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.errors import WorkerDiedError

TESTS = Path(__file__).resolve().parent


# -- the jobs --------------------------------------------------------------------------


def _first_time(marker: str) -> bool:
    """True for the one caller that creates ``marker``."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def dies_once_in_map(marker: str, line: str) -> Iterator[tuple[str, int]]:
    if "KILLME" in line and _first_time(marker):
        os.kill(os.getpid(), signal.SIGKILL)
    for word in line.split():
        yield word, 1


def dies_once_in_reduce(marker: str, key: str, values: Iterable[int]) -> int:
    if key == "KILLME" and _first_time(marker):
        os.kill(os.getpid(), signal.SIGKILL)
    return sum(values)


def total(_key: Any, values: Iterable[int]) -> int:
    return sum(values)


def logged_words(line: str) -> Iterator[tuple[str, int]]:
    """Logs each line it maps (one O_APPEND write: whole lines from every process) to
    the file named by MR_TEST_LOG, slowly, so that a test can stop the driver midway."""
    with open(os.environ["MR_TEST_LOG"], "a") as log:
        log.write(line + "\n")
    time.sleep(float(os.environ.get("MR_TEST_MAP_DELAY", "0")))
    for word in line.split():
        yield word, 1


def slow_total(_key: Any, values: Iterable[int]) -> int:
    time.sleep(float(os.environ.get("MR_TEST_REDUCE_DELAY", "0")))
    return sum(values)


# -- corpus ----------------------------------------------------------------------------


def write_corpus(directory: Path, files: int = 3, lines: int = 40) -> collections.Counter[str]:
    directory.mkdir(parents=True, exist_ok=True)
    counts: collections.Counter[str] = collections.Counter()
    for f in range(files):
        rows = [f"f{f} l{i} w{i % 7} w{(i * f) % 5} shared" for i in range(lines)]
        if f == 1:
            rows[10] += " KILLME"
        (directory / f"{f}.txt").write_text("\n".join(rows) + "\n")
        counts.update(w for row in rows for w in row.split())
    return counts


# -- a worker dies ---------------------------------------------------------------------


def test_a_map_worker_killed_mid_task_is_rerun_and_the_answer_is_exact(tmp_path: Path) -> None:
    expected = write_corpus(tmp_path / "corpus")
    marker = tmp_path / "killed"
    result = paralela.mapreduce(
        partial(dies_once_in_map, str(marker)), total, str(tmp_path / "corpus"),
        combiner=total, workers=2, backend="processes",
    )  # fmt: skip
    assert marker.exists()  # the worker did die once
    assert result.to_dict() == dict(expected)
    assert result.summary.retries == 1


def test_a_reduce_worker_killed_mid_task_is_rerun_and_the_answer_is_exact(
    tmp_path: Path,
) -> None:
    expected = write_corpus(tmp_path / "corpus")
    marker = tmp_path / "killed"
    result = paralela.mapreduce(
        lambda line: [(w, 1) for w in line.split()], partial(dies_once_in_reduce, str(marker)),
        str(tmp_path / "corpus"), workers=2, backend="processes",
    )  # fmt: skip
    assert marker.exists()
    assert result.to_dict() == dict(expected)
    assert result.summary.retries == 1


def always_dies_on_killme(line: str) -> list[tuple[str, int]]:
    if "KILLME" in line:
        os.kill(os.getpid(), signal.SIGKILL)
    return [(w, 1) for w in line.split()]


def test_a_task_whose_worker_always_dies_ends_in_worker_died_error(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus")
    with pytest.raises(WorkerDiedError) as info:
        paralela.mapreduce(always_dies_on_killme, total, str(tmp_path / "corpus" / "1.txt"),
                           workers=2, backend="processes", retries=1)  # fmt: skip
    assert info.value.attempts == 2
    assert "killed by SIGKILL" in str(info.value)
    notes = getattr(info.value, "__notes__", [])
    assert any("an item here is a map task (item N: split N)" in note for note in notes)


# -- the driver dies -------------------------------------------------------------------

DRIVER = """
import json, sys
sys.path.insert(0, {tests!r})
import paralela
from test_mapreduce_faults import logged_words, slow_total, total
result = paralela.mapreduce(
    logged_words, slow_total, {corpus!r}, combiner=total, workers=2, backend="processes",
    run_dir={run_dir!r}, split_bytes=512, partitions=6, progress=False,
)
print(json.dumps({{"counts": result.to_dict(), "summary": result.summary.to_dict()}}))
"""


def _driver(tmp_path: Path, log: Path, **delays: str) -> subprocess.Popen[str]:
    code = DRIVER.format(
        tests=str(TESTS), corpus=str(tmp_path / "corpus"), run_dir=str(tmp_path / "run")
    )
    env = {**os.environ, "MR_TEST_LOG": str(log), **delays}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the driver ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within 60 s")
        time.sleep(0.02)


def _stored_records(chunks: Path) -> tuple[int, int]:
    """Map tasks recorded in a run directory's map store, and their records."""
    files = sorted(chunks.glob("*.pkl"))
    records = 0
    for path in files:
        with open(path, "rb") as f:
            records += sum(r.records for r in pickle.load(f).results)
    return len(files), records


@pytest.mark.parametrize("phase", ["map", "reduce"])
def test_a_killed_driver_resumes_and_redoes_only_unfinished_tasks(
    tmp_path: Path, phase: str
) -> None:
    expected = write_corpus(tmp_path / "corpus", files=3, lines=60)
    chunks = tmp_path / "run" / phase / "chunks"
    delay = {"MR_TEST_MAP_DELAY": "0.01"} if phase == "map" else {"MR_TEST_REDUCE_DELAY": "0.05"}
    first = _driver(tmp_path, tmp_path / "first.log", **delay)
    try:
        _wait_for(lambda: len(list(chunks.glob("*.pkl"))) >= 2, first, f"2 {phase} tasks")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its workers, at once
        first.communicate(timeout=30)
    recorded, recorded_records = _stored_records(tmp_path / "run" / "map" / "chunks")
    reduced = len(list((tmp_path / "run" / "reduce" / "chunks").glob("*.pkl")))

    second = _driver(tmp_path, tmp_path / "second.log")
    out, err = second.communicate(timeout=90)
    assert second.returncode == 0, err
    report = json.loads(out)
    assert report["counts"] == dict(expected)
    summary = report["summary"]
    total_lines = 3 * 60
    assert summary["map_tasks_reused"] == recorded
    assert summary["reduce_tasks_reused"] == reduced
    assert summary["records"] == total_lines
    # The resumed run mapped exactly the lines of the tasks that were not recorded.
    log = tmp_path / "second.log"
    again = log.read_text().splitlines() if log.exists() else []
    assert len(again) == total_lines - recorded_records
    if phase == "map":
        assert 2 <= recorded < summary["map_tasks"]
    else:
        assert recorded == summary["map_tasks"]  # the map phase was over: nothing re-mapped
        assert again == []
        assert 2 <= reduced < summary["reduce_tasks"]
