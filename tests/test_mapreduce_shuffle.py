"""The shuffle: stable partitioning, map-side buffering, spills and the reduce-side merge."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from paralela.errors import MapReduceError, UserFunctionError
from paralela.mapreduce import _merge, _segments, _spill
from paralela.mapreduce._shuffle import (
    MapOutput,
    Segment,
    canonical,
    order,
    partition_of,
    read_segment,
    reduce_partition,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _frequent_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check the buffer's size every 512 pairs instead of 8192, so that the small inputs
    here spill many times (the memory test runs in a child process with the default)."""
    monkeypatch.setattr(_spill, "CHECK_EVERY", 512)


def _sum(key: Any, values: Iterator[Any]) -> Any:
    return sum(values)


def _corpus(tokens: int, vocabulary: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}é" for i in range(vocabulary)]
    weights = [1 / (i + 1) for i in range(vocabulary)]
    return rng.choices(words, weights=weights, k=tokens)


def _shuffle(
    tasks: list[list[tuple[Any, Any]]],
    tmp_path: Path,
    *,
    partitions: int,
    combiner: Any = None,
    memory_limit: int = 64 << 20,
) -> tuple[dict[int, list[Segment]], list[MapOutput]]:
    """Run each list of pairs through a MapOutput (one per "map task"); the segments of
    every partition from every task."""
    by_partition: dict[int, list[Segment]] = {}
    outputs = []
    for index, pairs in enumerate(tasks):
        out = MapOutput(
            partitions,
            tmp_path,
            combiner=combiner,
            memory_limit=memory_limit,
            name=f"map-{index:05d}",
        )
        out.add_all(pairs)
        for partition, segments in out.close().items():
            by_partition.setdefault(partition, []).extend(segments)
        outputs.append(out)
    return by_partition, outputs


def _reduce_all(by_partition: dict[int, list[Segment]], reducer: Any = _sum) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for segments in by_partition.values():
        for key, value in reduce_partition(segments, reducer):
            assert key not in result, f"key {key!r} reduced twice"
            result[key] = value
    return result


# -- word count -------------------------------------------------------------------------


@pytest.mark.parametrize("combiner", [None, _sum], ids=["no-combiner", "combiner"])
@pytest.mark.parametrize("memory_limit", [64 << 20, 32 << 10], ids=["roomy", "tiny"])
def test_word_count_equals_counter(tmp_path: Path, combiner: Any, memory_limit: int) -> None:
    tokens = _corpus(60_000, 3_000, seed=1)
    tasks = [[(w, 1) for w in tokens[i : i + 15_000]] for i in range(0, len(tokens), 15_000)]
    by_partition, outputs = _shuffle(
        tasks, tmp_path, partitions=5, combiner=combiner, memory_limit=memory_limit
    )
    assert _reduce_all(by_partition) == Counter(tokens)
    assert sum(out.stats.pairs_in for out in outputs) == len(tokens)
    spills = sum(out.stats.spills for out in outputs)
    if memory_limit < 1 << 20:
        assert spills >= 4 * len(tasks), f"a 32 KiB limit should force many spills, got {spills}"
    else:
        assert spills == len(tasks)
    if combiner is not None and memory_limit > 1 << 20:  # one value per word per task
        assert sum(out.stats.pairs_out for out in outputs) <= 4 * 3_000
    assert sum(out.stats.bytes_spilled for out in outputs) == sum(
        os.path.getsize(p) for p in tmp_path.iterdir()
    )


def test_keys_come_out_sorted_within_a_partition(tmp_path: Path) -> None:
    tokens = _corpus(20_000, 2_000, seed=2)
    by_partition, _ = _shuffle(
        [[(w, 1) for w in tokens]] * 2, tmp_path, partitions=3, memory_limit=16 << 10
    )
    for partition, segments in by_partition.items():
        keys = [key for key, _ in reduce_partition(segments, _sum)]
        assert keys == sorted(keys)
        assert all(partition_of(key, 3) == partition for key in keys)


def test_add_one_pair_at_a_time_equals_add_all(tmp_path: Path) -> None:
    tokens = _corpus(30_000, 500, seed=3)
    out = MapOutput(2, tmp_path, combiner=_sum, memory_limit=8 << 10, name="one")
    for word in tokens:
        out.add(word, 1)
    result = _reduce_all(out.close())
    assert result == Counter(tokens)
    assert out.stats.pairs_in == len(tokens)
    assert out.stats.spills > 1


