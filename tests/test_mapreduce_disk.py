"""MapReduce on a full disk: one error naming the directory and the cause, nothing left
half-written, and the same job finishing once there is room. Real small tmpfs mounts
(CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from disk_helpers import fill, mount_tmpfs, unmount

import paralela
from paralela.errors import MapReduceError

pytestmark = pytest.mark.timeout(120)


def words(line: str) -> Iterator[tuple[str, int]]:
    for word in line.split():
        yield word, 1


def total(_key: str, counts: Iterator[int]) -> int:
    return sum(counts)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "size=1m")
    yield disk
    unmount(disk)


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Counter[str]]:
    """~1.5 MB of distinct words: without a combiner, their spills outgrow 1 MB."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    expected: Counter[str] = Counter()
    for f in range(3):
        lines = [" ".join(f"w{f}x{i}y{k}" for k in range(8)) for i in range(4000)]
        (directory / f"{f}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        expected.update(w for line in lines for w in line.split())
    return directory, expected


def test_spills_on_a_full_disk_name_the_directory_and_the_cause(
    small_disk: Path, corpus: tuple[Path, Counter[str]]
) -> None:
    directory, expected = corpus
    run_dir = small_disk / "run"
    with pytest.raises(MapReduceError) as info:
        paralela.mapreduce(
            words, total, str(directory), workers=2, run_dir=run_dir, memory_limit="256KB",
            progress=False,
        )  # fmt: skip
    message = str(info.value)
    assert f"{run_dir / 'spills'}" in message
    assert "No space left on device" in message
    assert "run_dir=" in message
    leftovers = [p.name for p in (run_dir / "spills").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no half-written spill

    # A larger disk, the same run directory: the job finishes with the exact answer.
    moved = directory.parent / "run"
    subprocess.run(["cp", "-a", str(run_dir), str(moved)], check=True)
    result = paralela.mapreduce(
        words, total, str(directory), workers=2, run_dir=moved, memory_limit="256KB",
        progress=False,
    )  # fmt: skip
    assert result.to_dict() == dict(expected)


def test_an_output_directory_on_a_full_disk_is_named(
    small_disk: Path, corpus: tuple[Path, Counter[str]]
) -> None:
    directory, _ = corpus
    output = small_disk / "counts"
    with pytest.raises(MapReduceError) as info:
        paralela.mapreduce(
            words, total, str(directory), combiner=total, workers=2, output=output,
            progress=False,
        )  # fmt: skip
    message = str(info.value)
    assert "No space left on device" in message
    assert "output" in message
    assert not (output / "_SUCCESS").exists()
    assert [p for p in output.iterdir() if p.name.startswith(".tmp")] == []


def test_the_cli_on_a_full_disk_is_one_paragraph_exit_1(
    small_disk: Path, corpus: tuple[Path, Counter[str]], tmp_path: Path
) -> None:
    directory, _ = corpus
    fill(small_disk / "ballast")
    job = tmp_path / "job.py"
    job.write_text(
        "def mapper(line):\n    for w in line.split():\n        yield w, 1\n\n"
        "def reducer(key, counts):\n    return sum(counts)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "mapreduce", str(job), "--input", str(directory),
         "--run-dir", str(small_disk / "run"), "--workers", "2"],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # a failure to retry, not a usage error
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    assert "No space left on device" in errors[0]
    assert str(small_disk / "run") in errors[0]
