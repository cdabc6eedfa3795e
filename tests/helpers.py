"""Small helpers shared by several test modules."""

from __future__ import annotations

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
