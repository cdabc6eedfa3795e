"""Small helpers shared by several test modules."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import psutil


class CountingItems:
    """``n`` items from a generator that counts how many it produced, to see how far
    ahead of the consumer a map reads its input."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.produced = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.produced += 1
            yield i


def children_running(text: str) -> list[psutil.Process]:
    """This process's live descendants whose command line contains ``text`` (processes
    that exited but are not reaped yet, zombies, are left out)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if text in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def default_sigint() -> None:
    """``preexec_fn`` for a child process that a test stops with SIGINT (Ctrl-C): its
    default disposition, so that its Python installs the Ctrl-C handler. A test run
    started with SIGINT ignored (``nohup``, ``cmd &`` in a script, some CI runners)
    passes SIG_IGN on through ``exec``, and the child would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
