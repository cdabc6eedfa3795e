"""`paralela mapreduce`: the real command in a subprocess, as a user runs it from a shell."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import default_sigint

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

JOB = """
import os, signal

def mapper(line):
    for word in line.split():
        if word == "boom":
            raise RuntimeError("the mapper met boom")
        if word == "ctrlc":
            os.kill(os.getppid(), signal.SIGINT)  # Ctrl-C, as the driver gets it
        yield word, 1

def reducer(word, counts):
    if word == "explode":
        raise ZeroDivisionError("the reducer met explode")
    return sum(counts)

combiner = reducer
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.py").write_text(JOB)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat\n\non the mat\n")
    (corpus / "b.txt").write_text("the dog ate the cat\nünïcödé words\n")
    (tmp_path / "tmp").mkdir()
    return tmp_path


EXPECTED = collections.Counter(
    ["the", "cat", "sat", "on", "the", "mat", "the", "dog", "ate", "the", "cat", "ünïcödé", "words"]
)


def paralela(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m paralela ARGS` in ``cwd`` with its own TMPDIR (``cwd/tmp``)."""
    return subprocess.run(
        [sys.executable, "-m", "paralela", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(cwd / "tmp")},
        preexec_fn=default_sigint,  # the Ctrl-C test: even under a runner ignoring SIGINT
    )


def pairs(text: str) -> dict[str, int]:
    return {obj["key"]: obj["value"] for obj in map(json.loads, text.splitlines())}


def test_word_count_to_an_output_directory(workdir: Path) -> None:
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus/*.txt",
                    "--output", "counts", "--workers", "2", "--partitions", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parts = sorted((workdir / "counts").glob("part-*.jsonl"))
    assert len(parts) == 3
    assert pairs("".join(p.read_text() for p in parts)) == dict(EXPECTED)
    assert (workdir / "counts" / "_SUCCESS").exists()
    assert "records" in proc.stderr
    assert "3 files in counts" in proc.stderr
    assert proc.stdout == ""
    assert list((workdir / "tmp").iterdir()) == []  # the job's temporary directory is gone


def test_without_output_the_pairs_go_to_stdout(workdir: Path) -> None:
    proc = paralela(workdir, "mapreduce", "job.py", "-i", "corpus/a.txt", "-i", "corpus/b.txt",
                    "--backend", "sequential")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert pairs(proc.stdout) == dict(EXPECTED)
    assert list((workdir / "tmp").iterdir()) == []


def test_parquet_output_and_the_wordcount_example_as_a_job_file(workdir: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    proc = paralela(workdir, "mapreduce", str(EXAMPLES / "wordcount.py"), "--input", "corpus",
                    "--output", "out", "--format", "parquet", "--workers", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(sorted((workdir / "out").glob("part-*.parquet")))
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == dict(EXPECTED)


def test_a_mapper_error_is_one_paragraph_naming_file_line_and_record(workdir: Path) -> None:
    (workdir / "corpus" / "b.txt").write_text("fine\nstill fine\nit goes boom here\n")
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus", "--workers", "2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: ")
    assert "mapper raised RuntimeError: the mapper met boom" in proc.stderr
    assert "b.txt line 3" in proc.stderr
    assert "'it goes boom here'" in proc.stderr


def test_a_mapper_value_that_cannot_be_pickled_is_one_paragraph(workdir: Path) -> None:
    """Naming the mapper, the record (file and line) and the key; no traceback."""
    (workdir / "locks.py").write_text(
        "import threading\n\n"
        "def mapper(line):\n"
        "    for word in line.split():\n"
        "        yield word, threading.Lock() if word == 'dog' else 1\n\n"
        "def reducer(word, counts):\n    return sum(counts)\n"
    )
    proc = paralela(workdir, "mapreduce", "locks.py", "--input", "corpus", "--workers", "2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: The mapper yielded the value <unlocked _thread.lock")
    assert "for key 'dog', which cannot be pickled" in proc.stderr
    assert "b.txt line 1, record 'the dog ate the cat'" in proc.stderr
    assert len(proc.stderr.splitlines()) == 2, proc.stderr


def test_a_reducer_error_is_exit_1_naming_the_key(workdir: Path) -> None:
    (workdir / "corpus" / "b.txt").write_text("explode here\n")
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus", "--workers", "2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "'explode'" in proc.stderr
    assert "ZeroDivisionError: the reducer met explode" in proc.stderr


def test_a_mapper_yielding_no_pairs_is_exit_1_naming_file_and_line(workdir: Path) -> None:
    (workdir / "bare.py").write_text(
        "def mapper(line):\n    yield from line.split()\n\n"
        "def reducer(word, counts):\n    return sum(counts)\n"
    )
    proc = paralela(workdir, "mapreduce", "bare.py", "--input", "corpus/a.txt")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "a.txt line 1" in proc.stderr
    assert "'the cat sat'" in proc.stderr


def test_a_file_that_is_not_utf8_is_exit_1_naming_file_and_line(workdir: Path) -> None:
    (workdir / "corpus" / "c.txt").write_bytes(b"ok\nok\nbad \xff byte\n")
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus", "--workers", "2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "c.txt" in proc.stderr
    assert "line 3" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory-limit", "12XB"], "unknown unit 'XB'"),
        (["--backend", "nope"], "Unknown backend 'nope'"),
        (["--partitions", "0"], "--partitions"),
        (["--input", "missing/*.txt"], "No file matches the pattern"),
    ],
)
def test_bad_options_exit_2(workdir: Path, args: list[str], message: str) -> None:
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus", *args)
    expected = 1 if "No file" in message else 2
    assert proc.returncode == expected, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_job_file_without_a_reducer_exits_2(workdir: Path) -> None:
    (workdir / "half.py").write_text("def mapper(line):\n    return [(line, 1)]\n")
    proc = paralela(workdir, "mapreduce", "half.py", "--input", "corpus")
    assert proc.returncode == 2
    assert "no reducer" in proc.stderr


def test_a_run_dir_of_another_job_exits_4(workdir: Path) -> None:
    first = paralela(workdir, "mapreduce", "job.py", "--input", "corpus/a.txt",
                     "--run-dir", "run", "--backend", "sequential")  # fmt: skip
    assert first.returncode == 0, first.stderr
    again = paralela(workdir, "mapreduce", "job.py", "--input", "corpus/b.txt",
                     "--run-dir", "run", "--backend", "sequential")  # fmt: skip
    assert again.returncode == 4
    assert "the inputs" in again.stderr


def test_ctrl_c_stops_cleanly_with_exit_130_and_no_temporary_files(workdir: Path) -> None:
    (workdir / "corpus" / "b.txt").write_text("many words\n" * 200 + "ctrlc\n" + "more\n" * 200)
    proc = paralela(workdir, "mapreduce", "job.py", "--input", "corpus", "--workers", "2")
    assert proc.returncode == 130, proc.stderr
    assert "Interrupted" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list((workdir / "tmp").iterdir()) == []


BATCHED_JOB = """
from collections import Counter
from itertools import chain

batched = True

def mapper(lines):
    return Counter(chain.from_iterable(map(str.split, lines)))

def reducer(word, counts):
    return sum(counts)
"""


def test_a_job_file_setting_batched_gets_lists_of_records(workdir: Path) -> None:
    (workdir / "batched.py").write_text(BATCHED_JOB)
    proc = paralela(workdir, "mapreduce", "batched.py", "--input", "corpus/*.txt")
    assert proc.returncode == 0, proc.stderr
    assert pairs(proc.stdout) == dict(EXPECTED)


def test_a_job_file_setting_batched_to_something_else_is_a_usage_error(workdir: Path) -> None:
    (workdir / "batched.py").write_text(BATCHED_JOB.replace("batched = True", "batched = 1"))
    proc = paralela(workdir, "mapreduce", "batched.py", "--input", "corpus/*.txt")
    assert proc.returncode == 2
    assert "sets batched = 1; it must be True or False" in proc.stderr
