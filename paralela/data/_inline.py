"""The stages of a pipeline that run in the consumer's thread: the source, ``filter``,
``shuffle``, ``batch``, ``take``, ``repeat`` and ``cache``. Each is a plain iterator step;
the time it takes counts as its own busy time. (``cache`` is in ``_cache.py``.)"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from paralela.data._parallel import _END, Stage, failed
from paralela.data._stats import StageStats

__all__ = ["Batch", "Filter", "Repeat", "Shuffle", "Source", "Take", "default_collate"]


class Source(Stage):
    """The elements of an iterable (made anew for each run of the pipeline)."""

    def __init__(self, stats: StageStats, make: Callable[[], Iterable[Any]]) -> None:
        super().__init__(None, stats)
        self.iterator: Iterator[Any] = iter(make())

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            element = next(self.iterator)
        finally:
            self.stats.busy_seconds += time.perf_counter() - started
        self.stats.elements += 1
        return element

    def close(self) -> None:
        close = getattr(self.iterator, "close", None)
        if callable(close):  # a generator: run its finally blocks now
            close()


class Filter(Stage):
    def __init__(self, upstream: Stage, stats: StageStats, predicate: Callable[[Any], Any]):
        super().__init__(upstream, stats)
        self.predicate = predicate
        self.position = 0

    def __next__(self) -> Any:
        while True:
            element = self.pull()
            if element is _END:
                raise StopIteration
            position, self.position = self.position, self.position + 1
            try:
                keep = self.predicate(element)
            except BaseException as exc:
                raise failed(exc, self.stats, position) from None
            if keep:
                self.stats.elements += 1
                return element


class Shuffle(Stage):
    """A buffer of ``size`` elements; each output is a random one of them, replaced by
    the next input (tf.data's shuffle). Seeded: the same order for the same seed (the
    pipeline's shuffle step gives each epoch and pass a seed of its own)."""

    def __init__(self, upstream: Stage, stats: StageStats, size: int, seed: str | None):
        super().__init__(upstream, stats)
        self.size = size
        self.random = random.Random(seed)
        self.buffer: list[Any] = []
        self.exhausted = False

    def __next__(self) -> Any:
        while not self.exhausted and len(self.buffer) < self.size:
            element = self.pull()
            if element is _END:
                self.exhausted = True
            else:
                self.buffer.append(element)
        if not self.buffer:
            raise StopIteration
        index = self.random.randrange(len(self.buffer))
        self.buffer[index], self.buffer[-1] = self.buffer[-1], self.buffer[index]
        self.stats.elements += 1
        return self.buffer.pop()


def default_collate(elements: list[Any]) -> Any:
    """A batch of ``elements``: stacked tensors or arrays, tuples and dicts collated field
    by field, anything else a list."""
    first = elements[0]
    if hasattr(first, "__torch_function__"):
        import torch

        return torch.stack(elements)
    if type(first).__name__ == "ndarray" and hasattr(first, "shape"):
        import numpy

        return numpy.stack(elements)
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        return tuple(default_collate(list(field)) for field in zip(*elements, strict=True))
    if isinstance(first, dict):
        return {key: default_collate([e[key] for e in elements]) for key in first}
    return list(elements)


class Batch(Stage):
    def __init__(
        self,
        upstream: Stage,
        stats: StageStats,
        size: int,
        drop_last: bool,
        collate: Callable[[list[Any]], Any] | None,
    ) -> None:
        super().__init__(upstream, stats)
        self.size = size
        self.drop_last = drop_last
        self.collate = collate or default_collate
        self.position = 0

    def __next__(self) -> Any:
        elements: list[Any] = []
        while len(elements) < self.size:
            element = self.pull()
            if element is _END:
                break
            elements.append(element)
        if not elements or (self.drop_last and len(elements) < self.size):
            raise StopIteration
        position, self.position = self.position, self.position + 1
        started = time.perf_counter()
        try:
            batch = self.collate(elements)
        except BaseException as exc:
            raise failed(exc, self.stats, position) from None
        self.stats.busy_seconds += time.perf_counter() - started
        self.stats.elements += 1
        return batch


class Take(Stage):
    def __init__(self, upstream: Stage, stats: StageStats, count: int) -> None:
        super().__init__(upstream, stats)
        self.left = count

    def __next__(self) -> Any:
        if self.left <= 0:
            raise StopIteration
        element = self.pull()
        if element is _END:
            raise StopIteration
        self.left -= 1
        self.stats.elements += 1
        return element


class Repeat(Stage):
    """The stages above, run ``count`` times (None: forever), each run made anew."""

    def __init__(self, stats: StageStats, build: Callable[[], Stage], count: int | None):
        super().__init__(build(), stats)
        self.build = build
        self.runs = 1
        self.count = count

    def __next__(self) -> Any:
        while True:
            element = self.pull()
            if element is not _END:
                self.stats.elements += 1
                return element
            if self.count is not None and self.runs >= self.count:
                raise StopIteration
            assert self.upstream is not None
            self.upstream.close()
            self.upstream = self.build()
            self.runs += 1
            if self.stats.elements == 0:  # an empty source: repeating it gives nothing
                raise StopIteration
