"""``paralela launch --slurm``: the batch script, its options, and real jobs on the local
Slurm cluster (2 emulated nodes): 2-rank DDP equal to one process, a rank that dies,
Ctrl-C cancelling the job, a job Slurm refuses.

The unit tests run the written batch script itself with bash against a fake ``srun``
that records its arguments, so quoting is checked by the shell that will run it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import default_sigint

import paralela.backends.slurm._jobs as slurm_job
from paralela.backends.slurm import (
    JOB_OPTIONS,
    JobOptions,
    JobRun,
    JobState,
    SlurmCommandError,
    job_options,
    run_job,
)
from paralela.cli._errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from paralela.distributed._launch_slurm import launch_failure, launch_script, submit_launch
from paralela.errors import ConfigError, DistributedError, RankFailedError, RendezvousError

DDP = Path(__file__).parent / "distributed_scripts" / "ddp_steps.py"
PYTHON = sys.executable
# A job may wait in the queue behind others' jobs on a shared cluster: each real test may
# take this long in all (alone on the cluster, each takes 2 to 10 s); the command under
# test gets a little less, then is interrupted (which cancels its job).
SLURM_TEST_TIMEOUT = 300
CLI_TIMEOUT = 240

# A fake srun: writes its arguments and a few variables as JSON to $SRUN_RECORD.
FAKE_SRUN = f"""#!{PYTHON}
import json, os, sys
with open(os.environ["SRUN_RECORD"], "w") as fh:
    json.dump({{"argv": sys.argv[1:], "omp": os.environ.get("OMP_NUM_THREADS")}}, fh)
