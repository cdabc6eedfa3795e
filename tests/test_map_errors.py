"""Failures in ``map``: the user's exception with its item and remote traceback, collected
failures, and bad input refused before any work starts."""

from __future__ import annotations

import functools
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

import paralela
from paralela.backends import RemoteTraceback
from paralela.errors import ConfigError, MapError, TaskError, UnpicklableError

BACKENDS = ["sequential", "threads", "processes"]


def fail_on_13(x: int) -> int:
    if x == 13:
        raise ValueError(f"thirteen is unlucky ({x})")
    return x * 2


def fail_on_multiples_of_7(x: int) -> int:
    if x % 7 == 0:
        raise KeyError(x)
    return x + 1


def touch(marker: str, x: object) -> object:
    """Leaves a trace of any work: the file exists once an item ran."""
    with open(marker, "a") as f:
        f.write(f"{x!r}\n")
    return x


def exit_on_3(x: int) -> int:
    if x == 3:
        sys.exit(5)
    return x


def drain(iterator: Iterator[int | None], into: list[int | None]) -> None:
    for value in iterator:
        into.append(value)


def failing_initializer(message: str) -> None:
    raise RuntimeError(message)


def fail_with_long_item(x: str) -> None:
    raise ValueError("no")


@pytest.mark.parametrize("backend", BACKENDS)
def test_exception_in_fn_is_reraised_as_its_own_type_with_item_and_traceback(
    backend: str,
) -> None:
    with pytest.raises(ValueError, match=r"thirteen is unlucky \(13\)") as info:
        paralela.map(fail_on_13, range(40), backend=backend, workers=2, chunksize=4)
    exc = info.value
    assert type(exc) is ValueError  # `except ValueError` works, as with Pool and joblib
    assert exc.paralela_index == 13  # type: ignore[attr-defined]
    assert exc.paralela_item_repr == "13"  # type: ignore[attr-defined]
    assert "paralela: raised by fn on item 13 (13)" in getattr(exc, "__notes__", [])
    if backend == "processes":
        cause = exc.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "Traceback (most recent call last)" in cause.tb
        assert "fail_on_13" in cause.tb
        assert "ValueError: thirteen is unlucky (13)" in cause.tb
    else:  # the very exception object, with its own traceback
        assert "fail_on_13" in "".join(traceback.format_tb(exc.__traceback__))


