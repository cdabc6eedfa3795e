"""Tests of MapReduce inputs: planning splits, reading them, locating records, errors."""

from __future__ import annotations

import csv
import functools
import gzip
import itertools
import json
import operator
import os
import pickle
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paralela.errors import ConfigError, InputError, MissingExtraError, UnpicklableError
from paralela.files import _formats
from paralela.files._inputs import (
    Split,
    group_splits,
    input_identity,
    locate,
    plan_splits,
    read_split,
    read_split_batches,
)

# Characters str.splitlines() does not split on (it also splits on \x0b, \x0c, \x1c-\x1e,
# \x85, \u2028 and \u2029, which are not line endings here).
ALPHABET = "abcxyz ,.é漢字🙂\t\"'"


def read_all(inputs: Any, **options: Any) -> list[Any]:
    return [r for split in plan_splits(inputs, **options) for r in read_split(split)]


def random_text(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 40)):
        kind = rng.random()
        if kind < 0.15:
            line = ""
        elif kind < 0.2:
            line = "".join(rng.choices(ALPHABET, k=rng.randint(200, 3000)))  # longer than splits
        else:
            line = "".join(rng.choices(ALPHABET, k=rng.randint(1, 30)))
        lines.append(line + rng.choice(["\n", "\n", "\r\n"]))
    text = "".join(lines)
    if text and rng.random() < 0.5:  # no final newline
        text = text.rstrip("\r\n") + "".join(rng.choices(ALPHABET, k=rng.randint(0, 5)))
    return text


@pytest.mark.parametrize("split_bytes", [1, 7, 64, 1000, 64 * 2**20])
def test_text_splits_read_every_line_exactly_once(tmp_path: Path, split_bytes: int) -> None:
    rng = random.Random(13 + split_bytes)
    for case in range(25):
        path = tmp_path / f"f{case}.txt"
        path.write_bytes(random_text(rng).encode())
        expected = path.read_text(encoding="utf-8").splitlines()
        splits = list(plan_splits(str(path), split_bytes=split_bytes))
        assert [s.index for s in splits] == list(range(len(splits)))
        got = [line for s in splits for line in read_split(s)]
        assert got == expected, (case, path.read_bytes()[:200])
        batched = [line for s in splits for batch in read_split_batches(s) for line in batch]
        assert batched == expected


def test_line_longer_than_a_split_is_read_once_by_its_first_split(tmp_path: Path) -> None:
    long = "L" * 5000
    path = tmp_path / "long.txt"
    path.write_text(f"a\nbb\n{long}\nc\n")
    splits = list(plan_splits(str(path), split_bytes=100))
    assert len(splits) > 10
    per_split = [list(read_split(s)) for s in splits]
    owners = [i for i, records in enumerate(per_split) if long in records]
    assert owners == [0]  # its first byte, offset 5, is in split 0 (bytes 0-100)
    assert functools.reduce(operator.iadd, per_split, []) == ["a", "bb", long, "c"]
    assert all(records == [] for records in per_split[1:-1])  # inside the long line
    assert per_split[-1] == ["c"]


