"""What runs inside a worker for ``map``: one chunk of items through the user's function."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from paralela.backends import real_interrupt
from paralela.tasks._failure import exception_bytes

__all__ = ["HOST", "ChunkOutcome", "ItemFailure", "Job", "run_chunk", "short_repr"]

#: This machine's name, as a chunk's outcome reports where it ran.
HOST = socket.gethostname()


def short_repr(obj: Any, limit: int = 120) -> str:
    """``repr`` cut to ``limit`` characters, never raising."""
    try:
        text = repr(obj)
    except Exception as exc:  # a broken __repr__ must not hide the real error
        text = f"<{type(obj).__name__} object; repr failed: {exc}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ItemFailure:
    """An exception raised by the user's function on one item, as seen in the worker.

    ``exception`` is the exception itself: the very object on in-process backends, a
    copy rebuilt from its pickle on process backends, or ``None`` when it cannot be
    pickled or rebuilt (then only its type name, message and traceback text travel).
    """

    index: int
    exc_type: str
    message: str
    item_repr: str
    traceback: str
    exception: BaseException | None = field(default=None, compare=False, repr=False)

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


@dataclass(frozen=True)
class ChunkOutcome:
    """The results of one chunk, with where and when it ran.

    ``stored`` is true when the worker already wrote the chunk to the run store (packed
    chunks on a cluster do, so that they count even if the driver is gone).
    """

    results: list[Any]
    failures: list[ItemFailure]
    started: float
    finished: float
    pid: int
    host: str
    thread: int
    stored: bool = False
    first_index: int = 0  # the input position of ``results[0]``

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
        return replace(self, results=results, failures=failures)


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
