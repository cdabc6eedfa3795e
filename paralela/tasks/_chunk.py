"""What runs inside a worker for ``map``: one chunk of items through the user's function."""

from __future__ import annotations

import _pickle as pickle  # the C pickler: pickle.py imports re (see backends._wire)
import os
import threading
import time
from collections.abc import Callable, Sequence

from paralela.backends import real_interrupt
from paralela.tasks._failure import exception_bytes

# Neither typing nor dataclasses (nor socket) is imported at run time: every worker
# imports this module before its first task (bench/bench_map.py workload d), so the two
# records below are written out by hand, with what @dataclass(frozen=True) gave them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["HOST", "ChunkOutcome", "ItemFailure", "Job", "run_chunk", "short_repr"]

#: This machine's name, as a chunk's outcome reports where it ran.
HOST = os.uname().nodename if hasattr(os, "uname") else __import__("socket").gethostname()


class _Frozen:
    """Fields set once, in ``__init__``; compared, hashed and shown as a dataclass's."""

    __slots__ = ()
    _compared: tuple[str, ...] = ()  # compared, hashed and shown
    _init: tuple[str, ...] = ()  # __init__'s parameters, in order

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (as ``dataclasses.replace``)."""
        return type(self)(**{name: changes.pop(name, getattr(self, name)) for name in self._init})

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{type(self).__qualname__}({shown})"


def short_repr(obj: Any, limit: int = 120) -> str:
    """``repr`` cut to ``limit`` characters, never raising."""
    try:
        text = repr(obj)
    except Exception as exc:  # a broken __repr__ must not hide the real error
        text = f"<{type(obj).__name__} object; repr failed: {exc}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ItemFailure(_Frozen):
    """An exception raised by the user's function on one item, as seen in the worker.

    ``exception`` is the exception itself: the very object on in-process backends, a
    copy rebuilt from its pickle on process backends, or ``None`` when it cannot be
    pickled or rebuilt (then only its type name, message and traceback text travel).
    It is neither compared nor shown.
    """

    __slots__ = ("exc_type", "exception", "index", "item_repr", "message", "traceback")
    _compared = ("index", "exc_type", "message", "item_repr", "traceback")
    _init = (*_compared, "exception")

    index: int
    exc_type: str
    message: str
    item_repr: str
    traceback: str
    exception: BaseException | None

    def __init__(
        self,
        index: int,
        exc_type: str,
        message: str,
        item_repr: str,
        traceback: str,
        exception: BaseException | None = None,
    ) -> None:
        put = object.__setattr__
        put(self, "index", index)
        put(self, "exc_type", exc_type)
        put(self, "message", message)
        put(self, "item_repr", item_repr)
        put(self, "traceback", traceback)
        put(self, "exception", exception)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_failure,
            (
                self.index,
                self.exc_type,
                self.message,
                self.item_repr,
                self.traceback,
                _exception_bytes(self.exception),
            ),
        )


def _exception_bytes(exc: BaseException | None) -> bytes | None:
    """The pickle of ``exc`` (by the backends' pickler) when it can be rebuilt from it."""
    from paralela.backends import dumps

    return exception_bytes(exc, dumps)


def _rebuild_failure(
    index: int, exc_type: str, message: str, item_repr: str, tb: str, data: bytes | None
) -> ItemFailure:
    exception: BaseException | None = None
    if data is not None:
        try:
            exception = pickle.loads(data)
        except BaseException:  # its class may not import in this process
            exception = None
    return ItemFailure(index, exc_type, message, item_repr, tb, exception)


class ChunkOutcome(_Frozen):
    """The results of one chunk, with where and when it ran.

    ``stored`` is true when the worker already wrote the chunk to the run store (packed
    chunks on a cluster do, so that they count even if the driver is gone).
    """

    _compared = (
        "results", "failures", "started", "finished", "pid", "host", "thread", "stored",
        "first_index",
    )  # fmt: skip
    __slots__ = _init = _compared

    results: list[Any]
    failures: list[ItemFailure]
    started: float
    finished: float
    pid: int
    host: str
    thread: int
    stored: bool
    first_index: int  # the input position of ``results[0]``

    def __init__(
        self,
        results: list[Any],
        failures: list[ItemFailure],
        started: float,
        finished: float,
        pid: int,
        host: str,
        thread: int,
        stored: bool = False,
        first_index: int = 0,
    ) -> None:
        for name, value in zip(
            self._compared,
            (results, failures, started, finished, pid, host, thread, stored, first_index),
            strict=True,
        ):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChunkOutcome, self._key())

    def __paralela_unpicklable__(self, error: Exception) -> ChunkOutcome:
        """The outcome to send when this one cannot be pickled (the worker asks): each
        result that cannot be pickled becomes a failure of its item, naming it."""
        from paralela.backends import dumps

        results = list(self.results)
        failures = list(self.failures)
        for offset, result in enumerate(results):
            try:
                dumps(result)
            except Exception as exc:
                index = self.first_index + offset
                message = (
                    f"the result of item {index} ({short_repr(result)}) cannot be sent back "
                    f"from the worker: {type(exc).__name__}: {exc}. Return plain data "
                    "(numbers, strings, lists, dicts, arrays), or use backend='threads'."
                )
                failures.append(
                    ItemFailure(index, "UnpicklableResult", message, short_repr(result), message)
                )
                results[offset] = None
        failures.sort(key=lambda f: f.index)
        return ChunkOutcome(results, failures, *self._key()[2:])


