"""The map task's counting loop (``mapreduce/_counting.py``): the compiled loop and the
Python one count the same and raise the same, item by item, for every kind of item a
mapper may yield; and the compiled one is built wherever a C compiler is."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from paralela.mapreduce import _counting

Counting = Callable[..., None]
IMPLEMENTATIONS = {"python": _counting.count_runs_python}
if _counting.COMPILED:
    IMPLEMENTATIONS["compiled"] = _counting.count_runs


@pytest.fixture(params=["python", "compiled"])
def count_runs(request: pytest.FixtureRequest) -> Counting:
    if request.param not in IMPLEMENTATIONS:
        # test_the_compiled_loop_is_built_where_a_compiler_is fails in that case
        pytest.skip("paralela was installed without a C compiler")
    return IMPLEMENTATIONS[request.param]


ONE = 1  # the run value (compared by identity)


class Pair(NamedTuple):
    key: Any
    value: Any


def counts(runs: dict[Any, Any]) -> dict[Any, int]:
    """A runs dict's counts (its values are Tally cells)."""
    return {key: tally.n for key, tally in runs.items()}


def run(count_runs: Counting, items: list[Any], budget: int = 10**9) -> tuple[Any, ...]:
    """count_runs over ``items`` with run value 1: the counts, the others, seen, the rest."""
    runs: dict[Any, Any] = {}
    others: list[tuple[Any, Any]] = []
    seen = ["start"]
    it = iter(items)
    count_runs(runs, it, 1, lambda k, v: others.append((k, v)), budget, seen)
    return counts(runs), others, seen[0], list(it)


def test_pairs_of_the_run_value_are_counted_and_the_others_handed_on(
    count_runs: Counting,
) -> None:
    items: list[Any] = [("a", 1), ["b", 1], Pair("a", 1), ("a", 2), ("c", 1.0), ("c", True)]
    items += [("big", 1)] * 1000  # counts past the small ints
    runs, others, seen, rest = run(count_runs, items)
    assert runs == {"a": 2, "b": 1, "big": 1000}
    assert others == [("a", 2), ("c", 1.0), ("c", True)]  # equal to 1, not the same object
    assert seen == ("big", 1)
    assert rest == []


def test_it_pulls_no_more_than_the_budget(count_runs: Counting) -> None:
    items = [(f"k{i % 3}", 1) for i in range(10)]
    runs, _, seen, rest = run(count_runs, items, budget=4)
    assert runs == {"k0": 2, "k1": 1, "k2": 1}
    assert seen == ("k0", 1)
    assert rest == items[4:]
    assert run(count_runs, items, budget=0)[2:] == ("start", items)


def test_an_empty_iterator_leaves_seen_as_it_was(count_runs: Counting) -> None:
    assert run(count_runs, []) == ({}, [], "start", [])


def test_any_2_item_iterable_is_unpacked_as_python_unpacks_it(count_runs: Counting) -> None:
    """``k, v = item``: a 2-character string is a pair of characters, as in Python (the
    first pairs of a task are checked one by one for that, by _pairs.check_first)."""
    runs, others, _, _ = run(count_runs, ["ab", iter(["c", 1]), range(1, 3)])
    assert runs == {"c": 1}
    assert others == [("a", "b"), (1, 2)]


@pytest.mark.parametrize(
    ("item", "error", "words"),
    [
        (7, TypeError, "cannot unpack non-iterable int object"),
        (("a", 1, 2), ValueError, "too many values to unpack (expected 2)"),
        (("a",), ValueError, "not enough values to unpack (expected 2, got 1)"),
        (["a"], ValueError, "not enough values to unpack (expected 2, got 1)"),
        ((["a"], 1), TypeError, "unhashable type: 'list'"),
    ],
)
def test_a_bad_item_raises_what_unpacking_it_raises_and_is_seen(
    count_runs: Counting, item: Any, error: type[Exception], words: str
) -> None:
    runs: dict[Any, Any] = {}
    seen: list[Any] = [None]
    it = iter([("x", 1), item, ("y", 1)])
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        count_runs(runs, it, 1, lambda k, v: None, 100, seen)
    assert seen[0] is item
    assert counts(runs) == {"x": 1}
    assert list(it) == [("y", 1)]


