"""Combining inside the map task: with a combiner, pairs whose value is one shared object
(the ``1`` of ``yield word, 1``) are counted as runs instead of appended one by one
(``mapreduce/_spill.py``). It must give exactly what appending every value gives: the
same values (the very objects, not equal ones), in the order yielded for each key, on
every engine; and no combining at all without a combiner."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.mapreduce import _counting, _spill
from paralela.mapreduce._shuffle import MapOutput, reduce_partition

ONE = ("one",)  # a shared value: the run value of `tagged`


# -- the jobs (module level: workers import them from here) -----------------------------


def tagged(line: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(word, ONE)``, and every fifth word a value of its own."""
    for i, word in enumerate(line.split()):
        yield (word, (f"{word[:2]}{i}",)) if i % 5 == 4 else (word, ONE)


def concat_sorted(_key: Any, values: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """Tuples joined and sorted: any grouping gives the same, so it may combine."""
    return tuple(sorted(chain.from_iterable(values)))


def equal_ones(line: str) -> Iterator[tuple[str, Any]]:
    """``(word, 1)``, with ``True`` and ``1.0`` (equal to 1, not the same) now and then."""
    for i, word in enumerate(line.split()):
        yield word, (True if i % 7 == 6 else 1.0 if i % 11 == 10 else 1)


def type_counts(_key: Any, values: Iterable[Any]) -> tuple[tuple[str, int], ...]:
    """How many values of each type (a combined value: the counts it carries)."""
    counts: collections.Counter[str] = collections.Counter()
    for value in values:
        if type(value) is tuple:
            counts.update(dict(value))
        else:
            counts[type(value).__name__] += 1
    return tuple(sorted(counts.items()))


def words(line: str) -> Iterator[tuple[str, int]]:
    for word in line.split():
        yield word, 1


def values_seen(_key: Any, values: Iterable[int]) -> int:
    """A reducer that counts the values it receives: not a combiner (a count of counts)."""
    return sum(1 for _ in values)


# -- the corpus ------------------------------------------------------------------------


def make_corpus(directory: Path, files: int = 3, lines: int = 500, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(400)] + ["straße", "日本", "данные"]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    directory.mkdir(parents=True, exist_ok=True)
    all_lines = []
    for n in range(files):
        rows = [
            " ".join(rng.choices(vocabulary, weights, k=rng.randint(0, 14))) for _ in range(lines)
        ]
        (directory / f"part{n}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
        all_lines += rows
    return all_lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    directory = tmp_path_factory.mktemp("corpus")
    return directory, make_corpus(directory)


def expected(mapper: Any, reducer: Any, lines: list[str]) -> dict[Any, Any]:
    """The reducer over every key's values, all at once: no combining."""
    by_key: dict[Any, list[Any]] = collections.defaultdict(list)
    for line in lines:
        for key, value in mapper(line):
            by_key[key].append(value)
    return {key: reducer(key, iter(values)) for key, values in by_key.items()}


# -- one map task: MapOutput ------------------------------------------------------------


@pytest.fixture(params=["compiled", "python"])
def counting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each MapOutput test runs with the compiled counting loop and with the Python one."""
    if request.param == "python":
        monkeypatch.setattr(_spill, "_count_runs", _counting.count_runs_python)
    elif not _counting.COMPILED:  # test_mapreduce_counting fails where it should be built
        pytest.skip("paralela was installed without a C compiler")


def _one_task(
    pairs: list[tuple[Any, Any]], combiner: Any, limit: int, step: int, tmp_path: Path
) -> tuple[dict[Any, Any], MapOutput]:
    out = MapOutput(3, tmp_path, combiner=combiner, memory_limit=limit, name=f"t{limit}-{step}")
    for start in range(0, len(pairs), step):
        out.add_all(iter(pairs[start : start + step]))
    result: dict[Any, Any] = {}
    for segments in out.close().values():
        result.update(reduce_partition(segments, combiner or concat_in_order))
    return result, out


def concat_in_order(_key: Any, values: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """Tuples joined in the order they come: order matters, grouping does not."""
    return tuple(chain.from_iterable(values))


@pytest.mark.usefixtures("counting")
@pytest.mark.parametrize("step", [1, 7, 1000, 10**6])
def test_runs_keep_each_keys_values_in_the_order_yielded(tmp_path: Path, step: int) -> None:
    """With one spill, a key's values reach the combiner in the order the mapper yielded
    them: a run of the shared value follows the values before it, and a value of
    another kind first takes the key's run into its list."""
    rng = random.Random(3)
    pairs: list[tuple[str, tuple[str, ...]]] = []
    for i in range(30_000):
        key = f"k{rng.randrange(300)}"
        pairs.append((key, ONE if rng.random() < 0.9 else (f"x{i}",)))
    want: dict[str, list[str]] = collections.defaultdict(list)
    for key, value in pairs:
        want[key] += value
    got, out = _one_task(pairs, concat_in_order, 64 << 20, step, tmp_path)
    assert got == {key: tuple(values) for key, values in want.items()}
    assert out.stats.pairs_in == len(pairs)
    assert out.stats.spills == 1
    assert out.stats.pairs_out == len(want)  # combined: one value a key


@pytest.mark.usefixtures("counting")
@pytest.mark.parametrize("limit", [8 << 10, 256 << 10, 64 << 20])
@pytest.mark.parametrize("step", [1, 333, 10**6])
def test_runs_count_only_the_very_same_object_not_equal_ones(
    tmp_path: Path, limit: int, step: int
) -> None:
    """``True`` and ``1.0`` equal ``1`` but are other values: each reaches the combiner
    as itself, through spills too (a combiner counting types sees every one)."""
    rng = random.Random(5)
    values: list[Any] = [1] * 12 + [True, 1.0]
    pairs = [(f"k{rng.randrange(2000)}", rng.choice(values)) for _ in range(40_000)]
    by_key: dict[str, list[Any]] = collections.defaultdict(list)
    for key, value in pairs:
        by_key[key].append(value)
    want = {key: type_counts(key, iter(values)) for key, values in by_key.items()}
    got, out = _one_task(pairs, type_counts, limit, step, tmp_path)
    assert got == want
    assert out.stats.pairs_in == len(pairs)
    if limit == 8 << 10:
        assert out.stats.spills > 3


@pytest.mark.usefixtures("counting")
def test_values_that_never_repeat_turn_runs_off(tmp_path: Path) -> None:
    """A mapper whose values are new objects (``yield word, len(line)``) leaves runs
    after a probe: each value is appended as before, and the answer is the same."""
    pairs = [(f"k{i % 97}", float(i)) for i in range(20_000)]
    out = MapOutput(2, tmp_path, combiner=concat_in_order, memory_limit=1 << 20, name="off")
    out.add_all(iter((key, (value,)) for key, value in pairs))
    assert out._run_value is _spill._OFF
    got: dict[str, Any] = {}
    for segments in out.close().values():
        got.update(reduce_partition(segments, concat_in_order))
    want: dict[str, list[float]] = collections.defaultdict(list)
    for key, value in pairs:
        want[key].append(value)
    assert got == {key: tuple(values) for key, values in want.items()}
    assert out.stats.pairs_in == len(pairs)


def test_without_a_combiner_every_value_is_written(tmp_path: Path) -> None:
    """No combiner, no runs: the reducer receives every value the mapper yielded."""
    pairs = [(f"k{i % 50}", 1) for i in range(5000)]
    out = MapOutput(2, tmp_path, combiner=None, memory_limit=1 << 20, name="plain")
    out.add_all(iter(pairs))
    got: dict[str, int] = {}
    for segments in out.close().values():
        got.update(reduce_partition(segments, values_seen))
    assert got == {f"k{i}": 100 for i in range(50)}
    assert out.stats.pairs_out == out.stats.pairs_in == len(pairs)


# -- every engine ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["processes", "threads", "sequential"])
@pytest.mark.parametrize(
    ("mapper", "combiner"),
    [(tagged, concat_sorted), (equal_ones, type_counts), (words, None)],
    ids=["shared-and-own-values", "equal-not-same", "no-combiner"],
)
def test_the_local_engine_gives_the_uncombined_answer(
    corpus: tuple[Path, list[str]], backend: str, mapper: Any, combiner: Any
) -> None:
    """Several map tasks (small splits), combined in each: exactly the reducer over all
    values at once. Without a combiner, a reducer that counts its values sees each."""
    directory, lines = corpus
    reducer = values_seen if combiner is None else combiner
    result = paralela.mapreduce(
        mapper, reducer, str(directory), combiner=combiner, backend=backend, workers=2,
        split_bytes=4096, partitions=3, progress=False,
    )  # fmt: skip
    assert result.to_dict() == expected(mapper, reducer, lines)
    assert result.summary.map_tasks > 3
    if combiner is not None:
        assert result.summary.pairs_after_combining < result.summary.pairs_emitted / 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mapper", "combiner"),
    [(tagged, concat_sorted), (equal_ones, type_counts), (words, None)],
    ids=["shared-and-own-values", "equal-not-same", "no-combiner"],
)
def test_spark_gives_the_uncombined_answer(
    spark_sessions: Any, corpus: tuple[Path, list[str]], mapper: Any, combiner: Any
) -> None:
    """The same jobs on Spark (``local[2]``): the same answer as the reducer over all
    values at once, and as the local engine."""
    spark_sessions.session("local[2]")
    directory, lines = corpus
    reducer = values_seen if combiner is None else combiner
    options: dict[str, Any] = {"combiner": combiner, "split_bytes": 16384, "partitions": 3}
    spark = paralela.mapreduce(mapper, reducer, str(directory), engine="spark", **options)
    local = paralela.mapreduce(mapper, reducer, str(directory), backend="threads", **options)
    assert spark.to_dict() == expected(mapper, reducer, lines)
    assert list(spark) == list(local)