"""


def write_tool(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(text)
    tool.chmod(0o755)
    return tool


def run_script_with_fake_srun(
    script: str, tmp_path: Path, env: dict[str, str]
) -> dict[str, object]:
    """Run a batch script with bash (as Slurm would) against the fake srun."""
    bin_dir = tmp_path / "fakebin"
    write_tool(bin_dir, "srun", FAKE_SRUN)
    path = tmp_path / "job.sh"
    path.write_text(script)
    record = tmp_path / "srun.json"
    subprocess.run(
        ["bash", str(path)],
        check=True,
        timeout=30,
        env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_RECORD": str(record)},
    )
    result: dict[str, object] = json.loads(record.read_text())
    return result


# -- the batch script ----------------------------------------------------------------


def test_the_batch_script_asks_for_the_job_and_runs_one_launcher_per_task(
    tmp_path: Path,
) -> None:
    options = job_options(
        {
            "nodes": 2,
            "ntasks_per_node": 4,
            "gpus_per_node": 4,
            "cpus_per_task": 8,
            "mem_gb": 16,
            "timeout_min": 30,
            "slurm_partition": "gpu",
            "slurm_account": "proj1",
            "slurm_additional": {"exclusive": True, "reservation": "r1"},
            "slurm_setup": ["module load cuda"],
        }
    )
    script = launch_script(
        ["train.py", "--name", "a b", "--lr", "{lr}"],
        options,
        max_restarts=2,
        preflight_timeout=30,
        log_dir="/runs/launch-train-${SLURM_JOB_ID}",
        output=Path("/runs/launch-train-%j.out"),
        workdir=Path("/work dir"),
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [ln.removeprefix("#SBATCH ") for ln in lines if ln.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=paralela-launch-train",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--cpus-per-task=8",
        "--gpus-per-node=4",
        "--mem=16384M",
        "--time=30",
        "--partition=gpu",
        "--account=proj1",
        "--exclusive",
        "--reservation=r1",
        "--output=/runs/launch-train-%j.out",
        '--chdir="/work dir"',  # sbatch reads a quoted value with spaces
    ]
    assert "module load cuda" in lines
    assert any(ln.startswith("exec srun --kill-on-bad-exit=1 ") for ln in lines)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=30)

    # What srun gets once bash has expanded the job id and removed the quotes.
    seen = run_script_with_fake_srun(
        script.replace("module load cuda", "true"),
        tmp_path,
        {"SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "8"},
    )
    assert seen["argv"] == [
        "--kill-on-bad-exit=1",
        PYTHON,
        "-m",
        "paralela",
        "launch",
        "--max-restarts",
        "2",
        "--preflight-timeout",
        "30",
        "--stop-grace",
        "5",
        "--tf-ps",
        "0",
        "--log-dir",
        "/runs/launch-train-4242",
        "train.py",
        "--name",
        "a b",
        "--lr",
        "{lr}",
    ]
    assert seen["omp"] == "8"


def test_a_module_and_no_prefix_reach_the_launchers(tmp_path: Path) -> None:
    script = launch_script(
        ["mypkg.train", "--epochs", "1"],
        JobOptions(),
        module=True,
        prefix=False,
        log_dir="/given/logs",
        output=tmp_path / "out-%j",
        workdir=tmp_path,
    )
    seen = run_script_with_fake_srun(script, tmp_path, {"SLURM_JOB_ID": "7"})
    argv = seen["argv"]
    assert isinstance(argv, list)
    assert argv[-6:] == ["--module", "--log-dir", "/given/logs", "mypkg.train", "--epochs", "1"]
    assert "--no-prefix" in argv
    assert seen["omp"] == "1"  # no --cpus-per-task: one thread


# -- options -------------------------------------------------------------------------


def test_an_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        submit_launch(["train.py"], partition="debug", gpu=1)
    message = str(caught.value)
    assert "'partition' (did you mean 'slurm_partition'?)" in message
    assert "'gpu'" in message
    assert "launch --slurm" in message
    assert ", ".join(JOB_OPTIONS) in message


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"nodes": 0}, "nodes must be an integer of at least 1"),
        ({"ntasks_per_node": 0}, "ntasks_per_node must be an integer of at least 1"),
        ({"gpus_per_node": "two"}, "gpus_per_node must be an integer"),
        ({"mem_gb": -1}, "mem_gb must be a positive number"),
        ({"timeout_min": 0}, "timeout_min must be an integer of at least 1"),
        ({"slurm_partition": ""}, None),  # empty means "not given"
        ({"gpus_per_node": 2, "gpus_per_task": 1}, "not both"),
    ],
)
def test_option_values_are_checked(options: dict[str, object], expected: str | None) -> None:
    if expected is None:
        assert job_options(options).partition is None
        return
    with pytest.raises(ConfigError, match=expected):
        job_options(options)


def test_given_options_only_become_directives() -> None:
    assert JobOptions().directives() == ["--nodes=1", "--ntasks-per-node=1"]
    opts = job_options({"nodes": "2", "gpus_per_task": 1, "slurm_additional": "--exclusive"})
    assert opts.directives() == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-task=1",
        "--exclusive",
    ]


def test_nothing_is_submitted_without_slurm_or_for_a_missing_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        submit_launch(["missing.py"])
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="needs Slurm's commands on PATH"):
        submit_launch(["train.py"], nodes=2)
    assert not (tmp_path / "paralela-runs").exists()


def test_cli_slurm_options_need_slurm_and_local_options_do_not_go_with_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    base = [PYTHON, "-m", "paralela", "launch"]
    done = subprocess.run(
        [*base, "--nodes", "2", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE
    assert "--nodes is an option of Slurm jobs: add --slurm" in done.stderr
    done = subprocess.run(
        [*base, "--slurm", "--nproc", "2", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE
    assert "do not go with --slurm" in done.stderr


# -- what a failed job is reported as ------------------------------------------------


def fake_run(tmp_path: Path, state: str, output: str = "") -> JobRun:
    out = tmp_path / "job.out"
    out.write_text(output)
    return JobRun("77", JobState("77", state, "1:0", "sacct"), tmp_path / "job.sbatch", out, 1.0)


def write_records(log_dir: Path, ranks: list[tuple[int, str, int, float]]) -> None:
    """launch-node<N>.json as the in-job launchers write them: (rank, host, code, end)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for node, (rank, host, code, end) in enumerate(ranks):
        log = log_dir / f"rank-{rank}.log"
        log.write_text(f"=== header ===\nlast words of rank {rank}\n")
        record = {"attempts": [[{"rank": rank, "host": host, "returncode": code, "end": end,
                                 "log": str(log)}]]}  # fmt: skip
        (log_dir / f"launch-node{node}.json").write_text(json.dumps(record))


