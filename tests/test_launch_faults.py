"""``paralela launch`` when things go wrong around the ranks: a rank that leaves or stalls
before the process group is complete, a launcher that is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from paralela.cli._errors import EXIT_RENDEZVOUS

# Rank 0 joins torch's process group; rank 1 does what ORDER says first.
JOINER = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    import torch.distributed as dist

    order = os.environ["ORDER"]
    if order == "plain":  # never joins a group: the ranks may end in any order
        time.sleep(1.0 if os.environ["RANK"] == "0" else 0.0)
        sys.exit(0)
    if os.environ["RANK"] == "1":
        if order == "exit":
            sys.exit(0)
        if order == "stall":
            time.sleep(300)
    dist.init_process_group("gloo")
    dist.barrier()
    listening = {
        c.laddr.ip for c in psutil.Process().net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }
    print("joined, listening on", json.dumps(sorted(listening)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _launch(tmp_path: Path, order: str, *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "joiner.py"
    script.write_text(JOINER)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "paralela",
            "launch",
            "--nproc",
            "2",
            *extra,
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        cwd=tmp_path,
        env={**os.environ, "ORDER": order},
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_ranks_that_all_join_the_group_succeed_listening_on_loopback_only(
    tmp_path: Path,
) -> None:
    done = _launch(tmp_path, "join", "--rendezvous-timeout", "30")
    assert done.returncode == 0, done.stderr
    # torch's store (rank 0) and gloo's pairs (every rank): nothing on other interfaces.
    assert done.stdout.count('joined, listening on ["127.0.0.1"]') == 2, done.stdout


def test_a_rank_exiting_0_before_the_group_is_complete_stops_the_launch(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    done = _launch(tmp_path, "exit", "--rendezvous-timeout", "60")
    assert done.returncode == EXIT_RENDEZVOUS, done.stderr
    assert time.monotonic() - started < 40  # not the timeout: the exit is seen at once
    assert "Rank 1 (pid" in done.stderr
    assert "exited with code 0 before joining" in done.stderr
    assert str(tmp_path / "logs" / "rank-1.log") in done.stderr


def test_ranks_that_never_call_init_process_group_may_end_in_any_order(
    tmp_path: Path,
) -> None:
    done = _launch(tmp_path, "plain", "--rendezvous-timeout", "0.5")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("flag", ["--rendezvous-timeout", "--preflight-timeout"])
def test_a_rank_stalling_before_the_group_is_complete_stops_the_launch(
    tmp_path: Path, flag: str
) -> None:
    started = time.monotonic()
    done = _launch(tmp_path, "stall", flag, "3")
    assert done.returncode == EXIT_RENDEZVOUS, done.stderr
    assert time.monotonic() - started < 60
    assert "rank 1 (pid" in done.stderr
    assert "did not complete within 3 s" in done.stderr


# Rank 0 tries the store's port before it imports torch, then both ranks join as usual.
EARLY = textwrap.dedent(
    """
    import os, socket
    if os.environ["RANK"] == "0":
        port = int(os.environ["MASTER_PORT"])
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        print("the store's port takes connections before torch is imported", flush=True)
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    """
)


def test_rank_0_listens_on_the_stores_port_from_its_first_line(tmp_path: Path) -> None:
    # A rank that reaches init_process_group first then connects at once instead of
    # backing off while rank 0 imports torch (bench/bench_launch.py's start-up).
    script = tmp_path / "early.py"
    script.write_text(EARLY)
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", "2", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert "[rank 0] the store's port takes connections before torch" in done.stdout, (
        done.stdout + done.stderr
    )


# Each rank starts a long `sleep` (its own child) and reports both pids, then waits.
SPAWNER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path

    child = subprocess.Popen(["sleep", "300"])
    out = Path(sys.argv[1]) / f"pids-{os.environ['RANK']}"
    out.with_suffix(".tmp").write_text(f"{os.getpid()} {child.pid}")
    out.with_suffix(".tmp").rename(out)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def test_sigkilled_launcher_takes_ranks_and_their_children_along(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paralela",
            "launch",
            "--nproc",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
            str(tmp_path),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        files = [tmp_path / f"pids-{rank}" for rank in range(2)]
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in files):
            assert launcher.poll() is None, "the launch ended before its ranks started"
            assert time.monotonic() < deadline, "the ranks did not start within 60 s"
            time.sleep(0.05)
        pids = [int(p) for f in files for p in f.read_text().split()]
        assert all(_alive(pid) for pid in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        gone_by = time.monotonic() + 5.0
        while any(_alive(pid) for pid in pids) and time.monotonic() < gone_by:
            time.sleep(0.05)
        left = [pid for pid in pids if _alive(pid)]
        assert not left, f"still running 5 s after the launcher was SIGKILLed: {left}"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.kill()
        launcher.wait()


def test_the_users_own_sitecustomize_still_runs_in_the_ranks(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['MARK'], os.environ.get('RANK', 'x')).touch()\n"
    )
    (tmp_path / "marks").mkdir()
    script = tmp_path / "plain.py"
    script.write_text("print('ran')\n")
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", "2",
         "--log-dir", str(tmp_path / "logs"), str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site), "MARK": str(tmp_path / "marks")},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranks = sorted(p.name for p in (tmp_path / "marks").iterdir() if p.name != "x")
    assert ranks == ["0", "1"]  # ("x": the launcher, which has no RANK)


def test_a_bad_rendezvous_timeout_in_the_environment_is_a_usage_error(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('ran')\n")
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--log-dir", str(tmp_path / "logs"),
         str(script)],
        cwd=tmp_path,
        env={**os.environ, "PARALELA_RENDEZVOUS_TIMEOUT": "soon"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "PARALELA_RENDEZVOUS_TIMEOUT must be a positive number of seconds, got 'soon'" in (
        done.stderr
    )
