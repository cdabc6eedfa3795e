"""What runs inside an array task, run here in-process: the task runner and the packed
chunk runner (no cluster needed; tests/test_slurm_map.py runs them under Slurm)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from paralela.backends import dumps
from paralela.backends.slurm._worker import TaskRef, run_task
from paralela.mapping._packed import given_cpus, run_packed
from paralela.runs import RunStore
from paralela.tasks import Job


def add(a: int, b: int) -> int:
    return a + b


def refuse(x: int) -> int:
    raise ValueError(f"no {x}")


def tenfold_but_2(x: int) -> int:
    if x == 2:
        raise KeyError(x)
    return 10 * x


@pytest.fixture
def task_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """run_task sets PARALELA_TASK_DIR and a USR1 handler: both are undone afterwards."""
    monkeypatch.setenv("PARALELA_TASK_DIR", "")
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def job_dir(tmp_path: Path, call: object, refs: dict[int, object] | None = None) -> Path:
    directory = tmp_path / "job"
    for sub in ("calls", "refs", "results"):
        (directory / sub).mkdir(parents=True)
    (directory / "sys_path.json").write_text(json.dumps(sys.path))
    (directory / "calls" / "0.pkl").write_bytes(dumps(call))
    for ref_id, value in (refs or {}).items():
        (directory / "refs" / f"{ref_id}.pkl").write_bytes(dumps(value))
    return directory


def test_a_task_writes_its_result(tmp_path: Path, task_env: None) -> None:
    directory = job_dir(tmp_path, (add, (TaskRef(5), 2), {}), refs={5: 40})
    assert run_task(directory, 0) == 0
    assert pickle.loads((directory / "results" / "0.pkl").read_bytes()) == ("ok", 42)
    assert os.environ["PARALELA_TASK_DIR"] == str(directory / "tasks" / "0")
    assert (directory / "tasks" / "0").is_dir()
    assert not [p for p in (directory / "results").iterdir() if p.name.startswith(".tmp")]


def test_a_task_that_raises_sends_the_exception_back(tmp_path: Path, task_env: None) -> None:
    directory = job_dir(tmp_path, (refuse, (7,), {}))
    assert run_task(directory, 0) == 0
    kind, exc_bytes, tb, type_name, text = pickle.loads(
        (directory / "results" / "0.pkl").read_bytes()
    )
    assert (kind, type_name, text) == ("err", "builtins.ValueError", "no 7")
    assert isinstance(pickle.loads(exc_bytes), ValueError)
    assert "in refuse" in tb


def test_given_cpus() -> None:
    assert given_cpus({}) == 1  # outside Slurm: the task's own process
    assert given_cpus({"SLURM_JOB_ID": "5", "SLURM_CPUS_PER_TASK": "1"}) == 1
    usable = len(os.sched_getaffinity(0))
    assert given_cpus({"SLURM_JOB_ID": "5", "SLURM_CPUS_ON_NODE": "512"}) == usable


def test_a_packed_chunk_is_stored_by_the_task(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run", {"function": "add"}, {})
    job = Job(lambda x: x + 1, None, (), None, False, True)
    outcome = run_packed(job, 10, [1, 2, 3], store)
    assert outcome.results == [2, 3, 4]
    assert outcome.failures == []
    assert outcome.stored
    [record] = store.finished().values()
    assert (record.start, record.end) == (10, 13)
    assert store.load(record).results == [2, 3, 4]
    assert not (tmp_path / "run" / "packed").exists()


def test_failed_items_keep_their_input_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARALELA_TASK_DIR", str(tmp_path / "task"))
    job = Job(tenfold_but_2, None, (), None, False, False)  # on_error="collect"
    outcome = run_packed(job, 100, [0, 1, 2, 3], None)
    assert outcome.results == [0, 10, None, 30]
    [failure] = outcome.failures
    assert failure.index == 102
    assert failure.exc_type == "KeyError"
    assert not outcome.stored
    # Without a run store, finished pieces are kept in the task's own directory, so a
    # requeued task resumes there; pieces with a failed item are not kept.
    kept: set[int] = set()
    for path in (tmp_path / "task" / "map" / "chunks").glob("*.pkl"):
        start, end = (int(p) for p in path.stem.split("-"))
        kept.update(range(start, end))
    assert 0 in kept
    assert 2 not in kept


def test_a_chunk_already_stored_is_not_computed_again(tmp_path: Path) -> None:
    # A task stopped after storing its chunk (a late requeue) runs again: nothing to do.
    store = RunStore(tmp_path / "run", {"function": "add"}, {})
    first = run_packed(Job(lambda x: x + 1, None, (), None, False, True), 0, [1, 2], store)
    assert first.stored
    again = run_packed(Job(refuse, None, (), None, False, True), 0, [1, 2], store)
    assert again.results == [2, 3]
    assert again.failures == []
    assert again.stored
    # Other items in that range are computed (the driver reports the mismatch itself).
    other = run_packed(Job(lambda x: x * 2, None, (), None, False, True), 0, [5, 6], store)
    assert other.results == [10, 12]


def test_pieces_of_finished_chunks_are_removed(tmp_path: Path) -> None:
    from paralela.mapping._packed import remove_finished_pieces

    store = RunStore(tmp_path / "run", {"function": "add"}, {})
    run_packed(Job(lambda x: x, None, (), None, False, True), 0, [1, 2], store)
    # Left behind by tasks stopped after storing chunk 0-2, and by one still at 2-4.
    done = tmp_path / "run" / "packed" / f"{0:012d}-{2:012d}"
    open_piece = tmp_path / "run" / "packed" / f"{2:012d}-{4:012d}"
    for directory in (done, open_piece):
        (directory / "chunks").mkdir(parents=True)
    remove_finished_pieces(store)
    assert not done.exists()
    assert open_piece.exists()
