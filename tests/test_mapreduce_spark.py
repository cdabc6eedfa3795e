"""The Spark engine of ``paralela.mapreduce`` on a real Spark: ``local[2]`` and a real
standalone master + worker on 127.0.0.1 (``spark_helpers``), never a mock.

One JVM serves the whole module (pyspark keeps its gateway between sessions); the
``spark_sessions`` fixture keeps one session at a time and the tests run local ones
first, the standalone cluster's last, so that the module starts few sessions.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import SparkSessions, StandaloneCluster

import paralela
from paralela.errors import (
    ConfigError,
    InputError,
    MapReduceError,
    MissingExtraError,
    UnpicklableError,
    UserFunctionError,
)

# A JVM's first start takes ~10 s on a busy machine; a session on the cluster as long.
pytestmark = pytest.mark.timeout(240)

#: Small splits, so that the corpus's files are cut into several and its long line spans
#: more than one split.
SPLIT_BYTES = 2048
LONG_LINE_WORDS = 2000  # ~8 KB: a line over three splits


def make_corpus(directory: Path) -> tuple[list[Path], collections.Counter[str]]:
    """Three text files: Unicode words, empty and blank lines, a line longer than a
    split, a file without a final newline; and the word counts of them all."""
    directory.mkdir(parents=True, exist_ok=True)
    words = ["naïve", "café", "日本語", "🙂", "straße", "a", "the", "ünïcödé", "x" * 40]
    lines_a = [" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 9)) for i in range(400)]
    lines_a[10] = ""
    lines_a[11] = "   \t  "
    lines_b = ["the long line: " + " ".join(f"w{i % 97}" for i in range(LONG_LINE_WORDS))]
    lines_b += ["", "café 🙂 café", ""] * 50
    assert len(lines_b[0].encode()) > 3 * SPLIT_BYTES
    lines_c = [f"tail {i} 日本語" for i in range(300)]
    files = []
    counts: collections.Counter[str] = collections.Counter()
    for name, lines, newline in (("a.txt", lines_a, True), ("b.txt", lines_b, True),
                                 ("c.txt", lines_c, False)):  # fmt: skip
        path = directory / name
        text = "\n".join(lines) + ("\n" if newline else "")
        path.write_text(text, encoding="utf-8")
        files.append(path)
        for line in lines:
            counts.update(line.split())
    return files, counts


def words(line: str) -> Iterator[tuple[str, int]]:
    for word in line.split():
        yield word, 1


def total(key: Any, values: Iterator[int]) -> int:
    return sum(values)


def explode_on_boom(line: str) -> list[tuple[str, int]]:
    if "boom" in line:
        raise ValueError(f"cannot map {line!r}")
    return [(w, 1) for w in line.split()]


def reducer_fails_on_cafe(key: str, values: Iterator[int]) -> int:
    if key == "café":
        raise KeyError("no coffee here")
    return sum(values)


def not_pairs(line: str) -> list[str]:
    return line.split()


class Unpicklable:
    """A value that cannot be pickled, with a repr that is the same in every run."""

    def __repr__(self) -> str:
        return "Unpicklable()"

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'Unpicklable' object")


def unpicklable_for_boom(line: str) -> list[tuple[str, Any]]:
    return [(w, Unpicklable() if w == "boom" else 1) for w in line.split()]


_LOCK = threading.Lock()  # does not pickle: words_under_lock travels by name


def words_under_lock(line: str) -> list[tuple[str, int]]:
    with _LOCK:
        return [(w, 1) for w in line.split()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, collections.Counter[str]]:
    directory = tmp_path_factory.mktemp("corpus")
    _, counts = make_corpus(directory)
    return directory, counts


@pytest.fixture
def local2(spark_sessions: SparkSessions) -> Any:
    """The module's ``local[2]`` session (started on first use)."""
    return spark_sessions.session("local[2]")


def check_short(error: BaseException) -> str:
    """The error's message, checked to be paralela's, not Spark's trace."""
    text = str(error)
    assert len(text) < 2000, text
    assert "py4j" not in text.lower()
    assert "Traceback" not in text
    assert "PARALELA-TASK-FAILED" not in text
    return text


