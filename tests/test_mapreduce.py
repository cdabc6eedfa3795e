"""``paralela.mapreduce`` on the local engine: exact answers, spills, outputs, errors."""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import random
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    InputError,
    UnpicklableError,
    UserFunctionError,
)
from paralela.mapreduce import MapReduceResult, parse_size

WORD = re.compile(r"\w+")


# -- the jobs (module level: workers import them from here) -----------------------------


def words(line: str) -> Iterator[tuple[str, int]]:
    for word in WORD.findall(line.lower()):
        yield word, 1


def total(_key: Any, counts: Iterable[int]) -> int:
    return sum(counts)


def word_list(line: str) -> list[tuple[str, int]]:
    return [(w, 1) for w in line.split()]


def label_mapping(record: dict[str, Any]) -> dict[str, float]:
    return {record["label"]: record["x"]}


def mean(_key: Any, values: Iterable[float]) -> float:
    xs = list(values)
    return sum(xs) / len(xs)


def fails_on_zeta(line: str) -> Iterator[tuple[str, int]]:
    for word in line.split():
        if word == "zeta":
            raise ValueError(f"no zeta allowed: {word}")
        yield word, 1


def yields_a_bare_word(line: str) -> Iterator[Any]:
    yield from line.split()


def fails_on_beta(key: str, values: Iterable[int]) -> int:
    if key == "beta":
        raise KeyError("beta is not welcome")
    return sum(values)


# -- the corpus ------------------------------------------------------------------------


