"""``paralela.mapreduce(..., backend="slurm")`` on the real local Slurm cluster: map and
reduce tasks as array jobs, spill files in the run directory (the shared filesystem)."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.errors import ConfigError


def words(line: str) -> Iterator[tuple[str, int]]:
    for word in line.split():
        yield word, 1


def total(_key: Any, counts: Iterable[int]) -> int:
    return sum(counts)


def options(partition: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "slurm_partition": partition,
        "slurm_job_dir": str(tmp_path / "jobs"),
        "cpus_per_task": 1,
        "timeout_min": 5,
        "max_jobs": 3,
    }


@pytest.mark.slurm
def test_word_count_on_slurm_equals_a_counter_and_resumes(
    slurm_cluster: str, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    for f in range(3):
        rows = [f"w{i % 11} x{(i * f) % 7} ünï{f} shared" for i in range(300)] + [""]
        (corpus / f"{f}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
        expected.update(w for row in rows for w in row.split())
    run_dir = tmp_path / "run"
    job: dict[str, Any] = {
        "combiner": total,
        "backend": "slurm",
        "backend_options": options(slurm_cluster, tmp_path),
        "run_dir": run_dir,
        "split_bytes": 2048,
        "partitions": 4,
        "progress": False,
    }
    result = paralela.mapreduce(words, total, str(corpus), **job)
    assert result.to_dict() == dict(expected)
    assert result.summary.map_tasks > 3  # several splits per file, packed into <= 3 jobs
    assert result.summary.reduce_tasks == 4
    # Every map and reduce task ran in an array job: two arrays, one per phase.
    assert len(list((tmp_path / "jobs").iterdir())) == 2
    # The finished job is read back from its run directory, submitting nothing.
    again = paralela.mapreduce(words, total, str(corpus), **job)
    assert again.to_dict() == dict(expected)
    assert again.summary.map_tasks_reused == again.summary.map_tasks
    assert again.summary.reduce_tasks_reused == 4
    assert len(list((tmp_path / "jobs").iterdir())) == 2


def test_slurm_without_a_run_dir_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a b\n")
    with pytest.raises(ConfigError, match="needs run_dir= on a filesystem every node"):
        paralela.mapreduce(words, total, str(tmp_path / "a.txt"), backend="slurm",
                           backend_options={"slurm_job_dir": str(tmp_path / "jobs")})  # fmt: skip


@pytest.mark.slurm
def test_streaming_commands_on_slurm(slurm_cluster: str, tmp_path: Path) -> None:
    scripts = Path(__file__).resolve().parent / "streaming_scripts"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [f"w{i % 13} straße x{i % 5}" for i in range(500)]
    (corpus / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = collections.Counter(w for line in lines for w in line.split())
    py = sys.executable
    result = paralela.mapreduce(
        f"{py} {scripts / 'mapper.py'}", f"{py} {scripts / 'reducer.py'}", str(corpus),
        backend="slurm", backend_options=options(slurm_cluster, tmp_path),
        run_dir=tmp_path / "run", partitions=2, progress=False,
    )  # fmt: skip
    assert {k: int(v) for k, v in result} == dict(expected)
    assert len(list((tmp_path / "jobs").iterdir())) == 2  # a map and a reduce array
