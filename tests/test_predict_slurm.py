"""``paralela.predict(..., backend="slurm")`` on the real local Slurm cluster: shards run
in array tasks that build the model once per worker and end when their shards are done;
running again with the run directory submits nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from predict_helpers import Marked, Raises, marks, rows, serial

import paralela
from paralela.serving import ModelError


@pytest.mark.slurm
def test_predict_on_slurm_equals_a_serial_loop_and_resumes(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    monkeypatch.setenv("PREDICT_MARKS", str(marks_dir))
    records = [{"id": i, "x": i} for i in range(400)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job: dict[str, Any] = {
        "output": tmp_path / "out",
        "run_dir": tmp_path / "run",
        "batch_size": 9,
        "split_bytes": 1500,
        "backend": "slurm",
        "backend_options": {
            "slurm_partition": slurm_cluster,
            "slurm_job_dir": str(tmp_path / "jobs"),
            "cpus_per_task": 1,
            "timeout_min": 5,
            "max_jobs": 2,
        },
        "progress": False,
    }
    result = paralela.predict(Marked, str(tmp_path / "data.jsonl"), **job)
    found = rows(result.files)
    shards: dict[int, list[Any]] = {}
    for row in found:
        shards.setdefault(row["shard"], []).append(row["input"])
    by_shard = [shards[s] for s in sorted(shards)]
    assert [r for shard in by_shard for r in shard] == records
    assert [row["output"] for row in found] == serial(by_shard, 9, "cpu")
    assert result.shards > 2  # several shards, packed into at most 2 array tasks
    assert result.devices == {"cpu": result.shards}  # the tasks were given no GPU
    assert len(list((tmp_path / "jobs").iterdir())) == 1  # one array job
    # Each array task (a worker: one CPU, so the task's own process) set the model up once.
    setups = marks(marks_dir, "setup")
    assert len(setups) <= 2 < result.shards
    assert {pid for pid, _ in setups} == {pid for pid, _ in marks(marks_dir, "batch")}
    # Running again reads every shard back from the run directory, submitting nothing.
    again = paralela.predict(Marked, str(tmp_path / "data.jsonl"), **job)
    assert again.shards_reused == again.shards == result.shards
    assert again.records == 400
    assert len(list((tmp_path / "jobs").iterdir())) == 1
    assert rows(again.files) == found


@pytest.mark.slurm
def test_a_task_given_gpus_sets_up_one_model_per_gpu_on_cuda_0(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    monkeypatch.setenv("PREDICT_MARKS", str(marks_dir))
    records = [{"id": i, "x": i} for i in range(300)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    options = {
        "slurm_partition": slurm_cluster,
        "slurm_job_dir": str(tmp_path / "jobs"),
        "cpus_per_task": 2,
        "gpus_per_task": 2,
        "timeout_min": 5,
        "max_jobs": 2,
    }
    result = paralela.predict(Marked, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                              batch_size=8, split_bytes=800, backend="slurm",
                              backend_options=options, progress=False)  # fmt: skip
    found = rows(result.files)
    assert [row["input"] for row in found] == records
    assert {row["output"]["device"] for row in found} == {"cuda:0"}
    # Each array task ran one worker per granted GPU, each seeing only its own GPU and
    # setting its model up once, on cuda:0 (the one GPU it sees).
    setups = marks(marks_dir, "setup")
    assert {data["device"] for _, data in setups} == {"cuda:0"}
    by_task: dict[str, list[str]] = {}
    for _, data in setups:
        assert data["visible"]
        assert "," not in data["visible"]
        by_task.setdefault(data["task"], []).append(data["visible"])
    assert all(len(set(gpus)) == len(gpus) for gpus in by_task.values())
    assert len({pid for pid, _ in setups}) == len(setups)


@pytest.mark.slurm
def test_a_raising_model_in_an_array_task_names_the_shard(
    slurm_cluster: str, tmp_path: Path
) -> None:
    records: list[dict[str, Any]] = [{"id": i, "x": i} for i in range(40)]
    records[21]["bad"] = True
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    options = {"slurm_partition": slurm_cluster, "slurm_job_dir": str(tmp_path / "jobs"),
               "cpus_per_task": 1, "timeout_min": 5, "max_jobs": 2}  # fmt: skip
    with pytest.raises(ModelError) as caught:
        paralela.predict(Raises, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                         batch_size=5, backend="slurm", backend_options=options,
                         progress=False)  # fmt: skip
    message = str(caught.value)
    assert "Raises.predict raised ValueError: cannot predict record 21" in message
    assert "records 20-24 of shard 0 (" in message
    assert "data.jsonl lines 21-25)" in message
    assert isinstance(caught.value.__cause__, ValueError)


GPU_DRIVER = """
import json, sys
sys.path.insert(0, {tests!r})
import paralela
from predict_helpers import Marked
result = paralela.predict(Marked, {data!r}, output={output!r}, batch_size=5, split_bytes=600,
                          workers_per_gpu={per_gpu}, progress=False)
