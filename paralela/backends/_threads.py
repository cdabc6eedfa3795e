"""The threads backend: a thread pool, for I/O-bound work or code that releases the GIL."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from paralela.backends._base import Backend, Capabilities, unwrap_broadcasts
from paralela.backends._context import worker_context
from paralela.errors import ConfigError

__all__ = ["ThreadBackend"]

R = TypeVar("R")


class ThreadBackend(Backend):
    """A :class:`~concurrent.futures.ThreadPoolExecutor` behind the backend interface.

    Threads share the caller's memory: nothing is pickled and arrays are never copied,
    but pure-Python work holds the GIL and does not run faster.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        name="threads",
        isolated=False,
        needs_pickling=False,
        retries_dead_workers=False,
        zero_copy_buffers=True,
        debuggable=False,
        supports_gpus=False,
    )

    def __init__(self, workers: int | None = None) -> None:
        n = workers if workers is not None else (os.cpu_count() or 1)
        if n < 1:
            raise ConfigError(f"workers must be at least 1, got {n}.")
        self._workers = n
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="paralela")

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return self._pool.submit(_in_worker, fn, unwrap_broadcasts(args), kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def effective_workers(self) -> int:
        return self._workers


def _in_worker(fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    # A map inside this task runs within the thread's share (one CPU), never on this pool.
    with worker_context(1):
        return fn(*args, **kwargs)
