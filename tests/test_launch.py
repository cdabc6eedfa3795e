"""``paralela launch`` with real rank processes: environment, logs, failures, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from helpers import default_sigint
from sweep_helpers import GPU_UUIDS, fake_gpu_env

from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RENDEZVOUS,
    EXIT_TERMINATED,
    EXIT_USAGE,
)

# Each rank writes what it was told to <out>/rank-<RANK>.json, then follows orders.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    seen = {k: v for k, v in os.environ.items() if not k.startswith(("PATH", "PYTHON"))}
    seen["argv"] = sys.argv[2:]
    seen["pid"] = os.getpid()
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    print(f"hello from rank {rank}", flush=True)
    order = os.environ.get("ORDER", "")
    if order == f"kill{rank}":
        print("about to die", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if order == f"exit{rank}":
        print("giving up with 3", file=sys.stderr, flush=True)
        sys.exit(3)
    if order.startswith(("kill", "exit", "wait")):
        time.sleep(120)
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK_SCRIPT)
    (tmp_path / "out").mkdir()
    return path


def launch_cli(
    args: list[str], cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "launch", *args],
        cwd=cwd,
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def seen(tmp_path: Path, rank: int) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "out" / f"rank-{rank}.json").read_text())
    return data


def record(log_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((log_dir / "launch.json").read_text())
    return data


def test_each_rank_is_told_who_it_is(script: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = launch_cli(
        [
            "--nproc",
            "2",
            "--log-dir",
            str(logs),
            str(script),
            str(tmp_path / "out"),
            "--nproc",
            "x",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    ranks = [seen(tmp_path, r) for r in (0, 1)]
    for r, env in enumerate(ranks):
        assert env["RANK"] == env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU here: none shown
        assert env["argv"] == ["--nproc", "x"]  # what follows the script is the script's
        tf = json.loads(str(env["TF_CONFIG"]))
        assert tf["task"] == {"type": "worker", "index": r}
        assert len(tf["cluster"]["worker"]) == 2
    assert ranks[0]["MASTER_PORT"] == ranks[1]["MASTER_PORT"]
    # Output: a log per rank, and a prefix per rank on the console.
    for r in (0, 1):
        assert f"hello from rank {r}" in (logs / f"rank-{r}.log").read_text()
        assert f"[rank {r}] hello from rank {r}" in done.stdout
    attempts = record(logs)["attempts"]
    assert isinstance(attempts, list)
    assert len(attempts) == 1
    assert [r["returncode"] for r in attempts[0]] == [0, 0]
    assert "2 rank(s) finished" in done.stderr


def test_a_killed_rank_stops_the_others_and_is_named(script: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    env = {**os.environ, "ORDER": "kill1"}
    done = launch_cli(
        ["--nproc", "2", "--log-dir", str(logs), str(script), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == EXIT_FAILED
    assert "Rank 1" in done.stderr
    assert "killed by SIGKILL" in done.stderr
    assert "about to die" in done.stderr  # the tail of its log
    assert str(logs / "rank-1.log") in done.stderr
    ranks = record(logs)["attempts"][0]  # type: ignore[index]
    assert ranks[1]["returncode"] == -signal.SIGKILL
    assert ranks[0]["returncode"] == -signal.SIGTERM  # it was sleeping: the launcher stopped it


def test_a_rank_exit_code_is_reported(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ORDER": "exit0"}
    done = launch_cli(["--nproc", "2", str(script), str(tmp_path / "out")], cwd=tmp_path, env=env)
    assert done.returncode == EXIT_FAILED
    assert "Rank 0" in done.stderr
    assert "exit code 3" in done.stderr
    assert "giving up with 3" in done.stderr


def slurm_task(procid: int, ntasks: int = 2) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SLURM_JOB_ID=str(70000 + os.getpid() % 9000),
        SLURM_STEP_ID="0",
        SLURM_PROCID=str(procid),
        SLURM_NTASKS=str(ntasks),
        SLURM_LOCALID=str(procid),
        SLURM_NODEID="0",
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_TASKS_PER_NODE=str(ntasks),
    )
    return env


def test_a_rank_that_never_starts_fails_the_preflight(script: Path, tmp_path: Path) -> None:
    # Rank 0 of a 2-task Slurm step, whose rank 1 never comes.
    done = launch_cli(
        ["--preflight-timeout", "1.5", str(script), str(tmp_path / "out")],
        cwd=tmp_path,
        env=slurm_task(0),
    )
    assert done.returncode == EXIT_RENDEZVOUS, done.stderr
    assert "did not reach the preflight rendezvous" in done.stderr
    assert "rank 1 (localhost)" in done.stderr
    assert not (tmp_path / "out" / "rank-0.json").exists()  # the program never ran


def test_slurm_tasks_meet_and_run_as_ranks(script: Path, tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "paralela", "launch", str(script), str(tmp_path / "out")],
            cwd=tmp_path,
            env=slurm_task(p),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in (0, 1)
    ]
    outputs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for r in (0, 1):
        env = seen(tmp_path, r)
        assert env["RANK"] == str(r)
        assert env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "localhost"
    job = slurm_task(0)["SLURM_JOB_ID"]
    assert (tmp_path / "paralela-runs" / f"launch-rank-{job}" / "rank-1.log").exists()


def test_gpus_one_per_rank(script: Path, tmp_path: Path) -> None:
    env = fake_gpu_env(tmp_path / "gpus")
    done = launch_cli(["--nproc", "3", str(script), str(tmp_path / "out")], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    devices = [seen(tmp_path, r)["CUDA_VISIBLE_DEVICES"] for r in range(3)]
    assert sorted(devices) == sorted(GPU_UUIDS)  # each rank exactly one, all distinct


def test_more_ranks_than_gpus_is_a_usage_error(script: Path, tmp_path: Path) -> None:
    env = fake_gpu_env(tmp_path / "gpus")
    done = launch_cli(["--nproc", "4", str(script), str(tmp_path / "out")], cwd=tmp_path, env=env)
    assert done.returncode == EXIT_USAGE
    assert "need 4 GPUs, but 3 are visible" in done.stderr
    cpu = launch_cli(
        ["--nproc", "4", "--gpus-per-rank", "0", str(script), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
    )
    assert cpu.returncode == 0, cpu.stderr
    assert {seen(tmp_path, r)["CUDA_VISIBLE_DEVICES"] for r in range(4)} == {""}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "does not exist"),
        (["no-such-command-anywhere"], "Cannot find the program"),
        (["--nproc", "0", "x.py"], "--nproc"),
    ],
)
def test_bad_programs_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = launch_cli(args, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_module_mode(tmp_path: Path) -> None:
    (tmp_path / "rankmod.py").write_text("import os\nprint('module rank', os.environ['RANK'])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = launch_cli(["--nproc", "2", "-m", "rankmod"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "[rank 1] module rank 1" in done.stdout


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def started(tmp_path: Path, ranks: int) -> bool:
    """Whether every rank wrote its whole record (a file can exist half written)."""
    try:
        return all(seen(tmp_path, r)["argv"] is not None for r in range(ranks))
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopping_the_launcher_stops_every_rank(
    script: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    env = {**os.environ, "ORDER": "wait"}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paralela",
            "launch",
            "--nproc",
            "2",
            str(script),
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        wait_for(lambda: started(tmp_path, 2), 60, "both ranks to start")
        pids = [int(str(seen(tmp_path, r)["pid"])) for r in (0, 1)]
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
        if sig != signal.SIGKILL:
            expected = EXIT_TERMINATED if sig == signal.SIGTERM else EXIT_INTERRUPTED
            assert launcher.returncode == expected, err
            assert "Every rank was stopped." in err
        wait_for(lambda: not any(alive(p) for p in pids), 15, "the ranks to exit")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()  # also closes the pipe


def test_with_tf_parameter_servers_the_chief_ending_ends_the_job(
    script: Path, tmp_path: Path
) -> None:
    # Rank 0 (the chief) exits 0; ranks 1 (ps) and 2 (worker) would serve forever.
    logs = tmp_path / "logs"
    env = {**os.environ, "ORDER": "wait-but-chief"}
    chief_exits = RANK_SCRIPT.replace(
        'if order.startswith(("kill", "exit", "wait")):',
        "while rank == 0 and len(list(out.glob('rank-*.json'))) < 3:\n"
        "    time.sleep(0.02)  # the chief ends once the others have started\n"
        'if order.startswith(("kill", "exit", "wait")) and rank != 0:',
    )
    script.write_text(chief_exits)
    done = launch_cli(
        [
            "--nproc",
            "3",
            "--tf-ps",
            "1",
            "--stop-grace",
            "1",
            "--log-dir",
            str(logs),
            str(script),
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    roles = [json.loads(str(seen(tmp_path, r)["TF_CONFIG"]))["task"]["type"] for r in range(3)]
    assert roles == ["chief", "ps", "worker"]
    codes = [r["returncode"] for r in record(logs)["attempts"][0]]  # type: ignore[index]
    assert codes == [0, -signal.SIGTERM, -signal.SIGTERM]