class Unrebuildable(Exception):
    """Pickles, but cannot be rebuilt: __init__ takes two arguments, args holds one."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def raise_unrebuildable(x: int) -> int:
    if x == 2:
        raise Unrebuildable(x, 0)
    return x


def test_an_exception_that_cannot_be_rebuilt_is_a_task_error() -> None:
    with pytest.raises(TaskError) as info:
        paralela.map(raise_unrebuildable, range(5), workers=2, chunksize=1)
    exc = info.value
    assert exc.index == 2
    assert exc.exc_type.endswith("Unrebuildable")
    assert exc.exception is None
    assert "Unrebuildable: 2/0" in exc.remote_traceback


def test_a_long_item_is_shown_short() -> None:
    with pytest.raises(ValueError, match="no") as info:
        paralela.map(fail_with_long_item, ["x" * 10_000], workers=2)
    shown = info.value.paralela_item_repr  # type: ignore[attr-defined]
    assert len(shown) <= 120
    assert shown.endswith("...")


def test_system_exit_in_fn_is_a_failure_not_a_dead_worker() -> None:
    with pytest.raises(TaskError) as info:
        paralela.map(exit_on_3, range(6), workers=2, chunksize=1)
    assert info.value.index == 3
    assert info.value.exc_type == "SystemExit"


@pytest.mark.parametrize("backend", BACKENDS)
def test_collect_raises_map_error_with_every_failure_and_the_results(backend: str) -> None:
    with pytest.raises(MapError) as info:
        paralela.map(
            fail_on_multiples_of_7,
            range(50),
            backend=backend,
            workers=2,
            chunksize=3,
            on_error="collect",
        )
    exc = info.value
    failing = [x for x in range(50) if x % 7 == 0]
    assert [f.index for f in exc.failures] == failing
    assert all(f.exc_type == "KeyError" for f in exc.failures)
    assert all(isinstance(f, TaskError) for f in exc.failures)
    assert exc.results == [None if x % 7 == 0 else x + 1 for x in range(50)]
    assert str(exc).startswith(f"{len(failing)} of 50 items failed; the first one:")


def test_collect_with_imap_yields_none_then_raises() -> None:
    got: list[int | None] = []
    iterator = paralela.imap(
        fail_on_multiples_of_7, range(20), workers=2, chunksize=3, on_error="collect"
    )
    with pytest.raises(MapError) as info:
        drain(iterator, got)
    assert got == [None if x % 7 == 0 else x + 1 for x in range(20)]
    assert [f.index for f in info.value.failures] == [0, 7, 14]


def test_an_initializer_that_raises_fails_the_map_with_its_traceback() -> None:
    with pytest.raises(TaskError, match="in the initializer") as info:
        paralela.map(
            abs,
            range(10),
            workers=2,
            initializer=failing_initializer,
            initargs=("no model file",),
        )
    assert info.value.index is None
    assert "no model file" in str(info.value)
    assert "failing_initializer" in info.value.remote_traceback


# -- refused before any work starts --------------------------------------------------


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "something-ran"


def test_unpicklable_function_is_refused_before_work(marker: Path) -> None:
    lock = threading.Lock()

    def fn(x: int) -> int:
        with lock:
            touch(str(marker), x)
        return x

    with pytest.raises(UnpicklableError, match=r"The function \(.*fn\) cannot be sent") as info:
        paralela.imap(fn, range(10), workers=2)  # refused when called, not when iterated
    assert "backend='threads'" in str(info.value)
    assert isinstance(info.value, ConfigError)
    assert not marker.exists()
    # the same function is fine where nothing is pickled
    assert paralela.map(fn, range(3), backend="threads") == [0, 1, 2]
    assert marker.exists()


def test_unpicklable_first_item_is_refused_before_work(marker: Path) -> None:
    items = [threading.Lock(), 1, 2]
    with pytest.raises(UnpicklableError, match=r"Item 0 \(<unlocked _thread\.lock"):
        paralela.map(functools.partial(touch, str(marker)), items, workers=2)
    assert not marker.exists()


def test_unpicklable_item_is_named_by_its_index(marker: Path) -> None:
    items = [0, 1, 2, 3, threading.Lock(), 5]
    with pytest.raises(UnpicklableError, match=r"Item 4 \(<unlocked _thread\.lock.*\) cannot"):
        paralela.map(functools.partial(touch, str(marker)), items, workers=2, chunksize=1)
    ran = marker.read_text().split() if marker.exists() else []
    assert "5" not in ran  # nothing after the bad item was sent


def test_unpicklable_shared_is_refused_before_work(marker: Path) -> None:
    with pytest.raises(UnpicklableError, match=r"The shared object \(lock\) cannot be sent"):
        paralela.map(
            lambda x, s: touch(str(marker), x), range(5), workers=2, shared=threading.Lock()
        )
    assert not marker.exists()


def test_unpicklable_initializer_arguments_are_refused_before_work(marker: Path) -> None:
    with pytest.raises(UnpicklableError, match="initializer arguments"):
        paralela.map(
            functools.partial(touch, str(marker)),
            range(5),
            workers=2,
            initializer=print,
            initargs=(threading.Lock(),),
        )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunksize": 0}, "chunksize must be 'auto' or a positive integer, got 0"),
        ({"chunksize": -1}, "chunksize must be 'auto' or a positive integer, got -1"),
        ({"chunksize": 1.5}, "chunksize must be 'auto' or a positive integer, got 1.5"),
        ({"chunksize": "big"}, "chunksize must be 'auto' or a positive integer, got 'big'"),
        ({"backend": "spark"}, "Unknown backend 'spark'; valid backends are: "),
        ({"on_error": "ignore"}, "on_error must be 'raise' or 'collect', got 'ignore'"),
        ({"retries": -1}, "retries must be a non-negative integer, got -1"),
        ({"retries": 1.5}, "retries must be a non-negative integer, got 1.5"),
        ({"retries": "2"}, "retries must be a non-negative integer, got '2'"),
        ({"retries": True}, "retries must be a non-negative integer, got True"),
        ({"workers": 0}, "workers must be a positive integer or None, got 0"),
        ({"workers": "4"}, "workers must be a positive integer or None, got '4'"),
        ({"initializer": "setup"}, "initializer must be callable, got str"),
    ],
)
def test_bad_options_are_config_errors_before_work(
    marker: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        paralela.map(functools.partial(touch, str(marker)), range(5), **options)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert not marker.exists()


def test_unknown_backend_lists_every_valid_name() -> None:
    with pytest.raises(ConfigError) as info:
        paralela.map(abs, [1], backend="spark")
    for name in ("processes", "sequential", "threads"):
        assert name in str(info.value)


def test_not_callable_and_not_iterable_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="fn must be callable, got int"):
        paralela.map(42, range(3), backend="sequential")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"items must be iterable .* got int"):
        paralela.map(abs, 42, backend="sequential")  # type: ignore[arg-type]
