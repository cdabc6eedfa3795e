"""The cluster's limits, respected: ``MaxArraySize`` read and never exceeded, the ``%N``
throttle, sbatch refusals that pass waited out with a bounded exponential backoff, and
one line saying what was limited and why.

Refusals are played by a fake ``sbatch`` first on ``PATH`` (a real cluster cannot be
made to refuse on cue without reconfiguring it); array splitting, the throttle and a
refusal the backoff must not retry run on the real local Slurm cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import paralela.backends.slurm._backend as backend_module
import paralela.backends.slurm._commands as commands
from paralela.backends.slurm import ClusterLimits, SlurmBackend, SlurmCommandError, submit_script
from paralela.backends.slurm._commands import cluster_limits, transient_refusal

# What Slurm 22.05's sbatch prints when the QOS's MaxSubmitJobsPerUser is reached.
QOS_REFUSAL = (
    "sbatch: error: QOSMaxSubmitJobPerUserLimit\n"
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
    "(job submit limit, user's size and/or time limits)"
)

# A fake sbatch: refuses (exit 1, $REFUSAL on stderr) the first $REFUSE_TIMES calls,
# then prints a job id; every call appends its arguments to $SBATCH_CALLS.
FAKE_SBATCH = f"""#!{sys.executable}
import os, sys
calls = os.environ["SBATCH_CALLS"]
with open(calls, "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\\n")
with open(calls) as fh:
    made = len(fh.read().splitlines())
if made <= int(os.environ["REFUSE_TIMES"]):
    sys.stderr.write(os.environ["REFUSAL"] + "\\n")
    sys.exit(1)
print("4242")
"""


class FakeClock:
    """The backoff's clock: time passes only when it sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(commands, "_now", fake.monotonic)
    monkeypatch.setattr(commands, "_sleep", fake.sleep)
    return fake


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake sbatch first on PATH; returns the file its calls are written to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "sbatch"
    tool.write_text(FAKE_SBATCH)
    tool.chmod(0o755)
    calls = tmp_path / "sbatch-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_CALLS", str(calls))
    monkeypatch.setenv("REFUSAL", QOS_REFUSAL)
    return calls