class Job:
    """Everything a chunk needs besides its items; sent once per worker (a Broadcast).

    The initializer runs once per worker: once per process, or once per thread for the
    threads backend.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        initializer: Callable[..., Any] | None,
        initargs: tuple[Any, ...],
        shared: Any,
        has_shared: bool,
        stop_at_first_error: bool,
    ) -> None:
        self.fn = fn
        self.initializer = initializer
        self.initargs = initargs
        self.shared = shared
        self.has_shared = has_shared
        self.stop_at_first_error = stop_at_first_error
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def ensure_initialized(self) -> None:
        if self.initializer is not None and not getattr(self._local, "done", False):
            self.initializer(*self.initargs)
            self._local.done = True


def _failure(index: int, item: Any, exc: BaseException) -> ItemFailure:
    import traceback  # only on failure: workers start without it

    return ItemFailure(
        index=index,
        exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        message=str(exc),
        item_repr=short_repr(item),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        exception=exc,
    )


def run_chunk(job: Job, start: int, items: Sequence[Any]) -> ChunkOutcome:
    """Apply ``job.fn`` to ``items`` (input positions ``start``, ``start + 1``...).

    An exception is caught per item, ``KeyboardInterrupt`` and ``SystemExit`` raised by
    the function included (they are that item's failure, not a Ctrl-C or an exit of the
    worker): the chunk stops there when the run stops at the first error, else it goes
    on with the next item. The initializer's own exception propagates (the whole chunk
    fails).
    """
    job.ensure_initialized()
    fn = job.fn
    shared = job.shared
    results: list[Any] = []
    failures: list[ItemFailure] = []
    append = results.append
    started = time.time()
    position = 0
    while position < len(items):
        try:
            # The loop sits inside one try: exceptions cost nothing until one is raised.
            if not job.has_shared:
                for item in items[position:] if position else items:
                    append(fn(item))
            else:
                for item in items[position:] if position else items:
                    append(fn(item, shared))
            break
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and real_interrupt():
                raise  # a real Ctrl-C (sequential backend, main thread) stops the map
            offset = len(results)
            failures.append(_failure(start + offset, items[offset], exc))
            append(None)
            if job.stop_at_first_error:
                break
            position = offset + 1
    finished = time.time()
    return ChunkOutcome(
        results,
        failures,
        started,
        finished,
        os.getpid(),
        HOST,
        threading.get_ident(),
        first_index=start,
    )