def test_spill_files_and_no_temporary_leftovers(tmp_path: Path) -> None:
    out = MapOutput(4, tmp_path, combiner=None, memory_limit=32 << 10, name="map-00012")
    out.add_all((f"k{i % 700}", i) for i in range(20_000))
    segments = out.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert out.stats.spills > _spill.MAP_FILES
    assert out.stats.merges >= 1
    assert 1 <= len(names) <= _spill.MAP_FILES  # spills merged, and deleted once merged
    assert all(name.startswith(("map-00012-spill-", "map-00012-merged-")) for name in names)
    assert {Path(s[0]).name for parts in segments.values() for s in parts} == set(names)
    assert out.close() == segments  # idempotent
    assert _reduce_all(segments) == {f"k{j}": sum(range(j, 20_000, 700)) for j in range(700)}
    for partition, parts in segments.items():
        for path, offset, length in parts:
            assert Path(path).parent == tmp_path
            assert offset >= 0
            assert length > 0
            assert all(
                partition_of(key, 4) == partition for key, _ in read_segment((path, offset, length))
            )


@pytest.mark.parametrize("combiner", [None, _sum], ids=["no-combiner", "combiner"])
def test_many_spills_are_merged_in_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, combiner: Any
) -> None:
    """With a merge factor of 3, a map task's 20+ spills are merged 3 at a time until
    MAP_FILES are left, and a reduce task with more segments than 3 merges them in
    temporary files, which it deletes."""
    monkeypatch.setattr(_spill, "MERGE_FACTOR", 3)
    monkeypatch.setattr(_merge, "MERGE_FACTOR", 3)
    tokens = _corpus(30_000, 2_000, seed=7)
    tasks = [[(w, 1) for w in tokens[i : i + 10_000]] for i in range(0, len(tokens), 10_000)]
    by_partition, outputs = _shuffle(
        tasks, tmp_path, partitions=2, combiner=combiner, memory_limit=64 << 10
    )
    assert all(out.stats.spills > 10 for out in outputs)
    assert all(out.stats.merges >= 3 for out in outputs)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= len(tasks) * _spill.MAP_FILES
    assert all(len(segs) <= len(tasks) * _spill.MAP_FILES for segs in by_partition.values())
    assert any(len(segs) > 3 for segs in by_partition.values())  # so the reduce merges too
    assert _reduce_all(by_partition) == Counter(tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # temporary merges deleted
    assert sum(out.stats.pairs_out for out in outputs) == sum(
        len(v) for segs in by_partition.values() for s in segs for _, v in read_segment(s)
    )
    if combiner is not None:  # merging combined each word to one value per file
        assert sum(out.stats.pairs_out for out in outputs) <= 4 * 3 * 2_000


def test_large_values_are_checked_sooner(tmp_path: Path) -> None:
    """Pairs of 256 KiB values: the size checks come every 16 pairs, not every 512, so the
    estimated buffer stays within the limit plus 16 such pairs."""
    out = MapOutput(2, tmp_path, combiner=None, memory_limit=2 << 20, name="big")
    out.add_all((f"k{i % 5}", os.urandom(256 << 10)) for i in range(200))
    segments = out.close()
    assert out.stats.spills >= 10
    assert out.stats.peak_buffer_bytes < (2 << 20) + 16 * (256 << 10) + (64 << 10)
    sizes = _reduce_all(segments, lambda key, values: sum(map(len, values)))
    assert sizes == {f"k{j}": 40 * (256 << 10) for j in range(5)}


def test_nothing_in_nothing_out(tmp_path: Path) -> None:
    out = MapOutput(3, tmp_path, combiner=_sum, memory_limit=1 << 20, name="empty")
    out.add_all([])
    out.add_all(iter(()))
    assert out.close() == {}
    assert list(tmp_path.iterdir()) == []
    assert out.stats.as_dict() == dict.fromkeys(out.stats.as_dict(), 0)
    assert list(reduce_partition([], _sum)) == []


def test_stats_read_as_attributes_and_items(tmp_path: Path) -> None:
    out = MapOutput(1, tmp_path, combiner=None, memory_limit=1 << 20, name="s")
    out.add_all([("a", 1), ("b", 2), ("a", 3)])
    out.close()
    assert out.stats["pairs_in"] == out.stats.pairs_in == 3
    assert out.stats.as_dict()["pairs_out"] == 3
    assert out.stats.peak_buffer_bytes > 0


# -- keys of many types -----------------------------------------------------------------


def test_mixed_key_types(tmp_path: Path) -> None:
    keys: list[Any] = [
        "a", "b", "", "ünï", 0, 1, -5, 2**80, 2.5, None, b"raw", ("a", 1), ("a", 1, None),
        (2, ("x",)), (None,), frozenset({1, 2}), Decimal("0.5"), Fraction(1, 3),
    ]  # fmt: skip
    pairs = [(key, i) for i in range(3) for key in keys]
    expected = dict.fromkeys(keys, 3 * 3)  # values 0 + 1 + 2 per key, three rounds
    tasks = [pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]]
    by_partition, _ = _shuffle(tasks, tmp_path, partitions=4, memory_limit=512)
    result = _reduce_all(by_partition)
    assert result == dict.fromkeys(keys, 3)
    assert len(result) == len(expected)


