"""Error messages say what happened and what to do; errors survive pickling."""

from __future__ import annotations

import pickle
import signal

import pytest

from paralela import errors
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    MapError,
    MissingExtraError,
    ParalelaError,
    RunStoreError,
    TaskError,
    UnpicklableError,
    WorkerDiedError,
    describe_exit,
)


def make_task_error(index: int | None = 13) -> TaskError:
    return TaskError(
        "bad value 13",
        index=index,
        item_repr="13",
        remote_traceback='Traceback (most recent call last):\n  File "job.py", line 3\n',
        exc_type="ValueError",
    )


@pytest.mark.parametrize(
    ("exitcode", "words"),
    [
        (-signal.SIGKILL, ["killed by SIGKILL", "out-of-memory", "kill -9"]),
        (-signal.SIGSEGV, ["killed by SIGSEGV", "compiled code"]),
        (-signal.SIGTERM, ["killed by SIGTERM"]),
        (3, ["exit code 3"]),
        (0, ["exit code 0"]),
        (None, ["still running"]),
        (-200, ["killed by signal 200"]),
    ],
)
def test_describe_exit_names_the_signal_or_exit_code(
    exitcode: int | None, words: list[str]
) -> None:
    text = describe_exit(exitcode)
    for word in words:
        assert word in text


def test_worker_died_error_says_how_which_items_and_what_to_do() -> None:
    exc = WorkerDiedError(-signal.SIGKILL, indices=range(4, 8), attempts=3, pid=4242)
    text = str(exc)
    assert "worker (pid 4242) died while running items 4..7" in text
    assert "killed by SIGKILL" in text
    assert "tried 3 time(s)" in text
    assert "retries=" in text
    assert exc.exitcode == -signal.SIGKILL
    assert exc.indices == [4, 5, 6, 7]
    assert exc.attempts == 3
    assert exc.pid == 4242


def test_worker_died_error_for_one_item_and_for_an_exit_code() -> None:
    text = str(WorkerDiedError(3, indices=[9]))
    assert "while running item 9:" in text
    assert "exit code 3" in text
    assert "pid" not in text


def test_task_error_shows_type_item_and_remote_traceback() -> None:
    text = str(make_task_error())
    assert text.startswith("ValueError in item 13 (13): bad value 13")
    assert "Remote traceback:" in text
    assert 'File "job.py", line 3' in text


def test_task_error_without_an_index_speaks_of_a_task() -> None:
    assert "ValueError in a task: bad value 13" in str(make_task_error(index=None))


def test_task_error_pickles_round_trip() -> None:
    original = make_task_error()
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is TaskError
    assert (copy.index, copy.item_repr, copy.remote_traceback, copy.exc_type) == (
        original.index,
        original.item_repr,
        original.remote_traceback,
        original.exc_type,
    )
    assert str(copy) == str(original)


def test_map_error_counts_failures_and_shows_the_first() -> None:
    failures = [make_task_error(1), make_task_error(3)]
    exc = MapError(failures, [0, None, 2, None, 4])
    assert str(exc).startswith("2 of 5 items failed; the first one:\nValueError in item 1")
    assert exc.failures == failures
    assert exc.results == [0, None, 2, None, 4]


def test_missing_extra_names_the_extra_to_install() -> None:
    exc = MissingExtraError("torch", "torch", "paralela launch")
    assert isinstance(exc, ImportError)
    assert "paralela launch needs the Python package 'torch'" in str(exc)
    assert "pip install 'paralela[torch]'" in str(exc)
    assert (exc.module, exc.extra) == ("torch", "torch")


def test_hierarchy() -> None:
    for cls in (
        ConfigError,
        UnpicklableError,
        TaskError,
        MapError,
        WorkerDiedError,
        RunStoreError,
        FingerprintMismatchError,
        MissingExtraError,
    ):
        assert issubclass(cls, ParalelaError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(UnpicklableError, ConfigError)
    assert issubclass(FingerprintMismatchError, RunStoreError)
    assert issubclass(MissingExtraError, ImportError)


def test_every_error_is_drawn_in_the_module_docstring() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        if name[0].isupper():
            assert name in doc, f"{name} is missing from the hierarchy in paralela/errors.py"


def test_worker_died_and_map_errors_pickle_round_trip() -> None:
    died = WorkerDiedError(-9, indices=[4, 5], attempts=3, pid=77)
    copy = pickle.loads(pickle.dumps(died))
    assert (copy.exitcode, copy.indices, copy.attempts, copy.pid) == (-9, [4, 5], 3, 77)
    assert str(copy) == str(died)
    failure = TaskError("bad", index=1, item_repr="1", remote_traceback="tb", exc_type="E")
    collected = pickle.loads(pickle.dumps(MapError([failure], [0, None])))
    assert collected.results == [0, None]
    assert collected.failures[0].index == 1
    assert str(collected) == str(MapError([failure], [0, None]))


def test_unpicklable_error_is_caught_as_pickle_picklingerror() -> None:
    """Code written for multiprocessing.Pool catches pickle.PicklingError."""
    import threading

    import paralela

    assert issubclass(UnpicklableError, pickle.PicklingError)
    with pytest.raises(pickle.PicklingError, match="cannot be sent to a worker process"):
        paralela.map(abs, [threading.Lock()], backend="processes", workers=1)
