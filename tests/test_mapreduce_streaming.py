"""Hadoop Streaming jobs run unchanged: commands as mapper, combiner and reducer, reading
lines on stdin and writing ``key<TAB>value`` lines. The classic word count scripts of
the streaming tutorials (tests/streaming_scripts/), real subprocesses, the real CLI."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import paralela
from paralela.errors import ConfigError, FingerprintMismatchError, UserFunctionError
from paralela.mapreduce._output import Part, read_part, write_part
from paralela.mapreduce._streaming import Command, parse

SCRIPTS = Path(__file__).resolve().parent / "streaming_scripts"
PY = sys.executable


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, collections.Counter[str]]:
    """The tutorial's scripts in ``tmp_path``, and a corpus of 4 files under it."""
    for name in ("mapper.py", "reducer.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    words = ["the", "cat", "straße", "日本", "sat", "on", "mat", "a-b", "x'y"]
    for f in range(4):
        lines = [
            " ".join(words[(f + i * k) % len(words)] for k in range(i % 7)) for i in range(800)
        ]
        (corpus / f"{f}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        expected.update(w for line in lines for w in line.split())
    return tmp_path, expected


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "paralela", "mapreduce", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_tutorial_scripts_count_words_like_a_counter(
    job: tuple[Path, collections.Counter[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, expected = job
    monkeypatch.chdir(root)
    result = paralela.mapreduce(
        f"{PY} mapper.py", f"{PY} reducer.py", "corpus", combiner=f"{PY} reducer.py",
        workers=2, split_bytes=8_000, progress=False,
    )  # fmt: skip
    assert {k: int(v) for k, v in result} == dict(expected)
    s = result.summary
    assert s.map_tasks > 2  # several batches through several mapper processes
    # The combiner command ran on each batch: a pair per word and batch, not per token.
    assert s.pairs_emitted <= 9 * s.splits < sum(expected.values())


def test_the_cli_writes_text_parts_like_hadoop(job: tuple[Path, collections.Counter[str]]) -> None:
    root, expected = job
    done = _cli(
        root, "--mapper", f"{PY} mapper.py", "--reducer", f"{PY} reducer.py",
        "--input", "corpus", "--output", "counts", "--workers", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parts = sorted((root / "counts").glob("part-*.txt"))
    assert len(parts) == 4
    assert (root / "counts" / "_SUCCESS").exists()
    got = {}
    for part in parts:
        for line in part.read_text(encoding="utf-8").splitlines():
            word, count = line.split("\t")
            got[word] = int(count)
    assert got == dict(expected)

    stdout = _cli(
        root, "--mapper", f"{PY} mapper.py", "--reducer", f"{PY} reducer.py", "--input", "corpus"
    )  # fmt: skip
    assert stdout.returncode == 0, stdout.stderr
    lines = stdout.stdout.splitlines()
    assert {w: int(c) for w, c in (line.split("\t") for line in lines)} == dict(expected)


def test_cat_and_wc_lines_without_tabs_are_keys(job: tuple[Path, collections.Counter[str]]) -> None:
    root, _ = job
    done = _cli(
        root, "--mapper", "cat", "--reducer", "wc -l", "--input", "corpus", "--output", "out",
        "--partitions", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = [int(p.read_text()) for p in sorted((root / "out").glob("part-*.txt"))]
    assert len(counts) == 3
    distinct_lines = {
        line for f in (root / "corpus").iterdir() for line in f.read_text().splitlines()
    }
    # A line without a tab is a key with no value: `wc -l` counts one line per pair.
    assert sum(counts) == 4 * 800
    assert len(distinct_lines) < 4 * 800


def test_a_python_mapper_with_a_reducer_command(tmp_path: Path) -> None:
    result = paralela.mapreduce(
        _pairs, "sort", [["b", "a", "b"]], input_format="records", workers=1, progress=False
    )
    assert sorted(result) == [("a", "1"), ("b", "1"), ("b", "1")]


def _pairs(record: list[str]) -> Iterator[tuple[str, int]]:
    for word in record:
        yield word, 1


def test_a_reducer_that_stops_reading_does_not_hang(
    job: tuple[Path, collections.Counter[str]],
) -> None:
    root, _ = job
    done = _cli(
        root, "--mapper", f"{PY} mapper.py", "--reducer", "head -n 1", "--input", "corpus",
        "--output", "out", "--partitions", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [len(p.read_text().splitlines()) for p in sorted((root / "out").glob("part-*"))] == [
        1,
        1,
    ]


def test_a_failing_mapper_names_its_command_exit_status_stderr_and_lines(
    job: tuple[Path, collections.Counter[str]],
) -> None:
    root, _ = job
    (root / "bad.py").write_text("import sys\nsys.stdin.read()\nsys.exit('no words here')\n")
    done = _cli(root, "--mapper", f"{PY} bad.py", "--reducer", "cat", "--input", "corpus/0.txt")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "bad.py' exited 1" in done.stderr
    assert "no words here" in done.stderr
    assert "0.txt line 1 to" in done.stderr


def test_a_failing_reducer_names_its_partition(job: tuple[Path, collections.Counter[str]]) -> None:
    root, _ = job
    with pytest.raises(
        UserFunctionError, match=r"(?s)reducer command 'false' exited 1.*partition"
    ) as info:
        paralela.mapreduce(
            f"{PY} {root / 'mapper.py'}", "false", str(root / "corpus"), workers=2,
            progress=False,
        )  # fmt: skip
    assert info.value.function == "reducer"


def test_a_reducer_writing_bytes_that_are_not_utf8_is_named(tmp_path: Path) -> None:
    script = tmp_path / "latin1.py"
    script.write_text("import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'caf\\xe9\\t1\\n')\n")
    with pytest.raises(UserFunctionError, match="wrote line 1 that is not UTF-8"):
        paralela.mapreduce(
            _pairs, f"{PY} {script}", [["a"]], input_format="records", workers=1, progress=False
        )


def test_an_edited_script_is_not_resumed(job: tuple[Path, collections.Counter[str]]) -> None:
    root, expected = job
    mapper, reducer = f"{PY} {root / 'mapper.py'}", f"{PY} {root / 'reducer.py'}"
    options = {"workers": 2, "run_dir": root / "run", "progress": False}
    first = paralela.mapreduce(mapper, reducer, str(root / "corpus"), **options)
    assert {k: int(v) for k, v in first} == dict(expected)
    again = paralela.mapreduce(mapper, reducer, str(root / "corpus"), **options)
    assert again.summary.map_tasks_reused == again.summary.map_tasks
    with (root / "mapper.py").open("a") as f:
        f.write("# edited\n")
    with pytest.raises(FingerprintMismatchError, match="the mapper"):
        paralela.mapreduce(mapper, reducer, str(root / "corpus"), **options)


def test_commands_are_checked_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="program 'no-such-program' not found"):
        paralela.mapreduce("no-such-program", "cat", [["a"]], input_format="records")
    with pytest.raises(ConfigError, match="cannot be split"):
        paralela.mapreduce("cat 'unbalanced", "cat", [["a"]], input_format="records")
    with pytest.raises(ConfigError, match="mapper command is empty"):
        paralela.mapreduce("  ", "cat", [["a"]], input_format="records")
    with pytest.raises(ConfigError, match="combiner command runs on a mapper command"):
        paralela.mapreduce(_pairs, "cat", [["a"]], combiner="cat", input_format="records")
    with pytest.raises(ConfigError, match="local engine"):
        paralela.mapreduce("cat", "cat", [["a"]], input_format="records", engine="spark")


def test_the_cli_wants_a_job_file_or_both_commands(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a\n")
    only_mapper = _cli(tmp_path, "--mapper", "cat", "--input", "in.txt")
    assert only_mapper.returncode == 2
    assert "--reducer CMD" in only_mapper.stderr
    both = _cli(tmp_path, "job.py", "--mapper", "cat", "--reducer", "cat", "--input", "in.txt")
    assert both.returncode == 2
    assert "not both" in both.stderr


def test_lines_split_at_the_first_tab() -> None:
    cat = Command("cat", "mapper")
    assert parse(b"k\tv\tw\nalone\n\r\n\tempty-key\nwin\t1\r\n", cat) == [
        ("k", "v\tw"), ("alone", None), ("", None), ("", "empty-key"), ("win", "1"),
    ]  # fmt: skip


def test_text_parts_round_trip_and_refuse_a_key_with_a_tab(tmp_path: Path) -> None:
    pairs = [("a", "1"), ("b c", None), ("日本", 2), (3, "x")]
    part = write_part(iter(pairs), tmp_path, 0, "text")
    assert (tmp_path / "part-00000.txt").read_text(encoding="utf-8") == "a\t1\nb c\n日本\t2\n3\tx\n"
    assert list(read_part(part)) == [("a", "1"), ("b c", None), ("日本", "2"), ("3", "x")]
    with pytest.raises(UserFunctionError, match="tab or a line break"):
        write_part(iter([("a\tb", 1)]), tmp_path, 1, "text")
    assert not (tmp_path / "part-00001.txt").exists()
    assert isinstance(part, Part)
    assert os.listdir(tmp_path) == ["part-00000.txt"]