def test_keys_equal_under_eq_are_one_key(tmp_path: Path) -> None:
    """1, 1.0, True, Decimal(1) and Fraction(2, 2) are one key (as in a dict), even when
    they arrive from different map tasks; so are 0.5, Decimal("0.5"), Fraction(1, 2)."""
    tasks: list[list[tuple[Any, Any]]] = [
        [(1, "int")], [(1.0, "float")], [(True, "bool")], [(Decimal(1), "dec")],
        [(Fraction(2, 2), "frac")], [(0.5, "f")], [(Fraction(1, 2), "q")],
        [(Decimal("0.5"), "d")], [((1, "x"), "t")], [((1.0, "x"), "t2")],
    ]  # fmt: skip
    by_partition, _ = _shuffle(tasks, tmp_path, partitions=7)
    result = _reduce_all(by_partition, lambda key, values: sorted(values))
    assert result == {
        1: ["bool", "dec", "float", "frac", "int"],
        0.5: ["d", "f", "q"],
        (1, "x"): ["t", "t2"],
    }


def _nan_as_text(key: Any) -> str:
    """``repr(key)``, any NaN in it written nan (which form reached the reducer varies)."""
    if isinstance(key, tuple):
        return "(" + ", ".join(map(_nan_as_text, key)) + ")"
    return "nan" if key != key else repr(key)


def test_nan_keys_are_one_key(tmp_path: Path) -> None:
    """Every NaN is one key, as Spark groups NaN: float NaNs of other objects and bit
    patterns (the sign, numpy's), a Decimal NaN, and the same within tuples; from
    different map tasks, through spills and the merge, with and without a combiner."""
    import numpy as np

    nans: list[Any] = [float("nan"), -float("nan"), np.float64("nan"), Decimal("NaN")]
    nans += [float("nan") for _ in range(40)]  # distinct objects, each pickled apart
    tasks = [
        [(nan, 1) for nan in nans[:20]] + [(("x", nan), 1) for nan in nans[:20]],
        [(nan, 1) for nan in nans[20:]] + [(("x", nan), 1) for nan in nans[20:]] + [(1.5, 1)],
    ]
    for combiner in (None, _sum):
        by_partition, _ = _shuffle(
            tasks, tmp_path, partitions=5, combiner=combiner, memory_limit=512
        )
        result = _reduce_all(by_partition)
        assert sorted(map(_nan_as_text, result)) == ["('x', nan)", "1.5", "nan"], combiner
        assert sorted(result.values()) == [1, len(nans), len(nans)]
    assert len({canonical(nan) for nan in nans}) == 1
    assert len({partition_of(nan, 1000) for nan in nans}) == 1


def test_order_is_total_over_mixed_types() -> None:
    keys: list[Any] = ["b", 3, None, b"z", ("a",), (1, 2), 2.5, float("inf"), "a", frozenset({3})]
    ordered = sorted(keys, key=order)
    assert ordered[0] is None
    assert ordered[1:4] == [2.5, 3, float("inf")]
    assert ordered[4:6] == ["a", "b"]
    assert sorted(["b", "a", "c"], key=order) == ["a", "b", "c"]


def test_canonical_encodings_are_distinct_for_different_keys() -> None:
    keys: list[Any] = ["1", 1, b"1", 1.5, None, (1,), ("1",), (1, 2), ((1, 2),), frozenset({1})]
    encodings = [canonical(key) for key in keys]
    assert len(set(encodings)) == len(keys)