def test_the_rank_that_died_first_is_named(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # Rank 1 was killed first; rank 0 failed a moment later when its peer vanished.
    write_records(logs, [(0, "node1", 1, 1000.5), (1, "node2", -9, 1000.1)])
    error = launch_failure(fake_run(tmp_path, "FAILED"), logs)
    assert isinstance(error, RankFailedError)
    assert (error.rank, error.exitcode) == (1, -9)
    assert error.log_path == str(logs / "rank-1.log")
    assert "Rank 1 (on node2) died first: killed by SIGKILL" in str(error)
    assert "Slurm job 77 ended FAILED" in str(error)
    assert "last words of rank 1" in str(error)


@pytest.mark.parametrize(
    ("death", "code"), [("exit code 3", 3), ("killed by SIGKILL (often the OOM killer)", -9)]
)
def test_a_death_missing_from_the_records_is_read_from_the_output(
    tmp_path: Path, death: str, code: int
) -> None:
    # Two tasks on one node share a record file: the rank that exited 0 wrote last.
    logs = tmp_path / "logs"
    write_records(logs, [(1, "node1", 0, 1000.0)])
    output = (
        "[rank 0] starting\n"
        f"Error: Rank 0 (pid 123 on node1) died: {death}. Its log: {logs}/rank-0.log\n"
        "Last lines:\n  starting\nsrun: error: node1: task 0: Exited with exit code 1\n"
    )
    (logs / "rank-0.log").write_text("starting\n")
    error = launch_failure(fake_run(tmp_path, "FAILED", output), logs)
    assert isinstance(error, RankFailedError)
    assert (error.rank, error.exitcode, error.log_path) == (0, code, f"{logs}/rank-0.log")
    assert "Rank 0 (on node1) died first" in str(error)


def test_a_failed_preflight_is_a_rendezvous_error(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_records(logs, [(0, "node1", 97, 1000.0)])
    output = "Error: 1 of 2 rank(s) did not reach the preflight rendezvous at node1:1: rank 1\n"
    error = launch_failure(fake_run(tmp_path, "FAILED", output), logs)
    assert isinstance(error, RendezvousError)
    assert "did not reach the preflight rendezvous" in str(error)


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("CANCELLED", "cancelled"),
        ("TIMEOUT", "raise timeout_min"),
        ("NODE_FAIL", "a node failed"),
        ("VANISHED", "no Slurm command knows it"),
        ("FAILED", "no rank reported a failure"),
    ],
)
def test_a_job_that_ended_otherwise_is_named_by_its_state(
    tmp_path: Path, state: str, words: str
) -> None:
    error = launch_failure(fake_run(tmp_path, state, "srun: error: something\n"), tmp_path / "x")
    assert type(error) is DistributedError
    assert f"Slurm job 77 ended {state}" in str(error)
    assert words in str(error)
    assert "srun: error: something" in str(error)  # the output's tail


# -- never waiting forever -----------------------------------------------------------


class _Reader:
    """A job-state reader that never knows the job, or whose commands always fail."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.asked = 0

    def query(self, job_ids: list[str]) -> dict[str, JobState]:
        self.asked += 1
        if self.fail:
            raise SlurmCommandError(["squeue"], 1, "slurm_load_jobs error: Unable to contact")
        return {}


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An sbatch that only prints a job id, and a quick "lost" limit."""
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "sbatch", "#!/bin/sh\necho 4242\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_job, "LOST_AFTER_S", 0.5)
    monkeypatch.setattr(slurm_job, "OUTPUT_WAIT_S", 0.1)
    return tmp_path


@pytest.mark.parametrize("fail", [False, True])
def test_a_job_no_command_knows_ends_the_wait(fake_sbatch: Path, fail: bool) -> None:
    reader = _Reader(fail)
    started = time.monotonic()
    kwargs: dict[str, Any] = {
        "script_path": fake_sbatch / "job-{job}.sbatch",
        "output_pattern": fake_sbatch / "job-%j.out",
        "workdir": fake_sbatch,
        "label": "test",
        "reader": reader,
    }
    if fail:
        with pytest.raises(SlurmCommandError, match="gave up waiting for job 4242"):
            run_job("#!/bin/bash\ntrue\n", **kwargs)
    else:
        run = run_job("#!/bin/bash\ntrue\n", **kwargs)
        assert run.job_id == "4242"
        assert run.state.state == "VANISHED"
        assert run.script == fake_sbatch / "job-4242.sbatch"
        assert run.script.read_text() == "#!/bin/bash\ntrue\n"
    assert time.monotonic() - started < 10
    assert reader.asked >= 2


# -- real jobs on the local cluster --------------------------------------------------