def test_what_the_iterator_or_other_raises_propagates(count_runs: Counting) -> None:
    def pairs() -> Iterator[tuple[str, int]]:
        yield "x", 1
        raise KeyError("the mapper's own")

    seen: list[Any] = [None]
    with pytest.raises(KeyError, match="the mapper's own"):
        count_runs({}, pairs(), 1, lambda k, v: None, 100, seen)
    assert seen[0] == ("x", 1)

    def other(k: Any, v: Any) -> None:
        raise RuntimeError(f"other got {k}")

    seen = [None]
    with pytest.raises(RuntimeError, match="other got y"):
        count_runs({}, iter([("x", 1), ("y", 2)]), 1, other, 100, seen)
    assert seen[0] == ("y", 2)


def test_keys_that_are_equal_count_together(count_runs: Counting) -> None:
    """Dict semantics: 1, 1.0 and True are one key, as in the Python loop."""
    runs, _, _, _ = run(count_runs, [(1, 1), (1.0, 1), (True, 1), ((1, "a"), 1), ((1, "a"), 1)])
    assert runs == {1: 3, (1, "a"): 2}


def test_both_loops_agree_on_a_random_stream() -> None:
    """The two loops, item by item, on pairs of mixed shapes and values."""
    import random

    rng = random.Random(7)
    shapes = [lambda k, v: (k, v), lambda k, v: [k, v], Pair]
    items = [
        rng.choice(shapes)(f"w{rng.randrange(500)}", rng.choice([1, 1, 1, 1, 2, 1.0, None]))
        for _ in range(20_000)
    ]
    results = [run(fn, items, budget=15_000) for fn in IMPLEMENTATIONS.values()]
    assert all(result == results[0] for result in results)
    assert sum(results[0][0].values()) == sum(1 for _, v in items[:15_000] if v is ONE)


def test_a_count_goes_on_in_place_from_the_tally_in_the_dict(count_runs: Counting) -> None:
    """A run begun before (a Tally already in the dict) is counted on, in that cell."""
    tally = _counting.TallyPython if count_runs is _counting.count_runs_python else _counting.Tally
    before = tally(5)
    runs = {"a": before}
    count_runs(runs, iter([("a", 1), ("b", 1), ("a", 1)]), 1, lambda k, v: None, 10, [None])
    assert runs["a"] is before
    assert counts(runs) == {"a": 7, "b": 1}
    assert type(runs["b"]) is tally
    assert repr(before) == "Tally(7)"


@pytest.mark.skipif(not _counting.COMPILED, reason="paralela was built without a C compiler")
def test_the_compiled_loop_refuses_a_count_that_is_not_its_tally() -> None:
    seen: list[Any] = [None]
    with pytest.raises(TypeError, match="Tally"):
        _counting.count_runs({"a": 1}, iter([("a", 1)]), 1, lambda k, v: None, 10, seen)
    assert seen[0] == ("a", 1)
    with pytest.raises(AttributeError, match="deleted"):
        del _counting.Tally(1).n


def test_the_compiled_loop_is_built_where_a_compiler_is() -> None:
    """``pip install`` builds ``_speedups.c`` where a C compiler and Python's headers
    are (the build is optional: without them paralela works, its word count slower)."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    compiler = shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc")
    if compiler is None or not headers.is_file():
        pytest.skip("no C compiler or no Python headers on this machine: nothing to build")
    assert _counting.COMPILED, (
        "paralela.mapreduce._speedups was not built although a C compiler and Python's "
        "headers are here: reinstall paralela (pip install -e .) and read the build log"
    )
    assert _counting.count_runs is not _counting.count_runs_python