def made(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_submit_limit_refusal_is_waited_out_with_one_line_each_time(
    fake_sbatch: Path, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("REFUSE_TIMES", "7")
    assert submit_script(tmp_path / "job.sh", ["--array=0-9"]) == "4242"
    assert len(made(fake_sbatch)) == 8  # seven refusals, then the job
    assert clock.sleeps == [2, 4, 8, 16, 32, 60, 60]  # doubling, capped at 60 s
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 7
    assert all("QOSMaxSubmitJobPerUserLimit" in line for line in lines)
    assert "limits how many jobs you may have queued" in lines[0]
    assert "trying again in 2 s (refused for 0 s, giving up after 600 s)" in lines[0]
    assert "trying again in 60 s (refused for 122 s" in lines[-1]


def test_the_backoff_gives_up_after_retry_for_and_raises_slurms_reason(
    fake_sbatch: Path, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("REFUSE_TIMES", "1000")  # refuses for ever
    with pytest.raises(SlurmCommandError, match="QOSMaxSubmitJobPerUserLimit"):
        submit_script(tmp_path / "job.sh", retry_for=300)
    # 2+4+8+16+32+60+60+60 = 242 s waited; one more 60 s wait would pass 300 s.
    assert clock.sleeps == [2, 4, 8, 16, 32, 60, 60, 60]
    assert len(made(fake_sbatch)) == 9
    assert len(capsys.readouterr().err.splitlines()) == 8
    with pytest.raises(SlurmCommandError, match="QOSMaxSubmitJobPerUserLimit"):
        submit_script(tmp_path / "job.sh", retry_for=0)  # never retried
    assert len(made(fake_sbatch)) == 10


def test_a_refusal_that_waiting_cannot_cure_is_raised_at_once(
    fake_sbatch: Path, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("REFUSE_TIMES", "1")
    monkeypatch.setenv(
        "REFUSAL", "sbatch: error: Batch job submission failed: Invalid partition name specified"
    )
    with pytest.raises(SlurmCommandError, match="Invalid partition name"):
        submit_script(tmp_path / "job.sh")
    assert len(made(fake_sbatch)) == 1
    assert clock.sleeps == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (QOS_REFUSAL, "QOSMaxSubmitJobPerUserLimit"),
        ("sbatch: error: AssocMaxSubmitJobLimit", "AssocMaxSubmitJobLimit"),
        (
            "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
            "temporarily unable to accept job",
        ),
        (
            "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
            "Resource temporarily unavailable",
        ),
        ("sbatch: error: Invalid job array specification", None),
        ("sbatch: error: Socket timed out on send/recv operation", None),  # may have queued
    ],
)
def test_which_refusals_pass(output: str, reason: str | None) -> None:
    found = transient_refusal(output)
    assert (found.split(":")[0] if found else None) == reason


def test_the_binding_limit_is_named() -> None:
    assert ClusterLimits(1001, 10000, 500, "").binding() == "MaxSubmitJobs=500"
    assert ClusterLimits(1001, 10000, None, "").binding() == "MaxArraySize=1001"
    assert ClusterLimits(None, None, None, "").binding() == ""


# -- the real cluster ------------------------------------------------------------------


def double(x: int) -> int:
    return 2 * x


def array_record(job_id: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30
    ).stdout


@pytest.mark.slurm
def test_the_real_clusters_max_array_size_is_read_and_bounds_max_jobs(
    slurm_cluster: str, tmp_path: Path, capsys: Any
) -> None:
    limits = cluster_limits()
    assert limits.max_array_size is not None
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert f"MaxArraySize            = {limits.max_array_size}" in config
    opts = {"slurm_partition": slurm_cluster, "slurm_job_dir": str(tmp_path / "jobs")}
    backend = SlurmBackend(opts, max_jobs=limits.max_array_size + 50)
    try:
        assert backend.max_tasks() == limits.max_tasks() <= limits.max_array_size
        assert backend.max_tasks() == backend.max_tasks()  # said once, not per call
    finally:
        backend.shutdown()
    err = capsys.readouterr().err
    assert err.count("paralela: at most") == 1
    assert f"MaxArraySize={limits.max_array_size}" in err
    # What exceeding it would meet: the real sbatch refuses, and no backoff retries that.
    script = tmp_path / "true.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SlurmCommandError, match=r"(?i)array"):
        submit_script(script, [f"--array=0-{limits.max_array_size}", "-p", slurm_cluster])


@pytest.mark.slurm
def test_calls_beyond_the_array_limit_go_as_several_throttled_arrays(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # A cluster whose MaxArraySize is 3 (the shared cluster's real one is not changed).
    monkeypatch.setattr(backend_module, "cluster_limits", lambda: ClusterLimits(3, None, None, ""))
    opts = {
        "slurm_partition": slurm_cluster,
        "slurm_job_dir": str(tmp_path / "jobs"),
        "cpus_per_task": 1,
        "timeout_min": 5,
    }
    backend = SlurmBackend(opts)
    try:
        futures = [backend.submit(double, i) for i in range(7)]
        backend.flush()
        assert [f.result(timeout=240) for f in futures] == [2 * i for i in range(7)]
    finally:
        backend.shutdown(cancel_futures=True)
    assert backend.arrays_submitted == 3  # 3 + 3 + 1
    assert backend.tasks_submitted == 7
    ids = [(d / "array_id").read_text().strip() for d in (tmp_path / "jobs").iterdir()]
    assert len(ids) == 3
    for job_id in ids:
        record = array_record(job_id)
        assert "ArrayTaskThrottle=256" in record  # submitit's default %N
        tasks = {
            line.split("ArrayTaskId=")[1].split()[0]
            for line in record.splitlines()
            if "ArrayTaskId=" in line
        }
        assert tasks
        assert tasks <= {"0", "1", "2"}
    err = capsys.readouterr().err
    assert "7 tasks go to Slurm as 3 arrays of at most 3" in err
    assert "the cluster's MaxArraySize=3" in err


# -- scheduler calls do not grow with the tasks -----------------------------------------

# A fake scontrol: `show job ID` prints one record per task of an array of $TASKS tasks
# (every one COMPLETED), and appends its arguments to $SCONTROL_CALLS.
FAKE_SCONTROL = f"""#!{sys.executable}
import os, sys
with open(os.environ["SCONTROL_CALLS"], "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\\n")
job = sys.argv[-1]
for task in range(int(os.environ["TASKS"])):
    print(f"JobId={{int(job) + task + 1}} ArrayJobId={{job}} ArrayTaskId={{task}} "
          "JobName=paralela\\n   JobState=COMPLETED Reason=None ExitCode=0:0")
"""


@pytest.mark.parametrize("tasks", [10, 5000])
def test_a_state_poll_asks_once_per_array_whatever_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tasks: int
) -> None:
    from paralela.backends.slurm import StateReader

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "scontrol"
    tool.write_text(FAKE_SCONTROL)
    tool.chmod(0o755)
    calls = tmp_path / "scontrol-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_CALLS", str(calls))
    monkeypatch.setenv("TASKS", str(tasks))
    states = StateReader(use_sacct=False).query(["100000", "200000", "300000"])
    assert len(states) == 3 * tasks
    assert all(s.state == "COMPLETED" for s in states.values())
    assert made(calls) == [f"show job {j}" for j in ("100000", "200000", "300000")]