def make_corpus(directory: Path, files: int = 4, lines: int = 400, seed: int = 7) -> Path:
    """Text files of Zipf-ish words with Unicode, empty lines and one very long line."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(300)] + ["straße", "niño", "日本", "данные", "ÉTÉ"]
    weights = [1 / (i + 1) for i in range(len(vocabulary))]
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        rows = []
        for i in range(lines):
            if i % 17 == 0:
                rows.append("")
                continue
            rows.append(" ".join(rng.choices(vocabulary, weights, k=rng.randint(1, 12))))
        if n == 1:  # a line far longer than a split (split_bytes below)
            rows.insert(5, " ".join(rng.choices(vocabulary, k=1500)))
        (directory / f"doc{n}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return directory


def expected_counts(directory: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in sorted(directory.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            counts.update(w for w, _ in words(line))
    return counts


def line_count(directory: Path) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in directory.glob("*.txt"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


# -- exact answers ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["processes", "sequential"])
def test_word_count_equals_a_counter(corpus: Path, backend: str) -> None:
    result = paralela.mapreduce(
        words, total, str(corpus / "*.txt"), combiner=total, backend=backend, workers=2,
        split_bytes=4096,
    )  # fmt: skip
    expected = expected_counts(corpus)
    assert result.to_dict() == dict(expected)
    assert len(result) == len(expected)
    s = result.summary
    assert s.records == line_count(corpus)
    assert s.pairs_emitted == sum(expected.values())
    assert s.pairs_after_combining < s.pairs_emitted  # the combiner summed on the map side
    assert s.splits > 4  # 4 files, each split at 4 KiB (the long line in one split)
    assert s.map_tasks == s.splits
    assert s.reduce_tasks == 2 * s.workers  # the default partitions
    assert s.bytes_shuffled > 0
    assert s.wall_seconds >= s.map_seconds + s.reduce_seconds > 0
    assert "records" in str(s)
    assert "keys" in str(s)


def test_without_combiner_every_pair_is_shuffled_and_the_answer_is_the_same(
    corpus: Path,
) -> None:
    result = paralela.mapreduce(words, total, [str(p) for p in sorted(corpus.glob("*.txt"))],
                                workers=2, partitions=3)  # fmt: skip
    assert result.to_dict() == dict(expected_counts(corpus))
    assert result.summary.pairs_after_combining == result.summary.pairs_emitted
    assert result.summary.reduce_tasks == 3


def test_a_small_memory_limit_spills_many_times_and_stays_exact(tmp_path: Path) -> None:
    big = make_corpus(tmp_path / "big", files=2, lines=8000)
    result = paralela.mapreduce(
        words, total, str(big), combiner=total, workers=2, memory_limit="16KiB",
    )  # fmt: skip
    assert result.to_dict() == dict(expected_counts(big))
    # The buffer is checked every few thousand pairs: each check over the limit spills.
    assert result.summary.spills > 3 * result.summary.map_tasks
    assert result.summary.memory_limit == 16 * 1024


# What a worker may hold beyond memory_limit: the mapreduce modules it imports (~5 MiB),
# a 1 MiB block of input and its lines, the pickle of a spill record, the merge's read
# buffers, and the allocator's slack. Measured: +18 MiB at a 4 MiB limit, +24 MiB at 8.
RSS_MARGIN = 32 << 20


def test_every_worker_stays_within_the_memory_limit_plus_a_margin(tmp_path: Path) -> None:
    import threading

    import psutil

    from paralela.backends import ProcessBackend

    rng = random.Random(5)
    corpus = tmp_path / "keys"
    corpus.mkdir()
    for f in range(2):  # many distinct keys: the combiner cannot shrink the buffer
        rows = (" ".join(f"k{rng.randrange(10**6)}" for _ in range(8)) for _ in range(30_000))
        (corpus / f"{f}.txt").write_text("\n".join(rows) + "\n")
    limit = 8 << 20
    others = {p.pid for p in psutil.Process().children()}  # shared pools of other tests
    backend = ProcessBackend(2)
    try:
        paralela.map(abs, range(8), backend=backend)  # start the workers
        workers = [p for p in psutil.Process().children() if p.pid not in others]
        assert len(workers) == 2
        base = {w.pid: w.memory_info().rss for w in workers}
        peak = dict(base)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.005):
                for w in workers:
                    with contextlib.suppress(psutil.Error):  # a worker died: it fails below
                        peak[w.pid] = max(peak[w.pid], w.memory_info().rss)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            result = paralela.mapreduce(words, total, str(corpus), combiner=total,
                                        backend=backend, memory_limit=limit)  # fmt: skip
        finally:
            done.set()
            sampler.join()
    finally:
        backend.shutdown()
    assert result.to_dict() == dict(expected_counts(corpus))
    assert result.summary.spills > 2 * result.summary.map_tasks
    for w in workers:
        growth = peak[w.pid] - base[w.pid]
        assert growth < limit + RSS_MARGIN, f"worker {w.pid} grew {growth >> 20} MiB"


def test_the_result_is_lazy_and_re_iterable(corpus: Path) -> None:
    result = paralela.mapreduce(words, total, str(corpus / "*.txt"), workers=2)
    assert isinstance(result, MapReduceResult)
    first = list(result)
    assert list(result) == first  # read again from the partition files
    assert len(first) == len(result) == len(dict(first))
    assert not result.output_files


def test_an_iterable_of_records_and_a_mapper_returning_a_mapping() -> None:
    rng = random.Random(3)
    records: list[dict[str, Any]] = [
        {"label": rng.choice("abc"), "x": rng.random()} for _ in range(2500)
    ]
    result = paralela.mapreduce(
        label_mapping, mean, (r for r in records), workers=2, records_per_split=300
    )  # a generator: read one split at a time as the map tasks start
    by_label: dict[str, list[float]] = collections.defaultdict(list)
    for r in records:
        by_label[r["label"]].append(r["x"])
    got = result.to_dict()
    assert got.keys() == by_label.keys()
    for label, xs in by_label.items():
        assert got[label] == pytest.approx(sum(xs) / len(xs))
    assert result.summary.splits == 9
    assert result.summary.records == 2500


def test_a_mapper_returning_a_list_on_threads(corpus: Path) -> None:
    lines = [line for p in sorted(corpus.glob("*.txt")) for line in p.read_text().splitlines()]
    result = paralela.mapreduce(
        word_list, total, lines, backend="threads", workers=2, input_format="records"
    )
    assert result.to_dict() == dict(collections.Counter(w for line in lines for w in line.split()))


def test_the_module_is_callable_too(corpus: Path) -> None:
    import paralela.mapreduce as module

    result = module(words, total, str(corpus / "doc0.txt"), backend="sequential")  # type: ignore[operator]
    expected = collections.Counter(
        w for line in (corpus / "doc0.txt").read_text().splitlines() for w, _ in words(line)
    )
    assert result.to_dict() == dict(expected)


# -- output files ----------------------------------------------------------------------


def test_jsonl_output_files_round_trip(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "counts"
    result = paralela.mapreduce(words, total, str(corpus), combiner=total, workers=2,
                                partitions=3, output=out)  # fmt: skip
    parts = sorted(out.glob("part-*.jsonl"))
    assert [p.name for p in parts] == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    assert result.output_files == [str(p) for p in parts]
    from_files = {}
    for part in parts:
        for line in part.read_text(encoding="utf-8").splitlines():
            obj = json.loads(line)
            from_files[obj["key"]] = obj["value"]
    assert from_files == dict(expected_counts(corpus)) == result.to_dict()
    success = json.loads((out / "_SUCCESS").read_text())
    assert [p["file"] for p in success["parts"]] == [p.name for p in parts]
    assert success["pairs"] == len(from_files)
    assert not list(out.glob(".tmp-*"))
    # Run again into the same directory with fewer partitions: stale parts go.
    again = paralela.mapreduce(words, total, str(corpus), workers=2, partitions=2, output=out)
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert again.to_dict() == from_files
    # A run that fails there leaves no _SUCCESS vouching for the parts.
    with pytest.raises(UserFunctionError):
        paralela.mapreduce(words, fails_on_beta, ["alpha beta"], input_format="records",
                           backend="sequential", output=out)  # fmt: skip
    assert not (out / "_SUCCESS").exists()


def test_parquet_output_files_round_trip(corpus: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "counts"
    result = paralela.mapreduce(words, total, str(corpus), combiner=total, workers=2,
                                output=out, output_format="parquet")  # fmt: skip
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == dict(expected_counts(corpus)) == result.to_dict()


def mod_three(x: int) -> list[tuple[int, int]]:
    return [(x % 3, x)]


def test_parquet_parts_of_empty_partitions_share_the_others_schema(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out"
    paralela.mapreduce(mod_three, total, list(range(30)), backend="sequential", partitions=8,
                       output=out, output_format="parquet")  # fmt: skip
    assert len(list(out.glob("part-*.parquet"))) == 8  # one per partition, 5 of them empty
    table = pq.read_table(out)  # one schema for the directory, from whichever file
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == {0: sum(range(0, 30, 3)), 1: sum(range(1, 30, 3)), 2: sum(range(2, 30, 3))}


def test_an_output_directory_holding_other_files_is_refused(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds other files \(notes.txt\)"):
        paralela.mapreduce(words, total, str(corpus), backend="sequential", output=tmp_path)


def test_the_temporary_directory_goes_with_the_result(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = paralela.mapreduce(words, total, str(corpus / "doc0.txt"), backend="sequential")
    [job_dir] = tmp_path.glob("paralela-mapreduce-*")
    assert not (job_dir / "spills").exists()  # spills removed once the job is done
    assert len(list(result)) == len(result)
    del result
    gc.collect()
    assert not job_dir.exists()
    paralela.mapreduce(words, total, str(corpus / "doc0.txt"), backend="sequential",
                       output=tmp_path / "out")  # fmt: skip
    assert not list(tmp_path.glob("paralela-mapreduce-*"))


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["processes", "sequential"])
def test_a_mapper_that_raises_names_the_file_line_and_record(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.txt").write_text("alpha beta\n\ngamma\n")
    (tmp_path / "b.txt").write_text("delta\nepsilon zeta eta\ntheta\n")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(fails_on_zeta, total, str(tmp_path / "*.txt"), backend=backend,
                           workers=2)  # fmt: skip
    assert list((tmp_path / "tmp").iterdir()) == []  # the job's directory went with it
    error = info.value
    assert error.function == "mapper"
    assert error.where is not None
    assert error.where.endswith("b.txt line 2")
    assert "'epsilon zeta eta'" in str(error)
    assert "ValueError: no zeta allowed: zeta" in str(error)
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "no zeta allowed: zeta"


def test_a_mapper_that_yields_no_pair_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one two\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(yields_a_bare_word, total, str(tmp_path / "a.txt"), workers=2)
    assert info.value.function == "mapper"
    assert "a.txt line 1" in str(info.value)
    assert "'one'" in str(info.value)


def bigrams_without_a_value(line: str) -> Iterator[Any]:
    for i in range(len(line) - 1):
        yield line[i : i + 2]  # a 2-character string unpacks as a pair: ('t', 'h')


def bigram_list_without_a_value(line: str) -> list[Any]:
    return list(bigrams_without_a_value(line))


def values_seen(_key: Any, values: Iterable[Any]) -> list[Any]:
    return sorted(values)


@pytest.mark.parametrize("mapper", [bigrams_without_a_value, bigram_list_without_a_value])
@pytest.mark.parametrize("combiner", [None, values_seen])
def test_a_mapper_that_yields_two_item_strings_is_named_not_counted(
    tmp_path: Path, mapper: Callable[[str], Any], combiner: Any
) -> None:
    """`k, v = kv` takes any 2-item iterable: a bigram without its value is not a pair
    ('t', 'h'), and the mapper, not the reducer or nobody, is named for it."""
    (tmp_path / "a.txt").write_text("the theme\nthat\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(mapper, values_seen, str(tmp_path / "a.txt"), combiner=combiner,
                           workers=2)  # fmt: skip
    assert info.value.function == "mapper"
    assert "'th' (a str)" in str(info.value)
    assert "not a (key, value) pair" in str(info.value)
    assert "a.txt line 1" in str(info.value)


def none_for_b(line: str) -> list[tuple[str, int]] | None:
    return None if line == "b" else [(line, 1)]


def test_a_mapper_that_returns_none_for_a_record_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\nb\nc\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(none_for_b, total, str(tmp_path / "a.txt"), workers=2)
    assert "returned something that is not an iterable of (key, value) pairs" in str(info.value)
    assert info.value.where is not None
    assert info.value.where.endswith("a.txt line 2")


def lock_for_gamma(line: str) -> Iterator[tuple[str, Any]]:
    for word in line.split():
        yield word, (threading.Lock() if word == "gamma" else 1)


def lock_as_key_for_gamma(line: str) -> Iterator[tuple[Any, int]]:
    for word in line.split():
        yield (threading.Lock() if word == "gamma" else word), 1


def lock_combiner(key: str, values: Iterable[Any]) -> Any:
    return threading.Lock() if key == "beta" else sum(values)


@pytest.mark.parametrize("backend", ["processes", "sequential"])
@pytest.mark.parametrize("memory_limit", ["64MiB", "32KiB"], ids=["at-close", "mid-split"])
def test_a_mapper_value_that_cannot_be_pickled_names_the_mapper_record_and_key(
    tmp_path: Path, backend: str, memory_limit: str
) -> None:
    """The shuffle pickles values when it spills, long after the mapper yielded them
    (at the task's end, or at a spill 1,000 records later): the error still names the
    mapper, the record that yielded the value (file and line) and the key."""
    lines = ["alpha beta", "beta", "delta gamma", *(f"filler {i}" for i in range(2000))]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(lock_for_gamma, total, str(tmp_path / "a.txt"), backend=backend,
                           workers=2, memory_limit=memory_limit)  # fmt: skip
    error = info.value
    assert error.function == "mapper"
    assert error.where is not None
    assert error.where.endswith("a.txt line 3")
    text = str(error)
    assert "cannot be pickled" in text
    assert "for key 'gamma'" in text
    assert "record 'delta gamma'" in text
    assert "TypeError: cannot pickle '_thread.lock' object" in text
    assert isinstance(error.__cause__, TypeError)


def test_a_mapper_key_that_cannot_be_pickled_names_the_record(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\nbeta gamma\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(lock_as_key_for_gamma, total, str(tmp_path / "a.txt"), workers=2)
    assert info.value.function == "mapper"
    assert "the key <unlocked _thread.lock object" in str(info.value)
    assert "cannot be pickled" in str(info.value)
    assert "a.txt line 2, record 'beta gamma'" in str(info.value)


def test_a_combiner_value_that_cannot_be_pickled_names_the_combiner_and_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("alpha beta\nbeta\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(word_list, total, str(tmp_path / "a.txt"), combiner=lock_combiner,
                           workers=2)  # fmt: skip
    assert info.value.function == "combiner"
    assert "The combiner returned" in str(info.value)
    assert "for key 'beta'" in str(info.value)
    assert "cannot be pickled" in str(info.value)


def test_a_reducer_that_raises_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha beta\nbeta gamma\n")
    with pytest.raises(UserFunctionError) as info:
        paralela.mapreduce(word_list, fails_on_beta, str(tmp_path / "a.txt"), workers=2)
    assert info.value.function == "reducer"
    assert info.value.where == "'beta'"
    assert "'beta'" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine words\n")
    (tmp_path / "bad.txt").write_bytes(b"first line\nsecond \xff\xfe line\n")
    with pytest.raises(InputError) as info:
        paralela.mapreduce(words, total, str(tmp_path / "*.txt"), workers=2)
    assert info.value.path is not None
    assert info.value.path.endswith("bad.txt")
    assert info.value.where == "line 2"
    assert "bad.txt" in str(info.value)


def test_a_damaged_gzip_input_is_an_input_error_naming_it(tmp_path: Path) -> None:
    import gzip

    good = gzip.compress(b"one two\nthree\n" * 100)
    (tmp_path / "bad.txt.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError) as info:
        paralela.mapreduce(words, total, str(tmp_path / "bad.txt.gz"), workers=2)
    assert info.value.path is not None
    assert info.value.path.endswith("bad.txt.gz")
    assert "bad.txt.gz" in str(info.value)


def test_a_missing_input_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nothing"):
        paralela.mapreduce(words, total, str(tmp_path / "nothing.txt"), workers=2)


def test_a_reducer_value_that_json_cannot_hold_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha beta\n")
    with pytest.raises(UserFunctionError, match=r"key '(alpha|beta)'.*JSON"):
        paralela.mapreduce(word_list, lambda k, vs: set(vs), str(tmp_path / "a.txt"),
                           backend="sequential", output=tmp_path / "out")  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partitions": 0}, "partitions must be a positive integer"),
        ({"engine": "hadoop"}, "Unknown engine 'hadoop'"),
        ({"output_format": "csv"}, "Unknown output_format 'csv'"),
        ({"memory_limit": "12XB"}, "unknown unit 'XB'"),
        ({"memory_limit": -5}, "must be positive"),
        ({"split_bytes": "big"}, "split_bytes must be a number of bytes"),
        ({"master": "local[2]"}, "options of engine='spark'"),
        ({"engine": "spark", "backend": "threads"}, "backend= belong to the local engine"),
        ({"engine": "spark", "workers": 2, "run_dir": "r"}, "workers=, run_dir= belong"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        paralela.mapreduce(words, total, ["x"], **options)


def test_functions_that_are_not_callable_or_cannot_travel() -> None:
    with pytest.raises(ConfigError, match="reducer must be a function"):
        paralela.mapreduce(words, 42, ["x"])  # type: ignore[arg-type]
    lock = __import__("threading").Lock()
    with pytest.raises(UnpicklableError, match="mapper"):
        paralela.mapreduce(lambda r: [(lock, r)], total, ["x"], backend="processes", workers=1)


def test_parse_size() -> None:
    assert parse_size("512MB") == 512 * 1000**2
    assert parse_size("512MiB") == parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size(4096) == 4096
    with pytest.raises(ConfigError, match="memory_limit must be positive, got 0"):
        parse_size(0)


def test_parse_split_bytes_takes_zero_for_one_split_per_file() -> None:
    from paralela.files import parse_split_bytes

    assert parse_split_bytes(0) == parse_split_bytes("0") == parse_split_bytes("0MB") == 0
    assert parse_split_bytes("64MiB") == 64 << 20
    with pytest.raises(ConfigError, match=r"split_bytes must be 0 \(one split per file\) or "):
        parse_split_bytes(-1)


def row_keys(row: dict[str, str]) -> Iterator[tuple[str, int]]:
    assert row["text"].startswith("line one\nline two ")  # a field with a line break
    yield row["k"], 1


def test_csv_with_quoted_line_breaks_runs_with_split_bytes_zero(tmp_path: Path) -> None:
    import csv

    for name in ("a", "b"):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows(
                [["k", "text"]] + [[str(i % 5), f"line one\nline two {i}"] for i in range(400)]
            )
    inputs = str(tmp_path / "*.csv")
    # What the error says to do, when a file is cut in byte ranges ...
    with pytest.raises(InputError, match="pass split_bytes=0 to read each file as one split"):
        paralela.mapreduce(row_keys, total, inputs, workers=2, split_bytes=2000)
    # ... works: one split (one map task) per file.
    for split_bytes in (0, "0"):
        result = paralela.mapreduce(row_keys, total, inputs, workers=2, split_bytes=split_bytes)
        assert result.to_dict() == {str(k): 160 for k in range(5)}
        assert result.summary.map_tasks == 2


# -- the run directory -----------------------------------------------------------------


def test_a_finished_run_directory_is_read_back_without_running_anything(
    corpus: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    first = paralela.mapreduce(words, total, str(corpus), workers=2, run_dir=run_dir)
    again = paralela.mapreduce(words, total, str(corpus), workers=2, run_dir=run_dir)
    assert again.to_dict() == first.to_dict() == dict(expected_counts(corpus))
    assert again.summary.map_tasks_reused == again.summary.map_tasks == first.summary.map_tasks
    assert again.summary.reduce_tasks_reused == again.summary.reduce_tasks
    assert not (run_dir / "spills").exists()


def test_a_run_directory_of_another_job_names_what_changed(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paralela.mapreduce(words, total, str(corpus / "doc0.txt"), backend="sequential",
                       run_dir=run_dir)  # fmt: skip
    with pytest.raises(FingerprintMismatchError, match=r"the reducer .*changed"):
        paralela.mapreduce(words, mean, str(corpus / "doc0.txt"), backend="sequential",
                           run_dir=run_dir)  # fmt: skip
    with pytest.raises(FingerprintMismatchError, match=r"the inputs"):
        paralela.mapreduce(words, total, str(corpus / "doc1.txt"), backend="sequential",
                           run_dir=run_dir)  # fmt: skip
    with pytest.raises(FingerprintMismatchError, match=r"partitions \(was 2, now 5\)"):
        paralela.mapreduce(words, total, str(corpus / "doc0.txt"), backend="sequential",
                           run_dir=run_dir, partitions=5)  # fmt: skip
