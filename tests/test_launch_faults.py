"""``paralela launch`` when things go wrong around the ranks: a launcher that is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

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
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
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
        for pid in pids if "pids" in locals() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.kill()
        launcher.wait()
