"""How many items go into the next chunk.

``chunksize="auto"`` aims every chunk at ``TARGET_SECONDS`` of work, from a smoothed
per-item time that the workers measure (transport excluded). It starts with one item,
since nothing is known of the function's cost, and grows at most ``GROWTH``-fold per
measurement, so an expensive function is never sent in a huge first chunk. When the
number of items is known, a chunk is also at most a ``1 / (BALANCE * workers)`` share of
what is left (guided self-scheduling): chunks shrink towards the end and the workers
finish together. They never shrink below ``MIN_SECONDS`` of work, where a chunk's round
trip (about 0.1-0.3 ms on the 2-core reference machine) would start to show. Chunks hold
at most ``MAX_CHUNK_ITEMS`` items, and at most ``MAX_CHUNK_BYTES`` of large buffers, so
that what is read ahead of the consumer stays bounded in items and in bytes.

The constants were chosen with ``bench/bench_map.py``: 50 ms per chunk keeps the
per-chunk cost below 1 % for CPU-bound items (workload b) while a progress bar still
moves several times a second; 1024-fold growth reaches full-size chunks of trivial items
(workload a) after two round trips (16-fold took four, and the ramp alone cost more
than the 0.1 us/item budget) while a first item that happened to be cheap still cannot
send a thousand-times-too-large chunk; a 1 ms floor lets the last chunks of a short run split
evenly between workers (5 ms left one worker alone with the last third of workload a).
"""

from __future__ import annotations

from typing import Any

from paralela.errors import ConfigError

__all__ = ["AutoChunker", "Chunker", "FixedChunker", "make_chunker"]

TARGET_SECONDS = 0.05
MIN_SECONDS = 0.001
GROWTH = 1024
BALANCE = 2
# The chunks in flight (PREFETCH x workers) stay within the last-level cache: a worker
# then reads its arrays from cache, right after the driver copied them into its arena.
# Workload c of bench/bench_map.py: the driver's copy costs 130 us/MiB with 16 MiB
# chunks against 160 with 32 MiB (6,900 against 6,050 arrays/s in one run); 8 MiB
# copies faster still but spends that on twice as many round trips.
MAX_CHUNK_BYTES = 16 * 1024 * 1024
# Caps the items read ahead of the consumer at (in flight + waiting) chunks x this; with
# 2 workers, 12 x 16,384 items. Trivial items (workload a) already reach full speed at
# this size: a chunk's round trip is about 1 % of 16,384 items' work.
MAX_CHUNK_ITEMS = 16_384


def item_nbytes(item: Any) -> int:
    """Size of an item's buffer when it has one (numpy arrays, bytes), else 0."""
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(item, (bytes, bytearray)):
        return len(item)
    return 0


class Chunker:
    """Decides chunk sizes; told about every finished chunk."""

    def max_in_flight(self, window: int, workers: int) -> int:
        """How many chunks may be in flight now (fewer while the cost is unknown)."""
        return window

    def next_size(self, remaining: int | None, sample: Any) -> int:
        raise NotImplementedError

    def observe(self, n_items: int, seconds: float) -> None:
        """A chunk of ``n_items`` took ``seconds`` of work in a worker."""


class FixedChunker(Chunker):
    def __init__(self, size: int) -> None:
        self.size = size

    def next_size(self, remaining: int | None, sample: Any) -> int:
        return self.size


class AutoChunker(Chunker):
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.per_item: float | None = None  # smoothed seconds per item
        self.largest_measured = 0

    def observe(self, n_items: int, seconds: float) -> None:
        if n_items <= 0:
            return
        estimate = max(seconds, 0.0) / n_items
        # Halve the weight of the past each time: follows drifting costs, damps noise.
        self.per_item = estimate if self.per_item is None else (self.per_item + estimate) / 2
        self.largest_measured = max(self.largest_measured, n_items)

    def max_in_flight(self, window: int, workers: int) -> int:
        # Until a first chunk is measured, one probe per worker: queuing more one-item
        # chunks behind them would only delay the first properly sized ones.
        return workers if self.per_item is None else window

    def next_size(self, remaining: int | None, sample: Any) -> int:
        if self.per_item is None:
            return 1
        per_item = max(self.per_item, 1e-9)
        size = min(TARGET_SECONDS / per_item, self.largest_measured * GROWTH)
        if remaining is not None:
            share = remaining / (BALANCE * self.workers)
            size = min(size, max(share, MIN_SECONDS / per_item))
        nbytes = item_nbytes(sample)
        if nbytes:
            size = min(size, MAX_CHUNK_BYTES / nbytes)
        return max(1, min(int(size), MAX_CHUNK_ITEMS))


def make_chunker(chunksize: int | str, workers: int) -> Chunker:
    """``"auto"`` or a positive integer; anything else is a :class:`ConfigError`."""
    if chunksize == "auto":
        return AutoChunker(workers)
    if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
        raise ConfigError(
            f"chunksize must be 'auto' or a positive integer, got {chunksize!r}. "
            "Use 'auto' unless you have measured a better value."
        )
    return FixedChunker(chunksize)
