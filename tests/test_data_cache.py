"""``Pipeline.cache()``: a cache never gives the elements of other stages or another
source. A cache file carries the fingerprint of the stages and the source that made it
(map's fingerprints) and is refused on a mismatch, naming what changed; a file paralela
did not write is never read or replaced; in-memory caches belong to their own step."""

from __future__ import annotations

from pathlib import Path

import pytest

from paralela.data import Pipeline
from paralela.errors import ConfigError, FingerprintMismatchError
from tests.data_helpers import double, numbers, triple


def _served_from_the_cache(pipeline: Pipeline) -> bool:
    """The last run read the cache: the stages above it were never built."""
    return [s.name for s in pipeline.stats().stages] == [pipeline._steps[-1].name]


def test_a_cache_file_of_other_stages_or_another_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cache.pkl"
    assert list(Pipeline.from_iterable(range(5)).map(double).cache(path)) == [0, 2, 4, 6, 8]
    written = path.read_bytes()

    again = Pipeline.from_iterable(range(5)).map(double).cache(path)
    assert list(again) == [0, 2, 4, 6, 8]
    assert _served_from_the_cache(again)

    with pytest.raises(FingerprintMismatchError) as caught:  # map(x*2) became map(x*3)
        list(Pipeline.from_iterable(range(5)).map(triple).cache(path))
    message = str(caught.value)
    assert str(path) in message
    assert "step 1 was map(double), now map(triple)" in message
    assert "Delete it to rebuild the cache" in message

    with pytest.raises(FingerprintMismatchError, match=r"the source from_iterable\(range\)"):
        list(Pipeline.from_iterable(range(8)).map(double).cache(path))  # a longer source
    assert path.read_bytes() == written  # refused: left as it was

    path.unlink()  # as the error says: the next complete run rebuilds it
    assert list(Pipeline.from_iterable(range(8)).map(triple).cache(path)) == [
        x * 3 for x in range(8)
    ]


def test_a_changed_function_is_named_with_what_changed(tmp_path: Path) -> None:
    path = tmp_path / "cache.pkl"
    factor = 2
    list(Pipeline.from_iterable([1, 2]).map(lambda x: x * factor).cache(path))
    factor = 3
    with pytest.raises(FingerprintMismatchError, match=r"step 1 map\(.*<lambda>\):.*\(code\)"):
        list(Pipeline.from_iterable([1, 2]).map(lambda x: x * factor).cache(path))


def test_changed_files_make_another_source(tmp_path: Path) -> None:
    shard = tmp_path / "shard-0.txt"
    shard.write_text("a\nb\n")
    path = tmp_path / "cache.pkl"

    def pipeline() -> Pipeline:
        return Pipeline.from_files(shard).cache(path)

    assert list(pipeline()) == [str(shard)]
    shard.write_text("a\nb\nc\n")  # rewritten: another size
    with pytest.raises(FingerprintMismatchError, match=r"the source from_files\(1 files\)"):
        list(pipeline())


def test_a_generator_source_counts_by_its_code_and_arguments(tmp_path: Path) -> None:
    path = tmp_path / "cache.pkl"
    assert list(Pipeline.from_iterable(numbers(3)).map(double).cache(path)) == [0, 2, 4]
    again = Pipeline.from_iterable(numbers(3)).map(double).cache(path)
    assert list(again) == [0, 2, 4]
    assert _served_from_the_cache(again)
    with pytest.raises(FingerprintMismatchError, match=r"the source from_iterable\(generator\)"):
        list(Pipeline.from_iterable(numbers(5)).map(double).cache(path))


def test_a_source_that_cannot_be_identified_needs_a_key(tmp_path: Path) -> None:
    path = tmp_path / "cache.pkl"
    with pytest.raises(ConfigError, match=r"cache\(path, fingerprint="):
        iter(Pipeline.from_iterable(iter([1, 2, 3])).cache(path))
    assert not path.exists()
    keyed = Pipeline.from_iterable(iter([1, 2, 3])).cache(path, fingerprint="v1")
    assert list(keyed) == [1, 2, 3]
    assert list(Pipeline.from_iterable(iter([])).cache(path, fingerprint="v1")) == [1, 2, 3]
    with pytest.raises(FingerprintMismatchError, match=r"fingerprint='v1', now 'v2'"):
        iter(Pipeline.from_iterable(iter([])).cache(path, fingerprint="v2"))
    with pytest.raises(ConfigError, match=r"fingerprint= names a cache file"):
        Pipeline.from_iterable([1]).cache(fingerprint="v1")


def test_a_file_paralela_did_not_write_is_neither_read_nor_replaced(tmp_path: Path) -> None:
    path = tmp_path / "results.pkl"
    path.write_bytes(b"someone else's results")
    with pytest.raises(ConfigError, match=r"is not a cache file that paralela wrote") as caught:
        iter(Pipeline.from_iterable(range(3)).cache(path))
    assert "another path" in str(caught.value)
    assert path.read_bytes() == b"someone else's results"


def test_sibling_pipelines_keep_their_own_in_memory_cache() -> None:
    base = Pipeline.from_iterable(range(5))
    doubled, tripled = base.map(double).cache(), base.map(triple).cache()
    assert list(doubled) == [0, 2, 4, 6, 8]
    assert list(tripled) == [0, 3, 6, 9, 12]  # was the doubled pipeline's cache
    assert list(doubled) == [0, 2, 4, 6, 8]
    assert _served_from_the_cache(doubled)


def test_an_in_memory_cache_of_a_source_that_grew_is_filled_anew() -> None:
    source = list(range(5))
    pipeline = Pipeline.from_iterable(source).map(double).cache()
    assert list(pipeline) == [0, 2, 4, 6, 8]
    source.extend([5, 6])
    assert list(pipeline) == [0, 2, 4, 6, 8, 10, 12]  # was the 5 cached elements
    assert list(pipeline) == [0, 2, 4, 6, 8, 10, 12]
    assert _served_from_the_cache(pipeline)
    once = Pipeline.from_iterable(numbers(3)).cache()  # a one-shot source: read once
    assert list(once) == list(once) == [0, 1, 2]
