"""Start real torch.distributed ranks for the strategy tests, without the launcher.

The launcher has its own tests (tests/test_launch*.py); the strategy tests only need
N plain processes that find each other through the usual environment variables.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables torch.distributed reads, for one rank on this machine."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        TP_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


def spawn_ranks(
    script: Path,
    world_size: int,
    args: Sequence[str] = (),
    *,
    timeout: float = 90.0,
    extra_env: Mapping[str, str] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python script args`` as ``world_size`` ranks; fail the test if any fails.

    Returns each rank's completed process (stdout and stderr captured as text), in
    rank order.
    """
    port = free_port()
    envs = [{**rank_env(rank, world_size, port), **(extra_env or {})} for rank in range(world_size)]
    return run_all(script, envs, args, timeout=timeout)


def run_all(
    script: Path,
    envs: Sequence[Mapping[str, str]],
    args: Sequence[str] = (),
    *,
    timeout: float = 90.0,
    what: str = "rank",
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python script args`` once per environment, all at once; fail the test if
    any process fails or is still running after ``timeout`` (it is then SIGKILLed).

    Returns each process's result (stdout and stderr as text), in the order of ``envs``.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [(r, res) for r, res in enumerate(results) if res.returncode != 0]
    if failed:
        index, res = failed[0]
        pytest.fail(
            f"{what} {index} exited with {res.returncode}:\n{res.stdout}\n{res.stderr[-4000:]}"
        )
    return results
