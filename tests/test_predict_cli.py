"""`paralela predict`: the real command in a subprocess, as a user runs it from a shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import default_sigint

MODELS = """
import os, signal, time

class Square:
    def setup(self, device):
        self.device = device

    def predict(self, batch):
        return [{"y": r["x"] ** 2, "device": self.device} for r in batch]

class Raises:
    def predict(self, batch):
        for r in batch:
            if r["x"] == 13:
                raise KeyError("no x of 13 please")
        return [0] * len(batch)

class Interrupting:
    def predict(self, batch):
        for r in batch:
            if r["x"] == 13:
                os.kill(os.getppid(), signal.SIGINT)  # Ctrl-C, as the driver gets it
                time.sleep(30)
        return [0] * len(batch)

class Wrong:
    def __init__(self, size):
        self.size = size

    def predict(self, batch):
        return batch
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    lines = "".join(json.dumps({"x": i}) + "\n" for i in range(40))
    (tmp_path / "data.jsonl").write_text(lines)
    return tmp_path


def paralela(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "predict", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=default_sigint,  # the Ctrl-C test: even under a runner ignoring SIGINT
    )


def test_predict_writes_one_part_per_shard(workdir: Path) -> None:
    proc = paralela(workdir, "models:Square", "--input", "data.jsonl", "--output", "out",
                    "--batch-size", "8", "--workers", "2", "--split-bytes", "100",
                    "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parts = sorted((workdir / "out").glob("part-*.jsonl"))
    assert len(parts) >= 3
    found = [json.loads(line) for p in parts for line in p.read_text().splitlines()]
    assert [r["input"] for r in found] == [{"x": i} for i in range(40)]
    assert [r["output"] for r in found] == [{"y": i * i, "device": "cpu"} for i in range(40)]
    assert "paralela predict: 40 records in" in proc.stderr
    assert f"{len(parts)} files in out" in proc.stderr
    assert (workdir / "out" / "_SUCCESS").exists()


def test_parquet_output(workdir: Path) -> None:
    import pyarrow.parquet as pq

    proc = paralela(workdir, "models.py:Square", "-i", "data.jsonl", "-o", "out",
                    "--format", "parquet", "--no-input")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(workdir / "out" / "part-00000.parquet")
    assert table.column_names == ["shard", "row", "output"]
    assert [r["y"] for r in table.column("output").to_pylist()] == [i * i for i in range(40)]


def test_a_raising_model_exits_1_naming_model_file_and_lines(workdir: Path) -> None:
    proc = paralela(workdir, "models:Raises", "-i", "data.jsonl", "-o", "out", "--batch-size", "5")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: models:Raises.predict raised KeyError")
    assert "records 10-14 of shard 0 (data.jsonl lines 11-15)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("models:Wrong", "takes constructor arguments"),
        ("models:Missing", "has no attribute 'Missing'"),
        ("nomodule:Square", "No module named 'nomodule'"),
    ],
)
def test_a_bad_class_exits_2(workdir: Path, spec: str, says: str) -> None:
    proc = paralela(workdir, spec, "-i", "data.jsonl", "-o", "out")
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert not (workdir / "out").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers-per-gpu", "2", "--gpus", "none"], "workers_per_gpu=2 shares GPUs"),
        (["--gpus", "7"], "GPU '7' in gpus='7' is not visible"),
        (["--option", "slurm_partition=x"], "backend_options are options of backend='slurm'"),
        (["--input-format", "xml"], "Unknown input format 'xml'"),
    ],
)
def test_bad_options_exit_2(workdir: Path, args: list[str], says: str) -> None:
    proc = paralela(workdir, "models:Square", "-i", "data.jsonl", "-o", "out", *args)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert not (workdir / "out").exists()


def test_a_non_utf8_input_exits_1_naming_file_and_line(workdir: Path) -> None:
    (workdir / "bad.txt").write_bytes(b"ok\n\xfe\n")
    proc = paralela(workdir, "models:Square", "-i", "bad.txt", "-o", "out")
    assert proc.returncode == 1, proc.stderr
    assert "bad.txt line 2: byte 0xfe at column 1 is not valid utf-8" in proc.stderr


def test_ctrl_c_exits_130_with_a_resume_hint(workdir: Path) -> None:
    proc = paralela(workdir, "models:Interrupting", "-i", "data.jsonl", "-o", "out",
                    "--run-dir", "run", "--batch-size", "4")  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert "Interrupted. Finished shards are kept in run; run the same command again" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not [p for p in (workdir / "out").iterdir() if p.name.startswith(".tmp")]