def test_split_at_line_start_owns_that_line(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("0123\n5678\n")  # a split boundary exactly at a line's first byte
    first = Split(0, "text", str(path), 0, 5, size=5)
    second = Split(1, "text", str(path), 5, 10, size=5)
    assert list(read_split(first)) == ["0123"]
    assert list(read_split(second)) == ["5678"]


def test_empty_file_is_one_split_with_no_records(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    splits = list(plan_splits(str(tmp_path / "empty.txt")))
    assert len(splits) == 1
    assert list(read_split(splits[0])) == []


# --------------------------------------------------------------------------- paths


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("b1\nb2\n")
    (root / "a.txt").write_text("a1\n")
    (root / "c.log").write_text("c1\n")
    (root / "sub" / "d.txt").write_text("d1\n")
    (root / ".hidden.txt").write_text("hidden\n")
    (root / "_SUCCESS").write_text("[]")
    return root


def test_glob_is_sorted(corpus: Path) -> None:
    assert read_all("corpus/*.txt") == ["a1", "b1", "b2"]
    assert [Path(s.path or "").name for s in plan_splits("corpus/*.txt")] == ["a.txt", "b.txt"]


def test_recursive_glob(corpus: Path) -> None:
    assert read_all("corpus/**/*.txt") == ["a1", "b1", "b2", "d1"]


def test_directory_reads_its_files_sorted_skipping_hidden_and_subdirectories(
    corpus: Path,
) -> None:
    assert read_all("corpus") == ["a1", "b1", "b2", "c1"]
    assert read_all(corpus) == ["a1", "b1", "b2", "c1"]  # a Path works too


def test_list_keeps_its_order_and_reads_a_file_once(corpus: Path) -> None:
    assert read_all(["corpus/c.log", "corpus/*.txt", corpus / "a.txt"]) == ["c1", "a1", "b1", "b2"]


def test_paths_are_absolute_in_splits(corpus: Path) -> None:
    (split,) = plan_splits("corpus/a.txt")
    assert split.path == str(corpus / "a.txt")
    assert split.describe() == "corpus/a.txt, bytes 0-3"


def test_pattern_matching_nothing_is_an_error_at_planning(corpus: Path) -> None:
    with pytest.raises(InputError, match=r"No file matches the pattern 'corpus/\*\.csv'"):
        plan_splits("corpus/*.csv")


def test_missing_file_is_an_error_at_planning(corpus: Path) -> None:
    with pytest.raises(InputError, match=r"corpus/nope\.txt: no such file or directory") as info:
        plan_splits(["corpus/a.txt", "corpus/nope.txt"])
    assert info.value.path == str(corpus / "nope.txt")


def test_directory_without_files_is_an_error(corpus: Path) -> None:
    (corpus / "empty").mkdir()
    (corpus / "empty" / ".x").write_text("x")
    with pytest.raises(InputError, match="the directory has no files to read"):
        plan_splits("corpus/empty")


# --------------------------------------------------------------------------- formats


def test_gzip_file_is_one_split_read_whole(tmp_path: Path) -> None:
    text = random_text(random.Random(5)) * 50
    path = tmp_path / "a.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    splits = list(plan_splits(str(path), split_bytes=10))
    assert len(splits) == 1
    assert splits[0].compression == "gzip"
    assert splits[0].end == -1
    assert list(read_split(splits[0])) == text.splitlines()
    assert splits[0].describe().endswith("a.txt.gz (whole file)")


def test_gzip_jsonl_takes_the_inner_suffix(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a": 1}\n[2]\n'))
    (split,) = plan_splits(str(path))
    assert split.format == "jsonl"
    assert list(read_split(split)) == [{"a": 1}, [2]]


@pytest.mark.parametrize("split_bytes", [1, 13, 1000])
def test_jsonl_records_skip_blank_lines(tmp_path: Path, split_bytes: int) -> None:
    values: list[dict[str, Any]] = [{"i": i, "word": "é" * (i % 5)} for i in range(40)]
    lines = []
    for v in values:
        lines.append(json.dumps(v, ensure_ascii=False))
        if v["i"] % 7 == 0:
            lines.append("   ")
    path = tmp_path / "a.ndjson"
    path.write_text("\n".join(lines) + "\n")
    assert read_all(str(path), split_bytes=split_bytes) == values


def test_format_overrides_the_suffix(tmp_path: Path) -> None:
    path = tmp_path / "data.log"
    path.write_text('{"a": 1}\n')
    assert read_all(str(path)) == ['{"a": 1}']
    assert read_all(str(path), format="jsonl") == [{"a": 1}]


def write_csv(path: Path, rows: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.parametrize("split_bytes", [1, 10, 64, 10_000])
def test_csv_every_split_uses_the_header(tmp_path: Path, split_bytes: int) -> None:
    rows = [["name", "count", "note"]]
    rows += [[f"w{i}", str(i), "a, b" if i % 3 else ""] for i in range(30)]
    path = tmp_path / "t.csv"
    write_csv(path, rows)
    with open(path, newline="") as f:
        expected = list(csv.DictReader(f))
    splits = list(plan_splits(str(path), split_bytes=split_bytes))
    assert (len(splits) > 1) == (split_bytes < path.stat().st_size)
    assert read_all(str(path), split_bytes=split_bytes) == expected


def test_csv_short_rows_get_none_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,c\r\n1,2,3\r\n\r\n4\r\n")
    assert read_all(str(path)) == [{"a": "1", "b": "2", "c": "3"}, {"a": "4", "b": None, "c": None}]


def test_csv_multiline_field_needs_one_split_per_file(tmp_path: Path) -> None:
    rows = [["k", "text"]] + [[str(i), f"line one\nline two {i}"] for i in range(20)]
    path = tmp_path / "m.csv"
    write_csv(path, rows)
    with open(path, newline="") as f:
        expected = list(csv.DictReader(f))
    assert read_all(str(path), split_bytes=0) == expected
    assert expected[0]["text"] == "line one\nline two 0"
    with pytest.raises(InputError, match="pass split_bytes=0") as info:
        read_all(str(path), split_bytes=50)
    assert info.value.where is not None
    assert info.value.where.startswith("line ")


def test_split_bytes_zero_reads_each_file_as_one_split(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("x\n" * 1000)
    assert len(list(plan_splits(str(path), split_bytes=0, min_splits=8))) == 1


@pytest.fixture
def parquet_file(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"id": i, "word": f"w{i}", "x": i / 3} for i in range(100)]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=10)
    return path, rows


def test_parquet_row_groups_make_splits(parquet_file: tuple[Path, list[dict[str, Any]]]) -> None:
    path, rows = parquet_file
    whole = list(plan_splits(str(path)))
    assert [(s.start, s.end) for s in whole] == [(0, 10)]
    one_each = list(plan_splits(str(path), split_bytes=1))
    assert [(s.start, s.end) for s in one_each] == [(g, g + 1) for g in range(10)]
    assert [r for s in one_each for r in read_split(s)] == rows
    assert one_each[3].describe().endswith("data.parquet, row groups 3-3")


def test_parquet_min_splits_groups_row_groups(
    parquet_file: tuple[Path, list[dict[str, Any]]],
) -> None:
    path, rows = parquet_file
    splits = list(plan_splits(str(path), min_splits=3, min_split_bytes=1))
    assert len(splits) >= 3
    assert next(s.start for s in splits) == 0
    assert splits[-1].end == 10
    assert all(a.end == b.start for a, b in itertools.pairwise(splits))
    assert [r for s in splits for r in read_split(s)] == rows


def test_parquet_locate_names_row_group_and_row(
    parquet_file: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = parquet_file
    monkeypatch.chdir(path.parent)
    split = list(plan_splits(str(path), split_bytes=1))[2]  # row group 2 alone
    assert locate(split, 7) == "data.parquet row group 2 row 7"
    (whole,) = plan_splits(str(path))
    assert locate(whole, 27) == "data.parquet row group 2 row 7"


def test_corrupt_parquet_is_an_input_error(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(InputError, match=r"bad\.parquet: is not a valid Parquet file"):
        plan_splits(str(path))


def test_parquet_truncated_after_planning(
    parquet_file: tuple[Path, list[dict[str, Any]]],
) -> None:
    path, _ = parquet_file
    (split,) = plan_splits(str(path))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(InputError, match="cannot be read as Parquet"):
        list(read_split(split))


def test_missing_pyarrow_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'paralela\[parquet\]'") as info:
        _formats.pyarrow_parquet()
    assert info.value.extra == "parquet"
    assert "Reading Parquet inputs" in str(info.value)


# --------------------------------------------------------------------------- records


def test_records_from_a_list_in_chunks() -> None:
    data = [{"i": i} for i in range(25)]
    splits = list(plan_splits(data, records_per_split=10))
    assert [(s.start, s.end) for s in splits] == [(0, 10), (10, 20), (20, 25)]
    assert [r for s in splits for r in read_split(s)] == data
    assert splits[1].describe() == "records 10-19"
    assert locate(splits[1], 3) == "records item 13"


def test_records_from_a_generator_are_pulled_lazily() -> None:
    pulled: list[int] = []

    def gen() -> Iterator[int]:
        for i in range(1000):
            pulled.append(i)
            yield i

    splits = plan_splits(gen(), records_per_split=100)
    first = next(splits)
    assert list(read_split(first)) == list(range(100))
    assert len(pulled) == 100  # the generator is not exhausted
    assert sum(len(list(read_split(s))) for s in splits) == 900


def test_records_from_a_range_and_strings_with_format_records() -> None:
    assert read_all(range(5), records_per_split=2) == [0, 1, 2, 3, 4]
    assert read_all(["a b", "c"], format="records") == ["a b", "c"]


def test_ambiguous_or_wrong_inputs_are_rejected() -> None:
    with pytest.raises(ConfigError, match="a string is always a path or a glob"):
        plan_splits("a b c", format="records")
    with pytest.raises(InputError, match="mixes paths and records"):
        plan_splits(["a.txt", 3])
    with pytest.raises(InputError, match="empty list"):
        plan_splits([])
    with pytest.raises(ConfigError, match="inputs must be"):
        plan_splits(42)
    with pytest.raises(ConfigError, match="Unknown input format 'xml'"):
        plan_splits(range(3), format="xml")
    with pytest.raises(ConfigError, match="split_bytes must be an integer >= 0"):
        plan_splits(range(3), split_bytes=-1)
    with pytest.raises(ConfigError, match="convert them to utf-8"):
        plan_splits(range(3), encoding="utf-16")


# --------------------------------------------------------------------------- splitting


def test_min_splits_spreads_one_file(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    lines = [f"line {i} " + "x" * (i % 50) for i in range(40_000)]
    path.write_text("\n".join(lines) + "\n")
    splits = list(plan_splits(str(path), min_splits=6))
    assert len(splits) >= 6
    sizes = [s.size for s in splits]
    assert max(sizes) - min(sizes) <= 1  # even ranges
    assert [r for s in splits for r in read_split(s)] == lines


@pytest.mark.parametrize("extra", [0, 1, 5, 7])
def test_min_splits_cuts_one_file_into_exactly_that_many(tmp_path: Path, extra: int) -> None:
    # One more split than asked (9 for 4 per worker on 2 workers) leaves a worker idle
    # for a whole split's time at the end: a file whose size min_splits does not divide
    # must still give min_splits splits.
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * 99 + b"\n" + b"y" * (8 * 40_000 + extra - 100))
    for min_splits in (2, 6, 8):
        splits = list(plan_splits(str(path), min_splits=min_splits, min_split_bytes=1))
        assert len(splits) == min_splits, (min_splits, extra)
        assert sum(s.size for s in splits) == path.stat().st_size


def test_min_splits_does_not_cut_a_small_file(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_text("hello\n" * 150)  # 900 bytes
    assert len(list(plan_splits(str(path), min_splits=4))) == 1
    fine = list(plan_splits(str(path), min_splits=4, min_split_bytes=1))
    assert len(fine) >= 4
    assert [r for s in fine for r in read_split(s)] == ["hello"] * 150


def test_gzip_files_count_toward_min_splits(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"{i}.txt.gz").write_bytes(gzip.compress(b"a\n" * 10))
    splits = list(plan_splits(str(tmp_path), min_splits=2))
    assert len(splits) == 3
    assert all(s.end == -1 for s in splits)


# --------------------------------------------------------------------------- locate


def test_locate_gives_the_files_line_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "a.txt"
    lines = [f"{i}" * (i % 9) for i in range(200)]
    path.write_text("\n".join(lines) + "\n")
    for split in plan_splits("a.txt", split_bytes=97):
        for k, record in enumerate(read_split(split)):
            where = locate(split, k)
            number = int(where.rsplit(" ", 1)[1])
            assert where == f"a.txt line {number}"
            assert lines[number - 1] == record


def test_locate_jsonl_and_csv_and_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.jsonl").write_text("1\n\n2\n   \n3\n")
    splits = list(plan_splits("a.jsonl", split_bytes=3))
    found = [(r, locate(s, k)) for s in splits for k, r in enumerate(read_split(s))]
    assert found == [(1, "a.jsonl line 1"), (2, "a.jsonl line 3"), (3, "a.jsonl line 5")]
    Path("t.csv").write_text("a,b\n1,2\n\n3,4\n5,6\n")
    splits = list(plan_splits("t.csv", split_bytes=4))
    found = [(r["a"], locate(s, k)) for s in splits for k, r in enumerate(read_split(s))]
    assert found == [("1", "t.csv line 2"), ("3", "t.csv line 4"), ("5", "t.csv line 5")]
    Path("g.txt.gz").write_bytes(gzip.compress(b"x\ny\nz\n"))
    (split,) = plan_splits("g.txt.gz")
    assert locate(split, 2) == "g.txt.gz line 3"


def test_locate_never_raises(tmp_path: Path) -> None:
    path = tmp_path / "gone.jsonl"
    path.write_text("1\n")
    (split,) = plan_splits(str(path))
    path.unlink()
    assert locate(split, 0).endswith(", record 0")


# --------------------------------------------------------------------------- errors


def test_invalid_utf8_names_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("corpus").mkdir()
    Path("corpus/b.txt").write_bytes(b"one\ntwo\r\nthree\xff four\nfive\n")
    with pytest.raises(InputError) as info:
        read_all("corpus/b.txt", split_bytes=1)
    assert str(info.value) == (
        "corpus/b.txt line 3: byte 0xff at column 6 is not valid utf-8; re-encode the file, "
        "or pass encoding='latin-1' if that is what it is"
    )
    assert info.value.where == "line 3"
    assert info.value.path == str(tmp_path / "corpus" / "b.txt")
    assert read_all("corpus/b.txt", encoding="latin-1")[2] == "three\xff four"
    restored = pickle.loads(pickle.dumps(info.value))
    assert restored.where == "line 3"
    assert str(restored) == str(info.value)


def test_invalid_utf8_in_gzip(tmp_path: Path) -> None:
    path = tmp_path / "b.txt.gz"
    path.write_bytes(gzip.compress(b"ok\n\xc3(\n"))
    with pytest.raises(InputError, match=r"b.txt.gz line 2: byte 0xc3 at column 1"):
        read_all(str(path))


def test_malformed_json_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.jsonl").write_text('{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(InputError, match=r"^a.jsonl line 3: not valid JSON: ") as info:
        read_all("a.jsonl")
    assert "fix or remove that line" in str(info.value)
    assert info.value.where == "line 3"


def test_csv_row_with_too_many_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("t.csv").write_text("a,b\n1,2\n3,4,5\n")
    with pytest.raises(InputError) as info:
        read_all("t.csv", split_bytes=5)
    assert str(info.value).startswith("t.csv line 3: 3 fields, but the header (line 1) names 2")
    assert info.value.where == "line 3"


def test_unreadable_file_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("x\n")
    (split,) = plan_splits(str(path))
    real_open = open

    def deny(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(InputError, match=r"secret\.txt: cannot be read: Permission denied"):
        list(read_split(split))
    with pytest.raises(InputError, match=r"secret\.txt: cannot be read: Permission denied"):
        plan_splits(str(path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_for_real(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("x\n")
    path.chmod(0)
    with pytest.raises(InputError, match="Permission denied"):
        plan_splits(str(path))


def test_directory_given_where_a_file_was_planned(tmp_path: Path) -> None:
    split = Split(0, "text", str(tmp_path), 0, 10, size=10)
    with pytest.raises(InputError, match="cannot be read: Is a directory"):
        list(read_split(split))


def test_file_that_shrank_or_vanished_since_planning(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("line\n" * 100)
    splits = list(plan_splits(str(path), split_bytes=100))
    path.write_text("line\n" * 10)
    with pytest.raises(InputError, match=r"the file is now 50 bytes, but it had at least 500"):
        list(read_split(splits[-1]))
    path.unlink()
    with pytest.raises(InputError, match="the file no longer exists"):
        list(read_split(splits[0]))


def test_corrupt_gzip(tmp_path: Path) -> None:
    good = gzip.compress(b"hello\n" * 10_000)
    (tmp_path / "cut.txt.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "plain.txt.gz").write_bytes(b"not gzip at all\n")
    for name in ("cut.txt.gz", "plain.txt.gz"):
        (split,) = plan_splits(str(tmp_path / name))
        with pytest.raises(InputError, match=f"{name}: is not a valid gzip file") as info:
            list(read_split(split))
        assert "gzip -t" in str(info.value)


# --------------------------------------------------------------------------- identity


def test_input_identity_is_stable_and_follows_changes(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("x\n" * 100)
    first = input_identity(list(plan_splits(str(path), split_bytes=50)))
    assert input_identity(list(plan_splits(str(path), split_bytes=50))) == first
    assert input_identity(list(plan_splits(str(path), split_bytes=70))) != first
    stat = path.stat()
    path.write_text("y\n" * 100)  # same size, other content: the time tells
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert input_identity(list(plan_splits(str(path), split_bytes=50))) != first
    path.write_text("y\n" * 101)
    assert input_identity(list(plan_splits(str(path), split_bytes=50))) != first


def test_input_identity_of_records() -> None:
    one = input_identity(list(plan_splits([{"a": 1}, {"a": 2}])))
    assert input_identity(list(plan_splits([{"a": 1}, {"a": 2}]))) == one
    assert input_identity(list(plan_splits([{"a": 1}, {"a": 3}]))) != one
    assert input_identity(list(plan_splits(iter([{"a": 1}, {"a": 2}])))) == one


def test_split_pickles_small_and_reads_after_pickling(tmp_path: Path) -> None:
    path = tmp_path / ("d" * 40) / "a.txt"
    path.parent.mkdir()
    path.write_text("word\n" * 100_000)
    splits = list(plan_splits(str(path), split_bytes=100_000))
    data = pickle.dumps(splits[3])
    assert len(data) < 250 + len(str(path))
    copy = pickle.loads(data)
    assert copy == splits[3]
    assert list(read_split(copy)) == list(read_split(splits[3]))
    assert "bytes 300,0" in repr(splits[3])


def test_reading_from_a_stream_of_small_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks put block boundaries everywhere: inside "\r\n", inside UTF-8 characters.
    monkeypatch.setattr(_formats, "BLOCK_BYTES", 3)
    monkeypatch.setattr(_formats._chunks, "__defaults__", (3,))
    text = "héllo\r\nwörld 🙂\n\nlast"
    path = tmp_path / "a.txt"
    path.write_bytes(text.encode())
    for split_bytes in (1, 5, 100):
        assert read_all(str(path), split_bytes=split_bytes) == ["héllo", "wörld 🙂", "", "last"]


def test_utf8_sig_drops_the_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfname,n\r\nw,1\r\nv,2\r\n")
    assert read_all(str(path), encoding="utf-8-sig", split_bytes=8) == [
        {"name": "w", "n": "1"},
        {"name": "v", "n": "2"},
    ]
    assert next(iter(read_all(str(path))[0])) == "\ufeffname"  # utf-8 keeps it, as Python does


def test_unpicklable_records_have_no_identity() -> None:
    with pytest.raises(UnpicklableError, match="records 0-0: the records cannot be pickled"):
        input_identity(list(plan_splits([threading.Lock()])))


def test_batches_are_lists_holding_the_same_records_as_read_split(
    parquet_file: tuple[Path, list[dict[str, Any]]],
) -> None:
    folder = parquet_file[0].parent
    (folder / "a.txt").write_text("x\n\ny\r\n" * 50)
    (folder / "b.jsonl").write_text('{"k": 1}\n\n[1, 2]\n' * 50)
    (folder / "c.csv").write_text("h1,h2\n" + "1,2\n" * 5000)
    (folder / "d.txt.gz").write_bytes(gzip.compress(b"z\n" * 10))
    inputs: list[Any] = [str(folder), list(range(25))]
    for item in inputs:
        for split in plan_splits(item, split_bytes=64, records_per_split=10):
            batches = list(read_split_batches(split))
            assert all(isinstance(batch, list) and batch for batch in batches)
            assert [r for batch in batches for r in batch] == list(read_split(split))


# -- map tasks: small splits joined --------------------------------------------------


def _files(directory: Path, sizes: list[int]) -> list[str]:
    directory.mkdir(exist_ok=True)
    paths = []
    for i, size in enumerate(sizes):
        path = directory / f"f{i:03d}.txt"
        path.write_bytes((b"x" * 99 + b"\n") * (size // 100))
        paths.append(str(path))
    return paths


def test_small_files_are_joined_into_as_many_tasks_as_asked(tmp_path: Path) -> None:
    files = _files(tmp_path / "in", [10_000] * 16)
    splits = list(plan_splits(files, min_splits=4))
    assert len(splits) == 16  # one split per file: each is far below split_bytes
    tasks = list(group_splits(splits, 64 << 20, 4))
    assert [len(t) for t in tasks] == [4, 4, 4, 4]
    assert [s for t in tasks for s in t] == splits  # every split once, in order


def test_a_task_never_passes_split_bytes(tmp_path: Path) -> None:
    files = _files(tmp_path / "in", [10_000] * 40)
    tasks = list(group_splits(plan_splits(files, split_bytes=30_000), 30_000, 2))
    assert all(sum(s.size for s in t) <= 30_000 for t in tasks)
    assert sum(len(t) for t in tasks) == 40
    assert len(tasks) == 14  # 3 files of 10 kB, then 2 at the end


def test_pieces_of_a_cut_file_stay_tasks_of_their_own(tmp_path: Path) -> None:
    files = _files(tmp_path / "in", [100_000, 100_000])
    splits = list(plan_splits(files, split_bytes=40_000))
    assert len(splits) == 6  # each file cut in 3 pieces near the target
    assert [len(t) for t in group_splits(splits, 40_000, 2)] == [1] * 6


def test_split_bytes_zero_and_records_join_nothing(tmp_path: Path) -> None:
    files = _files(tmp_path / "in", [1_000] * 5)
    whole = list(plan_splits(files, split_bytes=0))
    assert [len(t) for t in group_splits(whole, 0, 1)] == [1] * 5

    pulled: list[int] = []

    def records() -> Iterator[int]:
        for i in range(50):
            pulled.append(i)
            yield i

    tasks = group_splits(plan_splits(records(), records_per_split=10), 64 << 20, 1)
    first = next(tasks)  # lazily: one split of records read, not the whole generator
    assert len(first) == 1
    assert first[0].records == tuple(range(10))
    assert len(pulled) <= 11
    assert [len(t) for t in tasks] == [1] * 4
    assert list(group_splits(iter(()), 64 << 20, 4)) == []
