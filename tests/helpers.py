"""Small helpers shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator


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
