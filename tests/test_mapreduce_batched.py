"""``paralela.mapreduce(batched=True)``: a mapper of a whole batch of records, as Spark's
``mapPartitions``, for jobs that can count a batch with C code."""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.errors import ConfigError, UserFunctionError
from paralela.mapreduce._batches import batch_blocks

WORD = re.compile(r"\w+")


def count_batch(lines: list[str]) -> collections.Counter[str]:
    return collections.Counter(itertools.chain.from_iterable(map(str.split, lines)))


def pairs_of_batch(lines: list[str]) -> list[tuple[str, int]]:
    return [(w, 1) for line in lines for w in line.split()]


def fails_on_zeta(lines: list[str]) -> collections.Counter[str]:
    for line in lines:
        if "zeta" in line.split():
            raise ValueError("no zeta allowed")
    return count_batch(lines)


def returns_none(lines: list[str]) -> None:
    return None


def total(_key: Any, counts: Iterable[int]) -> int:
    return sum(counts)


def _corpus(directory: Path, files: int = 3, lines: int = 3000) -> collections.Counter[str]:
    words = [f"w{i}" for i in range(200)] + ["straße", "日本", ""]
    expected: collections.Counter[str] = collections.Counter()
    for n in range(files):
        rows = [
            " ".join(words[(n + i * k) % len(words)] for k in range(i % 9)) for i in range(lines)
        ]
        text = "\n".join(rows) + "\n"
        (directory / f"doc{n}.txt").write_text(text, encoding="utf-8")
        expected.update(text.split())
    return expected


@pytest.mark.parametrize("mapper", [count_batch, pairs_of_batch])
def test_a_batched_word_count_equals_a_counter(tmp_path: Path, mapper: Any) -> None:
    expected = _corpus(tmp_path)
    result = paralela.mapreduce(
        mapper, total, str(tmp_path / "*.txt"), combiner=total, workers=2, batched=True,
        split_bytes=20_000,
    )  # fmt: skip
    assert result.to_dict() == dict(expected)
    s = result.summary
    assert s.records == 9000
    if mapper is count_batch:  # one pair per distinct word of a batch, not per token
        assert s.pairs_emitted < sum(expected.values()) / 10
    else:
        assert s.pairs_emitted == sum(expected.values())


def test_a_batched_mapper_over_an_iterable_of_records() -> None:
    result = paralela.mapreduce(
        lambda xs: {"even": sum(1 for x in xs if x % 2 == 0), "odd": sum(x % 2 for x in xs)},
        total, range(10_001), records_per_split=1000, backend="threads", workers=2,
        batched=True,
    )  # fmt: skip
    assert result.to_dict() == {"even": 5001, "odd": 5000}


def test_a_batched_mapper_that_raises_names_its_batch(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha beta\ngamma\nzeta eta\n", encoding="utf-8")
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(fails_on_zeta, total, str(tmp_path / "a.txt"), batched=True)
    error = caught.value
    assert error.function == "mapper"
    assert "ValueError: no zeta allowed" in str(error)
    assert "batch of 3 record(s) from" in str(error)
    assert "a.txt line 1 to" in str(error)
    assert "a.txt line 3" in str(error)
    assert isinstance(error.__cause__, ValueError)


def test_a_batched_mapper_returning_none_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n", encoding="utf-8")
    with pytest.raises(UserFunctionError, match="with batched=True a mapper takes a list"):
        paralela.mapreduce(returns_none, total, str(tmp_path / "a.txt"), batched=True)


def test_batched_is_a_bool_and_local_only(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="batched must be True or False"):
        paralela.mapreduce(count_batch, total, str(tmp_path / "a.txt"), batched=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="local engine only"):
        paralela.mapreduce(
            count_batch, total, str(tmp_path / "a.txt"), batched=True, engine="spark"
        )


def test_a_batch_grows_with_the_memory_limit_up_to_16_mib() -> None:
    assert batch_blocks(512 * 1000**2) == 15  # 16 MB of 1 MiB blocks: ~40 MB of strings
    assert batch_blocks(4 << 30) == 16
    assert batch_blocks(64 << 20) == 2
    assert batch_blocks(1 << 20) == 1


def test_small_files_are_mapped_in_fewer_tasks_with_the_same_answer(tmp_path: Path) -> None:
    expected = _corpus(tmp_path, files=8, lines=300)
    result = paralela.mapreduce(
        count_batch, total, str(tmp_path / "*.txt"), combiner=total, workers=2, batched=True
    )
    assert result.to_dict() == dict(expected)
    s = result.summary
    assert (s.splits, s.map_tasks) == (8, 4)  # two files a task: 2 tasks per worker
    assert s.pairs_after_combining <= 4 * len(expected)  # one set of pairs per task
