"""``srun paralela launch`` on the real local Slurm cluster: 2 ranks on 2 emulated nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

# A 2-node job waits for both nodes to be free; other Slurm tests may hold them.
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "distributed_scripts" / "ddp_steps.py"


def run_job(script: str, workdir: Path, timeout: float = 270) -> tuple[str, str]:
    """Submit an sbatch script, wait until the job left the queue; (job id, its output)."""
    path = workdir / "job.sh"
    path.write_text(script)
    job = subprocess.run(
        ["sbatch", "--parsable", "-o", str(workdir / "job-%j.out"), str(path)],
        capture_output=True, text=True, check=True, timeout=30, cwd=workdir,
    ).stdout.strip().split(";")[0]  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        if not state:
            break
        time.sleep(0.3)
    else:
        subprocess.run(["scancel", job], timeout=30)
        pytest.fail(f"job {job} still queued or running after {timeout} s")
    return job, (workdir / f"job-{job}.out").read_text()


def test_ddp_over_two_nodes_equals_one_process(slurm_cluster: str, tmp_path: Path) -> None:
    python = sys.executable
    job, output = run_job(
        f"""#!/bin/bash
#SBATCH -p {slurm_cluster}
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH -t 5
export OMP_NUM_THREADS=1
srun {python} -m paralela launch {SCRIPT} --out {tmp_path}/ddp.pt
""",
        tmp_path,
    )
    assert (tmp_path / "ddp.pt").exists(), output
    subprocess.run(
        [python, str(SCRIPT), "--mode", "single", "--out", str(tmp_path / "single.pt")],
        check=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    assert max(float((ddp[k] - single[k]).abs().max()) for k in ddp) < 1e-6
    # Each node's launcher recorded its rank, on its own node, in one shared directory.
    logs = tmp_path / "paralela-runs" / f"launch-ddp_steps-{job}"
    records = [json.loads((logs / f"launch-node{n}.json").read_text()) for n in (0, 1)]
    ranks = {r["rank"]: r["host"] for rec in records for r in rec["attempts"][0]}
    assert ranks == {0: "node1", 1: "node2"}
    assert {rec["master"].split(":")[0] for rec in records} == {"node1"}
    assert {rec["world_size"] for rec in records} == {2}


def test_a_missing_task_fails_the_preflight_under_slurm(slurm_cluster: str, tmp_path: Path) -> None:
    # Two tasks of one step, but task 1 runs something else: rank 0 waits for it in vain.
    python = sys.executable
    _, output = run_job(
        f"""#!/bin/bash
#SBATCH -p {slurm_cluster}
#SBATCH -n 2
#SBATCH -t 5
srun bash -c 'if [ "$SLURM_PROCID" = 0 ]; then exec {python} -m paralela launch \\
  --preflight-timeout 2 {SCRIPT} --out {tmp_path}/x.pt; else echo task 1 never launches; fi'
echo "srun exit $?"
""",
        tmp_path,
    )
    assert "did not reach the preflight rendezvous" in output
    assert "rank 1 (" in output
    assert "srun exit 5" in output
    assert not (tmp_path / "x.pt").exists()