def cli(
    args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``paralela launch ARGS``; on a timeout, Ctrl-C (which cancels the job) and fail."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "paralela", "launch", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=default_sigint,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"launch --slurm still running after {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def job_id_of(stderr: str) -> str:
    return stderr.split("submitted Slurm job ", 1)[1].split()[0]


def final_state(job: str, timeout: float = 30) -> str:
    """The job's state as the controller has it, once it left COMPLETING (sacct, which
    the command reads first, can call a job done a moment before scontrol does)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run(
            ["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30
        ).stdout
        state = shown.split("JobState=", 1)[1].split()[0] if "JobState=" in shown else "?"
        if state not in ("COMPLETING", "RUNNING") or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_ddp_over_two_nodes_equals_one_process(slurm_cluster: str, tmp_path: Path) -> None:
    done = cli(
        ["--slurm", "--nodes", "2", "--ntasks-per-node", "1", "--partition", slurm_cluster,
         "--time", "5", str(DDP), "--out", str(tmp_path / "ddp.pt")],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    job = job_id_of(done.stderr)
    assert f"Slurm job {job}: 2 rank(s) finished" in done.stderr
    # Both launchers' closing lines came through the streamed output.
    assert done.stdout.count("paralela launch: 2 rank(s) finished") == 2, done.stdout
    subprocess.run(
        [PYTHON, str(DDP), "--mode", "single", "--out", str(tmp_path / "single.pt")],
        check=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    assert max(float((ddp[k] - single[k]).abs().max()) for k in ddp) < 1e-6
    runs = tmp_path / "paralela-runs"
    script = (runs / f"launch-ddp_steps-{job}.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script
    assert "exec srun --kill-on-bad-exit=1" in script
    assert (runs / f"launch-ddp_steps-{job}.out").exists()
    logs = runs / f"launch-ddp_steps-{job}"
    records = [json.loads((logs / f"launch-node{n}.json").read_text()) for n in (0, 1)]
    assert {r["rank"]: r["host"] for rec in records for r in rec["attempts"][0]} == {
        0: "node1",
        1: "node2",
    }
    assert final_state(job) == "COMPLETED"


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_each_rank_of_a_node_takes_its_own_gpu(slurm_cluster: str, tmp_path: Path) -> None:
    # The fake GPUs have no driver: only Slurm's variables say they are there.
    (tmp_path / "gpu.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(f\"seen-{os.environ['RANK']}\").write_text(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    done = cli(
        ["--slurm", "--ntasks-per-node", "2", "--gpus-per-node", "2", "--partition",
         slurm_cluster, "--time", "5", "gpu.py"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = {(tmp_path / f"seen-{rank}").read_text() for rank in (0, 1)}
    assert seen == {"0", "1"}


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_dying_rank_fails_the_job_and_is_named(slurm_cluster: str, tmp_path: Path) -> None:
    done = cli(
        ["--slurm", "-N", "2", "--partition", slurm_cluster, "--time", "5", str(DDP),
         "--out", str(tmp_path / "ddp.pt"), "--die-at", "3"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr
    job = job_id_of(done.stderr)
    error = done.stderr.split("Error: ", 1)[1]
    assert error.startswith("Rank 1 (on node2) died first: killed by SIGKILL")
    assert f"Slurm job {job} ended FAILED and srun stopped the other ranks" in error
    assert f"launch-ddp_steps-{job}/rank-1.log" in error
    assert "rank 1 kills itself at step 3" in error  # its log's tail
    assert "[rank 1] rank 1 kills itself at step 3" in done.stdout  # streamed live
    assert not (tmp_path / "ddp.pt").exists()
    assert final_state(job) == "FAILED"


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_the_python_api_raises_rank_failed(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, sys\nprint('rank', os.environ['RANK'], flush=True)\n"
        "sys.exit(3 if os.environ['RANK'] == '0' else 0)\n"
    )
    console = tmp_path / "console.txt"
    with pytest.raises(RankFailedError) as caught, open(console, "wb") as out:
        submit_launch(["fails.py"], nodes=1, ntasks_per_node=2, slurm_partition=slurm_cluster,
                      timeout_min=5, console=out)  # fmt: skip
    assert (caught.value.rank, caught.value.exitcode) == (0, 3)
    assert "Rank 0 (on node" in str(caught.value)
    assert "exit code 3" in str(caught.value)
    assert "[rank 0] rank 0" in console.read_text()  # the job's output reached the console


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_ctrl_c_cancels_the_job(slurm_cluster: str, tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text(
        "import os, time\n"
        "print('rank', os.environ['RANK'], 'started', flush=True)\n"
        "time.sleep(120)\n"
    )
    stdout = tmp_path / "cli.out"
    stderr = tmp_path / "cli.err"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen(
            [PYTHON, "-m", "paralela", "launch", "--slurm", "-N", "2", "--partition",
             slurm_cluster, "--time", "5", str(script)],
            cwd=tmp_path, stdout=out, stderr=err, preexec_fn=default_sigint,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + CLI_TIMEOUT
            while stdout.read_text().count(" started") < 2:
                assert proc.poll() is None, stderr.read_text()
                assert time.monotonic() < deadline, "the ranks did not start in time"
                time.sleep(0.1)
            interrupted = time.monotonic()
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    said = stderr.read_text()
    assert code == EXIT_INTERRUPTED, said
    assert time.monotonic() - interrupted < 30
    job = job_id_of(said)
    assert f"cancelling Slurm job {job} (scancel)" in said
    assert "Interrupted. The Slurm job was cancelled." in said
    assert final_state(job) == "CANCELLED"
    queued = subprocess.run(
        ["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30
    ).stdout
    assert queued.strip() == ""


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_job_slurm_refuses_is_an_error_at_once(slurm_cluster: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('never runs')\n")
    done = cli(["--slurm", "--partition", "no_such_partition", "train.py"], tmp_path)
    assert done.returncode == EXIT_FAILED
    assert "sbatch" in done.stderr
    assert "invalid partition" in done.stderr.lower()
    assert list((tmp_path / "paralela-runs").iterdir()) == []  # no script left behind