def test_partition_of_is_stable_across_hash_seeds(tmp_path: Path) -> None:
    keys: list[Any] = [f"key-{i}-ü" for i in range(700)]
    keys += [i * 7919 for i in range(100)] + [(f"t{i}", i) for i in range(100)]
    keys += [b"bytes-%d" % i for i in range(50)] + [i / 7 for i in range(49)] + [None]
    assert len(keys) == 1000
    here = [partition_of(key, 13) for key in keys]
    script = tmp_path / "partitions.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from paralela.mapreduce._shuffle import partition_of
            keys = {keys!r}
            json.dump([partition_of(k, 13) for k in keys], sys.stdout)
            """
        )
    )
    for seed in ("123", "4567"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == here
    assert len(set(here)) == 13  # every partition gets keys
    counts = Counter(here[:700])
    assert max(counts.values()) < 2 * 700 / 13, counts


def test_partition_of_rejects_no_partitions() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_of(3, 0)


# -- streaming --------------------------------------------------------------------------


def test_a_key_with_200k_values_streams(tmp_path: Path) -> None:
    out = MapOutput(3, tmp_path, combiner=None, memory_limit=256 << 10, name="hot")
    out.add_all(("hot", i) for i in range(200_000))
    out.add_all((f"cold{i}", i) for i in range(100))
    segments = out.close()
    assert out.stats.spills > 3
    seen: dict[Any, tuple[int, int]] = {}

    def reducer(key: Any, values: Iterator[int]) -> int:
        assert iter(values) is values
        assert not isinstance(values, (list, tuple))
        count = total = 0
        for value in values:
            count += 1
            total += value
        seen[key] = (count, total)
        return count

    result = _reduce_all(segments, reducer)
    assert result["hot"] == 200_000
    assert seen["hot"] == (200_000, sum(range(200_000)))
    assert all(result[f"cold{i}"] == 1 for i in range(100))
    hot = next(
        p
        for p, segs in segments.items()
        if any(k == "hot" for s in segs for k, _ in read_segment(s))
    )
    chunks = [len(v) for s in segments[hot] for k, v in read_segment(s) if k == "hot"]
    assert max(chunks) <= _segments.CHUNK_VALUES
    assert sum(chunks) == 200_000


def test_a_reducer_that_stops_early(tmp_path: Path) -> None:
    pairs = [(key, i) for key in ("a", "b", "c") for i in range(5_000)]
    by_partition, _ = _shuffle([pairs, pairs], tmp_path, partitions=1, memory_limit=8 << 10)

    def first_two(key: Any, values: Iterator[int]) -> list[int]:
        return [next(values), next(values)]

    def untouched(key: Any, values: Iterator[int]) -> str:
        return key.upper()  # type: ignore[no-any-return]

    result = _reduce_all(by_partition, first_two)
    assert set(result) == {"a", "b", "c"}
    assert all(len(v) == 2 for v in result.values())
    assert _reduce_all(by_partition, untouched) == {"a": "A", "b": "B", "c": "C"}


def test_reduce_side_combiner(tmp_path: Path) -> None:
    tokens = _corpus(20_000, 300, seed=5)
    by_partition, _ = _shuffle([[(w, 1) for w in tokens]], tmp_path, partitions=2)
    seen_lengths = []

    def reducer(key: Any, values: Iterator[int]) -> int:
        got = list(values)
        seen_lengths.append(len(got))
        return sum(got)

    result: dict[Any, Any] = {}
    for segments in by_partition.values():
        result.update(reduce_partition(segments, reducer, combiner=_sum))
    assert result == Counter(tokens)
    assert max(seen_lengths) < max(Counter(tokens).values())


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("word", "'word' (a str)"),
        ("ab", "'ab' (a str)"),
        (("k", 1, 2), "of length 3"),
        (7, "7 (a int)"),
        (["k"], "of length 1"),
    ],
)
def test_a_mapper_that_yields_no_pair(tmp_path: Path, item: Any, says: str) -> None:
    out = MapOutput(2, tmp_path, combiner=None, memory_limit=1 << 20, name="bad")
    for pairs in ([("ok", 1), item], iter([("ok", 1), item])):
        with pytest.raises(UserFunctionError, match=r"mappers? yield") as info:
            out.add_all(pairs)
        assert info.value.function == "mapper"
        assert says in str(info.value)


def test_an_unhashable_key_and_a_non_iterable_result(tmp_path: Path) -> None:
    out = MapOutput(2, tmp_path, combiner=None, memory_limit=1 << 20, name="bad")
    with pytest.raises(UserFunctionError, match=r"key \['a'\] is unhashable .*tuple instead"):
        out.add_all(iter([(["a"], 1)]))
    with pytest.raises(UserFunctionError, match="unhashable"):
        out.add(["a"], 1)
    with pytest.raises(UserFunctionError, match=r"returned 5 .* not iterable"):
        out.add_all(5)  # type: ignore[arg-type]


def test_an_exception_of_the_mappers_own_generator_passes_through(tmp_path: Path) -> None:
    out = MapOutput(2, tmp_path, combiner=None, memory_limit=1 << 20, name="gen")

    def mapper() -> Iterator[tuple[str, int]]:
        yield "a", 1
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        out.add_all(mapper())
    with pytest.raises(ValueError, match="invalid literal"):
        out.add_all(("k", int(x)) for x in ["1", "x"])
    with pytest.raises(ValueError, match="invalid literal"):
        out.add_all(map(lambda x: ("k", int(x)), ["1", "x"]))  # noqa: C417  (a C iterator)


def test_a_reducer_that_raises(tmp_path: Path) -> None:
    by_partition, _ = _shuffle([[("good", 1), ("bad key", 2)]], tmp_path, partitions=1)

    def reducer(key: str, values: Iterator[int]) -> int:
        if key == "bad key":
            raise KeyError("no such thing")
        return sum(values)

    results = reduce_partition(by_partition[0], reducer)
    with pytest.raises(
        UserFunctionError, match=r"(?s)reducer raised KeyError.*for key 'bad key'"
    ) as info:
        list(results)
    assert info.value.function == "reducer"
    assert info.value.where == repr("bad key")
    assert isinstance(info.value.__cause__, KeyError)


def test_a_combiner_that_raises(tmp_path: Path) -> None:
    def combiner(key: str, values: Iterator[int]) -> int:
        raise ZeroDivisionError("oops")

    out = MapOutput(2, tmp_path, combiner=combiner, memory_limit=1 << 20, name="comb")
    out.add_all([("a", 1), ("a", 2)])
    with pytest.raises(UserFunctionError, match="combiner raised ZeroDivisionError: oops") as info:
        out.close()
    assert info.value.function == "combiner"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".tmp-")]
    assert not list(tmp_path.iterdir())  # the half-written spill was removed


def test_a_damaged_segment_names_the_file(tmp_path: Path) -> None:
    out = MapOutput(1, tmp_path, combiner=None, memory_limit=1 << 20, name="dmg")
    out.add_all((f"k{i}", i) for i in range(1000))
    ((path, offset, length),) = out.close()[0]
    Path(path).write_bytes(Path(path).read_bytes()[: length // 2])
    with pytest.raises(MapReduceError, match=f"Spill file {path} is damaged"):
        list(reduce_partition([(path, offset, length)], _sum))
    Path(path).write_bytes(b"not a pickle at all")
    with pytest.raises(MapReduceError, match="damaged"):
        list(reduce_partition([(path, 0, 19)], _sum))


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="partitions"):
        MapOutput(0, tmp_path, combiner=None, memory_limit=1, name="x")
    with pytest.raises(ValueError, match="memory_limit"):
        MapOutput(1, tmp_path, combiner=None, memory_limit=0, name="x")


# -- memory -----------------------------------------------------------------------------

_MEMORY_SCRIPT = """
import os, sys, tempfile, psutil
from paralela.mapreduce import _spill
from paralela.mapreduce._shuffle import MapOutput, reduce_partition

