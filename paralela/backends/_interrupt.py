"""Telling a real Ctrl-C from a ``KeyboardInterrupt`` that user code raised.

A function mapped by paralela may raise ``KeyboardInterrupt`` itself; that is a failure
of its item, not a request to stop. Only a task running in the main thread can be hit
by a real Ctrl-C (worker processes ignore SIGINT, worker threads never get it), so the
in-process backends run such a task under :func:`marking_sigint`, which notes a real
SIGINT before raising ``KeyboardInterrupt`` as Python's default handler does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["marking_sigint", "real_interrupt", "sigterm_as_interrupt"]

_seen = threading.Event()


def _mark_and_interrupt(signum: int, frame: FrameType | None) -> None:
    _seen.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def marking_sigint() -> Iterator[None]:
    """Run the block with a SIGINT handler that records a real Ctrl-C (main thread,
    and only while Python's default handler is installed; elsewhere a no-op)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _seen.clear()
    previous = signal.signal(signal.SIGINT, _mark_and_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def real_interrupt() -> bool:
    """Whether the ``KeyboardInterrupt`` being handled came from a real Ctrl-C."""
    return _seen.is_set() and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (scancel, a supervisor) stops the work (ranks, trials, a job) as Ctrl-C does.

    Raises ``KeyboardInterrupt`` in the main thread on SIGTERM while the block runs;
    elsewhere than in the main thread it does nothing (signals reach only that one).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
