"""Chunk sizes: auto starts small, grows boundedly, shrinks towards the end, caps bytes.

The assertions use the module's constants, so tuning a number does not break them;
they check the rules the constants feed.
"""

from __future__ import annotations

import numpy
import pytest

from paralela.errors import ConfigError
from paralela.mapping import _chunking
from paralela.mapping._chunking import AutoChunker, FixedChunker, make_chunker


def grown(per_item: float, workers: int = 2) -> AutoChunker:
    """An auto chunker fed chunks of its own choosing until its size settles."""
    chunker = AutoChunker(workers)
    size = chunker.next_size(None, 0)
    for _ in range(40):
        chunker.observe(size, size * per_item)
        new = chunker.next_size(None, 0)
        if new == size:
            break
        size = new
    return chunker


def test_auto_starts_with_one_item() -> None:
    chunker = AutoChunker(2)
    assert chunker.next_size(None, 0) == 1
    assert chunker.next_size(10_000, 0) == 1


def test_auto_grows_at_most_growth_fold_per_measurement() -> None:
    chunker = AutoChunker(4)
    size = chunker.next_size(None, 0)
    sizes = [size]
    for _ in range(12):
        chunker.observe(size, size * 1e-9)  # trivially cheap items
        new = chunker.next_size(None, 0)
        assert new <= size * _chunking.GROWTH
        sizes.append(new)
        size = new
    assert sizes[1] == _chunking.GROWTH  # cheap items: grows as fast as allowed
    assert max(sizes) == _chunking.MAX_CHUNK_ITEMS  # and stops at the cap


def test_growth_is_bounded_by_the_largest_chunk_measured_not_the_last() -> None:
    chunker = AutoChunker(2)
    chunker.observe(10, 10 * 1e-9)
    chunker.observe(1, 1e-9)
    assert 10 * _chunking.GROWTH < _chunking.MAX_CHUNK_ITEMS  # else the cap decides
    assert chunker.next_size(None, 0) == 10 * _chunking.GROWTH


def test_auto_aims_at_the_target_time_per_chunk() -> None:
    per_item = 0.001
    chunker = grown(per_item)
    size = chunker.next_size(None, 0)
    assert size == pytest.approx(_chunking.TARGET_SECONDS / per_item, rel=0.05)


def test_expensive_items_go_one_at_a_time() -> None:
    chunker = AutoChunker(2)
    chunker.observe(1, 10 * _chunking.TARGET_SECONDS)
    assert chunker.next_size(None, 0) == 1
    assert chunker.next_size(5, 0) == 1


def test_auto_follows_a_change_in_cost() -> None:
    chunker = grown(1e-4)
    before = chunker.next_size(None, 0)
    for _ in range(10):
        chunker.observe(before, before * 1e-2)  # items became 100 times dearer
    assert chunker.next_size(None, 0) < before / 50


def test_guided_chunks_shrink_towards_the_end() -> None:
    per_item = 1e-5
    workers = 2
    chunker = grown(per_item, workers)
    unknown = chunker.next_size(None, 0)
    assert chunker.next_size(10**9, 0) == unknown  # far from the end: no limit
    floor = int(_chunking.MIN_SECONDS / per_item)
    sizes = [chunker.next_size(remaining, 0) for remaining in (40_000, 20_000, 8_000, 2_000, 10)]
    assert sizes == sorted(sizes, reverse=True)
    for remaining, size in zip((40_000, 20_000, 8_000, 2_000, 10), sizes, strict=True):
        share = remaining / (_chunking.BALANCE * workers)
        assert size <= max(share, floor)
        assert size >= min(unknown, floor)  # never below the round-trip floor


def test_guided_share_depends_on_the_number_of_workers() -> None:
    few = grown(1e-6, workers=2)
    many = grown(1e-6, workers=16)
    assert many.next_size(100_000, 0) < few.next_size(100_000, 0)


@pytest.mark.parametrize(
    "sample",
    [
        numpy.zeros(8 * 2**20, dtype=numpy.uint8),  # 8 MiB array
        bytes(8 * 2**20),
        bytearray(8 * 2**20),
    ],
    ids=["ndarray", "bytes", "bytearray"],
)
def test_big_items_are_capped_by_bytes(sample: object) -> None:
    chunker = grown(1e-9)
    assert chunker.next_size(None, 0) > 1000
    size = chunker.next_size(None, sample)
    assert size == _chunking.MAX_CHUNK_BYTES // (8 * 2**20)
    assert size * 8 * 2**20 <= _chunking.MAX_CHUNK_BYTES


def test_an_item_bigger_than_the_cap_still_goes_alone() -> None:
    chunker = grown(1e-9)

    class Huge:  # reports its size like an array, without the memory
        nbytes = 4 * _chunking.MAX_CHUNK_BYTES

    assert chunker.next_size(None, Huge()) == 1


def test_fixed_chunker_never_changes() -> None:
    chunker = FixedChunker(7)
    chunker.observe(7, 100.0)
    assert [chunker.next_size(r, 0) for r in (None, 1, 10**6)] == [7, 7, 7]


def test_make_chunker() -> None:
    auto = make_chunker("auto", 3)
    assert isinstance(auto, AutoChunker)
    assert auto.workers == 3
    fixed = make_chunker(5, 3)
    assert isinstance(fixed, FixedChunker)
    assert fixed.size == 5


@pytest.mark.parametrize("bad", [0, -1, 1.5, "big", True, None, "AUTO"])
def test_make_chunker_refuses_bad_sizes(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"chunksize must be 'auto' or a positive integer, got"):
        make_chunker(bad, 2)  # type: ignore[arg-type]