# ── word count ──────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("combiner", [None, total], ids=["no-combiner", "combiner"])
def test_word_count_on_local2_equals_counter(
    local2: Any, corpus: tuple[Path, collections.Counter[str]], combiner: Any
) -> None:
    directory, counts = corpus
    result = paralela.mapreduce(
        words, total, str(directory / "*.txt"), combiner=combiner, engine="spark",
        split_bytes=SPLIT_BYTES, partitions=3,
    )  # fmt: skip
    assert dict(result) == dict(counts)
    assert dict(result) == dict(result)  # re-iterable
    assert len(result) == len(counts)
    summary = result.summary
    assert summary.engine == "spark"
    assert summary.extra["master"] == "local[2]"
    assert summary.splits > 3  # the files were cut into several splits each
    assert summary.map_tasks == summary.splits
    assert summary.reduce_tasks == 3
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in directory.glob("*.txt"))
    assert summary.records == lines
    assert summary.pairs_emitted == sum(counts.values())
    if combiner is None:
        assert summary.pairs_after_combining == summary.pairs_emitted
    else:
        assert summary.pairs_after_combining < summary.pairs_emitted / 2
    assert summary.keys == len(counts)


def test_spark_gives_what_the_local_engine_gives(
    local2: Any, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    """Same partitioning and key order: the same pairs in the same order."""
    directory, _ = corpus
    options: dict[str, Any] = {"combiner": total, "split_bytes": SPLIT_BYTES, "partitions": 4}
    spark = paralela.mapreduce(words, total, str(directory), engine="spark", **options)
    local = paralela.mapreduce(words, total, str(directory), backend="threads", **options)
    assert list(spark) == list(local)


def test_one_file_is_cut_into_a_map_task_per_core(local2: Any, tmp_path: Path) -> None:
    path = tmp_path / "one.txt"
    lines = [f"{i % 13} {i % 7} ß" for i in range(60_000)]  # ~540 KB: two 256 KiB splits
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = paralela.mapreduce(words, total, str(path), combiner=total, engine="spark")
    assert result.summary.splits == 2  # local[2]: planned as one, spread over both cores
    expected = collections.Counter(w for line in lines for w in line.split())
    assert dict(result) == dict(expected)
    assert result.summary.records == len(lines)


def test_records_input_and_non_string_keys(local2: Any) -> None:
    """An iterable of records; int and tuple keys; a mapper returning a mapping; NaN keys
    of both signs, one key (as on the local engine)."""
    numbers = list(range(1, 2001))

    def by_remainder(n: int) -> dict[Any, int]:
        return {n % 7: n, ("parity", n % 2): 1, float("nan") if n % 2 else -float("nan"): 1}

    result = paralela.mapreduce(
        by_remainder, total, numbers, engine="spark", records_per_split=300, partitions=5
    )
    expected: collections.Counter[Any] = collections.Counter()
    for n in numbers:
        expected[n % 7] += n
        expected[("parity", n % 2)] += 1
    pairs = list(result)
    assert [value for key, value in pairs if key != key] == [len(numbers)]
    assert {key: value for key, value in pairs if key == key} == dict(expected)
    assert result.summary.splits == 7


def test_empty_input_gives_empty_parts(local2: Any, tmp_path: Path) -> None:
    result = paralela.mapreduce(words, total, iter([]), engine="spark", partitions=2)
    assert list(result) == []
    assert result.summary.records == 0
    out = tmp_path / "out"
    paralela.mapreduce(words, total, iter([]), engine="spark", partitions=2, output=str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS", "part-00000.jsonl", "part-00001.jsonl"
    ]  # fmt: skip


def test_functions_that_do_not_pickle_by_value_travel_by_name(
    local2: Any, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    """A module-level function using a module-level lock: executors import its module
    from the driver's sys.path (this test file's directory)."""
    directory, counts = corpus
    result = paralela.mapreduce(words_under_lock, total, str(directory), engine="spark")
    assert dict(result) == dict(counts)


def test_a_function_that_cannot_travel_is_refused(local2: Any, tmp_path: Path) -> None:
    lock = threading.Lock()

    def locked(line: str) -> list[tuple[str, int]]:
        with lock:
            return [(line, 1)]

    with pytest.raises(UnpicklableError, match=r"The mapper \(.*locked\) cannot be sent"):
        paralela.mapreduce(locked, total, [1, 2], engine="spark")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_output_files_round_trip(
    local2: Any, corpus: tuple[Path, collections.Counter[str]], tmp_path: Path, fmt: str
) -> None:
    directory, counts = corpus
    out = tmp_path / "counts"
    result = paralela.mapreduce(
        words, total, str(directory), combiner=total, engine="spark", partitions=3,
        output=str(out), output_format=fmt, split_bytes=SPLIT_BYTES,
    )  # fmt: skip
    names = sorted(p.name for p in out.iterdir())
    assert names == ["_SUCCESS", f"part-00000.{fmt}", f"part-00001.{fmt}", f"part-00002.{fmt}"]
    assert sorted(result.output_files) == [str(out / n) for n in names[1:]]
    read: dict[str, int] = {}
    for name in names[1:]:
        if fmt == "jsonl":
            for line in (out / name).read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                read[row["key"]] = row["value"]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(out / name)
            read.update(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
    assert read == dict(counts)
    assert dict(result) == dict(counts)
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["pairs"] == len(counts)
    # The local engine writes the same files for the same job.
    local_out = tmp_path / "local"
    paralela.mapreduce(
        words, total, str(directory), combiner=total, backend="threads", partitions=3,
        output=str(local_out), output_format=fmt, split_bytes=SPLIT_BYTES,
    )  # fmt: skip
    assert sorted(p.name for p in local_out.iterdir()) == names
    if fmt == "jsonl":
        for name in names[1:]:
            assert (out / name).read_bytes() == (local_out / name).read_bytes()


# ── errors ──────────────────────────────────────────────────────────────────────────────


def test_mapper_error_names_file_and_line(local2: Any, tmp_path: Path) -> None:
    files, _ = make_corpus(tmp_path / "corpus")
    bad = files[0]
    lines = bad.read_text(encoding="utf-8").splitlines()
    lines[122] = "some words then boom here"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(
            explode_on_boom, total, str(tmp_path / "corpus"), engine="spark",
            split_bytes=SPLIT_BYTES,
        )  # fmt: skip
    error = caught.value
    text = check_short(error)
    assert error.function == "mapper"
    assert error.where == f"{bad} line 123"
    assert "ValueError: cannot map 'some words then boom here'" in text
    assert f"{bad} line 123" in text
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "cannot map 'some words then boom here'"


def test_reducer_error_names_the_key(
    local2: Any, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    directory, _ = corpus
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(
            words, reducer_fails_on_cafe, str(directory), combiner=total, engine="spark"
        )
    error = caught.value
    text = check_short(error)
    assert error.function == "reducer"
    assert error.where == repr("café")
    assert "KeyError: 'no coffee here'" in text
    assert "for key 'café'" in text
    assert isinstance(error.__cause__, KeyError)


def test_pair_that_is_not_a_pair_names_the_record(
    local2: Any, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    directory, _ = corpus
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(not_pairs, total, str(directory / "c.txt"), engine="spark")
    text = check_short(caught.value)
    assert caught.value.function == "mapper"
    assert "not a (key, value) pair" in text
    assert f"{directory / 'c.txt'} line 1, record 'tail 0 日本語'" in text


def test_non_utf8_input_is_an_input_error(local2: Any, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\nsecond caf\xe9 line\n".encode("latin-1"))
    with pytest.raises(InputError) as caught:
        paralela.mapreduce(words, total, str(bad), engine="spark")
    text = check_short(caught.value)
    assert caught.value.path is not None
    assert Path(caught.value.path).name == "latin1.txt"
    assert caught.value.where == "line 2"
    assert "utf-8" in text


def combiner_fails(key: str, values: Iterator[int]) -> int:
    raise RuntimeError(f"cannot combine {key}")


@pytest.mark.parametrize("case", ["mapper", "not-a-pair", "reducer", "unpicklable"])
def test_errors_read_as_the_local_engine_s(local2: Any, tmp_path: Path, case: str) -> None:
    path = tmp_path / "input.txt"
    path.write_text("one two\nthree café\nboom four\n", encoding="utf-8")
    mapper, reducer = {
        "mapper": (explode_on_boom, total),
        "not-a-pair": (not_pairs, total),
        "reducer": (words, reducer_fails_on_cafe),
        "unpicklable": (unpicklable_for_boom, total),
    }[case]
    errors = []
    engines: list[dict[str, Any]] = [{"engine": "spark"}, {"backend": "threads"}]
    for options in engines:
        with pytest.raises(UserFunctionError) as caught:
            paralela.mapreduce(mapper, reducer, str(path), **options)
        errors.append(caught.value)
    spark, local = errors
    assert str(spark) == str(local)
    assert (spark.function, spark.where) == (local.function, local.where)
    assert type(spark.__cause__) is type(local.__cause__)


def test_combiner_error_names_the_key(local2: Any, tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_text("café " * 100 + "\n", encoding="utf-8")
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(words, total, str(path), combiner=combiner_fails, engine="spark")
    text = check_short(caught.value)
    assert caught.value.function == "combiner"
    assert caught.value.where == repr("café")
    assert "RuntimeError: cannot combine café" in text
    assert f"in the map task of {path}" in text


def test_executors_without_paralela_are_named(
    local2: Any, tmp_path: Path, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    """A running session whose executors run a Python without paralela (a session built
    without PYSPARK_PYTHON, its workers on another interpreter): one clear sentence."""
    bare = tmp_path / "python-without-site-packages"
    bare.write_text(f'#!/bin/sh\ncd / && exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    sc = local2.sparkContext
    directory, _ = corpus
    sc.pythonExec, before = str(bare), sc.pythonExec
    try:
        with pytest.raises(MapReduceError) as caught:
            paralela.mapreduce(words, total, str(directory / "c.txt"), engine="spark")
    finally:
        sc.pythonExec = before
    text = check_short(caught.value)
    assert "cannot import paralela" in text
    assert "PYSPARK_PYTHON" in text


# ── sessions ────────────────────────────────────────────────────────────────────────────


def test_a_running_session_is_reused_and_left_running(
    local2: Any, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    directory, counts = corpus
    sc = local2.sparkContext
    result = paralela.mapreduce(words, total, str(directory), engine="spark", master="local[2]")
    assert dict(result) == dict(counts)
    from pyspark import SparkContext

    assert SparkContext._active_spark_context is sc
    assert local2.sparkContext.parallelize([1, 2, 3]).sum() == 6  # still usable
    with pytest.raises(ConfigError, match="already running"):
        paralela.mapreduce(words, total, str(directory), engine="spark", master="local[1]")
    with pytest.raises(ConfigError, match=r"spark\.executor\.cores"):
        paralela.mapreduce(
            words, total, str(directory), engine="spark",
            spark_conf={"spark.executor.cores": "7"},
        )  # fmt: skip


def test_a_session_it_starts_is_stopped_even_on_error(
    spark_sessions: SparkSessions,
    corpus: tuple[Path, collections.Counter[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark import SparkContext

    directory, counts = corpus
    spark_sessions.stop()
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    result = paralela.mapreduce(
        words, total, str(directory), engine="spark", master="local[1]", spark_conf=conf
    )
    assert SparkContext._active_spark_context is None
    assert dict(result) == dict(counts)  # the result outlives the session
    assert result.summary.extra["master"] == "local[1]"
    monkeypatch.setenv("PARALELA_SPARK_MASTER", "local[2]")  # master= unset: from here
    result = paralela.mapreduce(words, total, str(directory), engine="spark", spark_conf=conf)
    assert result.summary.extra["master"] == "local[2]"
    assert SparkContext._active_spark_context is None
    monkeypatch.delenv("PARALELA_SPARK_MASTER")
    bad = tmp_path / "bad.txt"
    bad.write_text("fine\nboom\n")
    with pytest.raises(UserFunctionError):
        paralela.mapreduce(
            explode_on_boom, total, str(bad), engine="spark", master="local[1]", spark_conf=conf
        )
    assert SparkContext._active_spark_context is None


def test_a_master_that_does_not_answer_fails_within_20_seconds(
    spark_sessions: SparkSessions, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    """Spark's own client tries a standalone master 3 times, 20 s apart, then stops the
    context it returned (~65 s, then "Cannot call methods on a stopped SparkContext")."""
    import socket

    from pyspark import SparkContext

    directory, _ = corpus
    spark_sessions.stop()  # paralela starts the session on master=
    with socket.socket() as closed:  # a port nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    master = f"spark://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(MapReduceError) as info:
        paralela.mapreduce(words, total, str(directory), engine="spark", master=master)
    assert time.monotonic() - started < 20
    assert f"The Spark master {master} does not answer" in check_short(info.value)
    assert "master='local[*]'" in str(info.value)
    assert SparkContext._active_spark_context is None


def test_a_spark_master_variable_not_understood_names_it(
    monkeypatch: pytest.MonkeyPatch, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    directory, _ = corpus
    monkeypatch.setenv("PARALELA_SPARK_MASTER", "127.0.0.1:7077")
    with pytest.raises(ConfigError) as info:
        paralela.mapreduce(words, total, str(directory), engine="spark")
    assert "PARALELA_SPARK_MASTER='127.0.0.1:7077' is not understood" in str(info.value)
    assert "spark://HOST:PORT" in str(info.value)


def test_without_pyspark_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    directory, _ = corpus
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark -> ImportError
    with pytest.raises(MissingExtraError, match=r"paralela\[spark\]"):
        paralela.mapreduce(words, total, str(directory), engine="spark")


def test_importing_paralela_does_not_import_pyspark() -> None:
    code = (
        "import sys, paralela, paralela.mapreduce, paralela.mapreduce._spark; "
        "assert 'pyspark' not in sys.modules, 'pyspark was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ── a real standalone cluster ───────────────────────────────────────────────────────────


@pytest.fixture
def on_cluster(spark_sessions: SparkSessions, spark_cluster: StandaloneCluster) -> Any:
    """A session on the standalone cluster (started once, shared by the tests below)."""
    return spark_sessions.session(spark_cluster.master_url, {"spark.task.maxFailures": "2"})


def test_word_count_on_a_standalone_cluster(
    on_cluster: Any,
    spark_cluster: StandaloneCluster,
    corpus: tuple[Path, collections.Counter[str]],
) -> None:
    directory, counts = corpus
    assert spark_cluster.alive_workers() == 1
    result = paralela.mapreduce(
        words, total, str(directory / "*.txt"), combiner=total, engine="spark",
        split_bytes=SPLIT_BYTES, partitions=3,
    )  # fmt: skip
    assert dict(result) == dict(counts)
    assert result.summary.extra["master"] == spark_cluster.master_url
    assert result.summary.records == sum(
        len(p.read_text(encoding="utf-8").splitlines()) for p in directory.glob("*.txt")
    )


def test_errors_come_back_from_a_standalone_cluster(
    on_cluster: Any, tmp_path: Path, corpus: tuple[Path, collections.Counter[str]]
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("fine\nalso fine\nboom\n", encoding="utf-8")
    with pytest.raises(UserFunctionError) as caught:
        paralela.mapreduce(explode_on_boom, total, str(bad), engine="spark")
    text = check_short(caught.value)
    assert caught.value.where == f"{bad} line 3"
    assert "ValueError: cannot map 'boom'" in text
    directory, _ = corpus
    with pytest.raises(UserFunctionError) as reduced:
        paralela.mapreduce(words, reducer_fails_on_cafe, str(directory), engine="spark")
    assert reduced.value.where == repr("café")
    check_short(reduced.value)


def test_the_command_line_runs_a_job_file_on_the_cluster(
    spark_sessions: SparkSessions,
    spark_cluster: StandaloneCluster,
    corpus: tuple[Path, collections.Counter[str]],
    tmp_path: Path,
) -> None:
    """``paralela mapreduce examples/wordcount.py --engine spark --master spark://...``:
    the job file's functions reach the cluster's executors (by value: it is not an
    installed module)."""
    spark_sessions.stop()  # the worker's 2 cores go to one application at a time
    directory, _ = corpus
    out = tmp_path / "counts"
    root = Path(__file__).resolve().parents[1]
    command = [
        sys.executable, "-m", "paralela", "mapreduce", str(root / "examples" / "wordcount.py"),
        "--input", str(directory / "*.txt"), "--output", str(out), "--partitions", "2",
        "--engine", "spark", "--master", spark_cluster.master_url,
    ]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    expected: collections.Counter[str] = collections.Counter()
    for path in directory.glob("*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            expected.update(re.findall(r"\w+", line.lower()))
    counts = {}
    for part in sorted(out.glob("part-*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            counts[row["key"]] = row["value"]
    assert counts == dict(expected)
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS", "part-00000.jsonl", "part-00001.jsonl"
    ]  # fmt: skip