_spill.MAP_FILES = 10**6  # keep every spill: the reduce side merges 20+ segments

def pairs(n):
    for i in range(n):
        # about 40 + 90 bytes of Python objects per pair, a million distinct keys
        yield "key-%012d" % (i * 7919 % 1_000_003), ("value %d " % i) * 4

def peak():
    return psutil.Process().memory_info().rss

limit = 8 << 20
directory = sys.argv[1]
n = int(sys.argv[2])
base = peak()
top = base
out = MapOutput(4, directory, combiner=None, memory_limit=limit, name="mem")
gen = pairs(n)
while True:
    chunk = [p for _, p in zip(range(20_000), gen)]
    if not chunk:
        break
    out.add_all(chunk)
    top = max(top, peak())
segments = out.close()
map_growth = max(top, peak()) - base
del chunk
base = peak()
top = base
count = 0
for part in segments.values():
    for i, (key, n_values) in enumerate(reduce_partition(part, lambda k, vs: sum(1 for _ in vs))):
        count += n_values
        if i % 5000 == 0:
            top = max(top, peak())
print(map_growth, max(top, peak()) - base, count, out.stats.spills, out.stats.bytes_spilled)
"""


def test_memory_stays_under_the_limit_plus_a_margin(tmp_path: Path) -> None:
    """700k pairs (~100 MB of Python objects, 52 MB of spills) through memory_limit=8 MiB:
    the map side's RSS grows by at most the limit + 32 MiB, the reduce side's by 32 MiB.

    Growth is measured from the RSS of the child process after its imports, so the
    interpreter's own ~30 MB is not part of it. The child keeps all 20-25 spills (no
    merge at close), so each reduce merges that many segments at once. Measured here:
    map side +18 MiB, reduce side +1 to +3 MiB. The margin covers the chunk of 20k pairs the script
    holds (~3 MiB), the estimate's error (sizes are sampled), the allocator's free lists
    after a spill, and on the reduce side the 20-25 open segments (a 64 KiB buffer and one
    decoded record of up to ~256 KiB of pickle each).
    """
    pairs = 700_000
    script = tmp_path / "memory.py"
    script.write_text(_MEMORY_SCRIPT)
    spills = tmp_path / "spills"
    spills.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), str(spills), str(pairs)],
        capture_output=True, text=True, env=env, timeout=100, check=True,
    )  # fmt: skip
    map_growth, reduce_growth, count, spill_count, spilled = map(int, done.stdout.split())
    assert count == pairs
    assert spill_count >= 8, f"expected many spills, got {spill_count}"
    assert spilled > 40 << 20
    assert map_growth < (8 << 20) + (32 << 20), f"map side grew {map_growth >> 20} MiB"
    assert reduce_growth < 32 << 20, f"reduce side grew {reduce_growth >> 20} MiB"


def test_add_mapping_equals_add_all_and_still_spills_under_its_limit(tmp_path: Path) -> None:
    tokens = _corpus(40_000, 2_000, seed=3)
    batches = [Counter(tokens[i : i + 4_000]) for i in range(0, len(tokens), 4_000)]
    results = []
    for name, limit in (("roomy", 64 << 20), ("tiny", 32 << 10)):
        out = MapOutput(3, tmp_path, combiner=_sum, memory_limit=limit, name=name)
        for batch in batches:
            out.add_mapping(batch)
        segments = out.close()
        assert out.stats.pairs_in == sum(map(len, batches))
        results.append((out.stats.spills, _reduce_all(segments)))
    (roomy_spills, roomy), (tiny_spills, tiny) = results
    assert roomy == tiny == Counter(tokens)
    assert roomy_spills == 1
    assert tiny_spills > 1


def test_a_combiner_raising_while_the_buffer_is_compacted_names_its_key(tmp_path: Path) -> None:
    def combiner(key: str, values: Iterator[int]) -> int:
        if key == "w7é":
            raise KeyError("no w7")
        return sum(values)

    out = MapOutput(2, tmp_path, combiner=combiner, memory_limit=64 << 20, name="compact")
    with pytest.raises(UserFunctionError, match=r"(?s)combiner raised KeyError.*for key 'w7é'"):
        out.add_all([(f"w{i % 10}é", 1) for i in range(20_000)])  # compacted: 16 a key


@pytest.mark.parametrize("record_values", [1, 2, 3, 7, 4096])
@pytest.mark.parametrize("start", [0, 1, 5])
def test_add_single_writes_the_records_add_sorted_writes(
    tmp_path: Path, record_values: int, start: int
) -> None:
    """The spill's fast path for lists of one value each gives the same bytes, records
    cut at the same keys, as the general path (also after a record was begun)."""
    keys = [f"k{i:04d}" for i in range(997)]
    lists = {key: [i] for i, key in enumerate(keys)}
    written = []
    for method in ("add_sorted", "add_single"):
        with open(tmp_path / method, "wb") as f:
            writer = _segments.SegmentWriter(f, True, record_values)
            writer.add_sorted(keys[:start], lists)  # a record already begun
            getattr(writer, method)(keys[start:], lists)
            length = writer.close()
        written.append(((tmp_path / method).read_bytes(), length, writer.values))
    assert written[0] == written[1]
    assert written[0][2] == len(keys)
