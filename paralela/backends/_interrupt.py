"""Telling a real Ctrl-C (or SIGTERM) from a ``KeyboardInterrupt`` that user code raised.

A function mapped by paralela may raise ``KeyboardInterrupt`` itself; that is a failure
of its item, not a request to stop. Only a task running in the main thread can be hit
by a real Ctrl-C (worker processes ignore SIGINT and SIGTERM, worker threads never get
them), so the in-process backends run such a task under :func:`marking_sigint`, which
notes a real SIGINT before raising ``KeyboardInterrupt`` as Python's default handler
does. :func:`sigterm_as_interrupt` makes SIGTERM (``scancel``, a Slurm time limit or
preemption, a supervisor) one more such interrupt, noted the same way, raised as
:class:`Terminated` (a ``KeyboardInterrupt``, so that every Ctrl-C path stops on it
too, and the CLI can tell it apart: exit 143, not 130).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "marking_sigint", "real_interrupt", "sigterm_as_interrupt"]

_seen = threading.Event()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as a ``KeyboardInterrupt``: what stops work on
    Ctrl-C stops it on SIGTERM too (a shell reports such an exit as 143, not 130)."""


def _mark_and_interrupt(signum: int, frame: FrameType | None) -> None:
    _seen.set()
    raise KeyboardInterrupt


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    import signal

    _seen.set()
    raise Terminated(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def marking_sigint() -> Iterator[None]:
    """Run the block with a SIGINT handler that records a real Ctrl-C (main thread,
    and only while Python's default handler, or this one, is installed: SIGINT that
    was ignored stays ignored; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal  # here: a worker imports this module, and signal.py's enums cost it ~1.5 ms

    current = signal.getsignal(signal.SIGINT)
    if current is _mark_and_interrupt:  # an outer block (the CLI) already marks
        _seen.clear()
        yield
        return
    if current is not signal.default_int_handler:
        yield
        return
    _seen.clear()
    previous = signal.signal(signal.SIGINT, _mark_and_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def real_interrupt() -> bool:
    """Whether the ``KeyboardInterrupt`` being handled came from a real Ctrl-C or a
    SIGTERM turned into one by :func:`sigterm_as_interrupt`."""
    return _seen.is_set() and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (scancel, a Slurm time limit or preemption, a supervisor) stops the work
    (ranks, trials, a map, a job) as Ctrl-C does.

    Raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread on SIGTERM
    while the block runs, noted as real (:func:`real_interrupt`); elsewhere than in the
    main thread it does nothing (signals reach only that one).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal

    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
