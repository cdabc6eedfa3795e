"""A ``paralela map`` batch job that hits its Slurm time limit, then resumed.

At the time limit Slurm sends SIGTERM to every process of the job step (the driver and
its workers), then SIGKILL after ``KillWait`` (5 s on the local cluster,
tools/local-slurm.sh). The driver must stop in that time, keep the chunks that finished
(and ``summary.json``), and say how to resume; the rerun computes only what is missing.
The time limit is a real one: Slurm's resolution is a minute, so the job runs about 65 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

ITEMS = 2000  # 0.1 s each in the job, with 2 workers: far more than its 1-minute limit

WORK = """\
import os, time


def slow_square(x):
    with open("calls.log", "a") as log:
        log.write(f"{x}\\n")
    if os.environ.get("SLURM_JOB_ID"):  # in the job; the rerun is quick
        time.sleep(0.1)
    return x * x
"""


def test_a_job_past_its_time_limit_keeps_finished_chunks_and_resumes(
    slurm_cluster: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    (tmp_path / "work.py").write_text(WORK)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(ITEMS)))
    args = ["map", "work:slow_square", "-i", "items.jsonl", "-o", "out.jsonl"]
    args += ["--run-dir", "run", "--workers", "2", "--chunksize", "4", "--no-progress"]
    script = tmp_path / "job.sh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/bash
            #SBATCH --partition={slurm_cluster}
            #SBATCH --time=1
            #SBATCH --cpus-per-task=2
            #SBATCH --output={tmp_path}/job.out
            cd {tmp_path}
            exec {sys.executable} -m paralela {" ".join(args)}
            """
        )
    )
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:

        def job_ended() -> bool:
            queue = subprocess.run(
                ["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30
            )
            return not queue.stdout.strip()

        poll(job_ended, timeout=200, what=f"job {job} to reach its time limit")
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)

    state = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    said = (tmp_path / "job.out").read_text()
    assert state == ["TIMEOUT"], said
    # Stopped within KillWait: the driver said so (a SIGKILL says nothing).
    assert "Stopped by SIGTERM (scancel, a time limit or preemption)." in said, said
    assert "Finished chunks are kept in run; run again to resume." in said, said
    assert "Traceback" not in said, said
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    chunks = list((tmp_path / "run" / "chunks").iterdir())
    assert chunks
    assert all(p.suffix == ".pkl" for p in chunks), chunks
    finished = set()
    for p in chunks:
        start, end = (int(n) for n in p.stem.split("-"))
        finished |= set(range(start, end))
    assert summary["computed_items"] >= len(finished) > 0
    assert len(finished) < ITEMS
    first = len((tmp_path / "calls.log").read_text().split())

    done = subprocess.run(
        [sys.executable, "-m", "paralela", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["result"] for line in lines] == [i * i for i in range(ITEMS)]
    again = {int(x) for x in (tmp_path / "calls.log").read_text().split()[first:]}
    assert not again & finished, "the rerun computed items of chunks that had finished"
    assert again | finished == set(range(ITEMS))