print(json.dumps({{"devices": result.devices, "workers": result.workers}}))
"""


@pytest.mark.slurm
@pytest.mark.parametrize("per_gpu", [1, 2])
def test_local_workers_are_pinned_one_per_gpu_slot_of_an_allocation(
    slurm_cluster: str, tmp_path: Path, per_gpu: int
) -> None:
    """The processes backend on a machine with GPUs (here: inside an allocation of the
    local cluster's two GPUs): each worker is pinned to its slot's GPU before it starts,
    sees only that GPU, and its model is set up on cuda:0."""
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    records = [{"id": i, "x": i} for i in range(200)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    script = GPU_DRIVER.format(tests=str(Path(__file__).parent), data=str(tmp_path / "data.jsonl"),
                               output=str(tmp_path / "out"), per_gpu=per_gpu)  # fmt: skip
    proc = subprocess.run(
        ["srun", "-p", slurm_cluster, "-N1", "-n1", "-c2", "--gpus=2", "--time=5",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
        env={**os.environ, "PREDICT_MARKS": str(marks_dir)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["workers"] == 2 * per_gpu
    assert list(summary["devices"]) == ["cuda:0"]
    found = rows(sorted(str(p) for p in (tmp_path / "out").glob("part-*.jsonl")))
    assert [row["input"] for row in found] == records
    assert {row["output"]["device"] for row in found} == {"cuda:0"}
    setups = marks(marks_dir, "setup")
    assert {data["device"] for _, data in setups} == {"cuda:0"}
    by_gpu: dict[str, set[int]] = {}
    for pid, data in setups:
        by_gpu.setdefault(data["visible"], set()).add(pid)
    assert set(by_gpu) <= {"0", "1"}  # each worker sees exactly one of the two GPUs
    assert all(len(pids) <= per_gpu for pids in by_gpu.values())
    assert len(setups) == len({pid for pid, _ in setups}) <= 2 * per_gpu


@pytest.mark.slurm
def test_the_cli_with_backend_slurm(slurm_cluster: str, tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(
        "class Square:\n"
        "    def setup(self, device):\n"
        "        self.device = device\n"
        "    def predict(self, batch):\n"
        "        return [r['x'] ** 2 for r in batch]\n"
    )
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"x": i}) + "\n" for i in range(90)))
    args = ["models:Square", "--input", "data.jsonl", "--output", "out", "--backend", "slurm",
            "--option", f"slurm_partition={slurm_cluster}", "--option", "slurm_job_dir=jobs",
            "--option", "cpus_per_task=1", "--option", "max_jobs=2", "--run-dir", "run",
            "--split-bytes", "300", "--no-progress"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "paralela", "predict", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = rows(sorted(str(p) for p in (tmp_path / "out").glob("part-*.jsonl")))
    assert [(row["input"]["x"], row["output"]) for row in found] == [(i, i * i) for i in range(90)]
    assert "paralela predict: 90 records in" in proc.stderr
    assert len(list((tmp_path / "jobs").iterdir())) == 1  # one array job
    again = subprocess.run([sys.executable, "-m", "paralela", "predict", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=90)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "reused" in again.stderr
    assert len(list((tmp_path / "jobs").iterdir())) == 1  # nothing submitted again
