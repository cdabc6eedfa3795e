"""The sequential backend: a plain loop in the calling thread, where ``pdb`` works."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

from paralela.backends._base import Backend, Capabilities, unwrap_broadcasts
from paralela.backends._context import worker_context
from paralela.backends._interrupt import marking_sigint, real_interrupt

__all__ = ["SequentialBackend"]

R = TypeVar("R")


class SequentialBackend(Backend):
    """Runs each task at once, inside :meth:`submit`; the future is already done.

    An exception in the task is stored in the future (as with every backend), so a
    debugger's post-mortem (``pdb.pm()`` after ``result()`` re-raises) sees the frames.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        name="sequential",
        isolated=False,
        needs_pickling=False,
        retries_dead_workers=False,
        zero_copy_buffers=True,
        debuggable=True,
        supports_gpus=False,
    )

    def __init__(self, workers: int | None = None) -> None:
        self._closed = False

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        if self._closed:
            raise RuntimeError("This sequential backend was shut down; create a new one.")
        future: Future[R] = Future()
        future.set_running_or_notify_cancel()
        try:
            with marking_sigint(), worker_context(1):
                future.set_result(fn(*unwrap_broadcasts(args), **kwargs))
        except BaseException as exc:  # the future carries it, as in every backend
            if isinstance(exc, KeyboardInterrupt) and real_interrupt():
                raise  # a real Ctrl-C stops the caller
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True

    def effective_workers(self) -> int:
        return 1
