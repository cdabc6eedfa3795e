"""Server process trees for ``bench_serve.py``: start one, wait until it answers, read
the CPU of each of its processes, stop it (SIGINT to the root, then SIGTERM and SIGKILL
for whatever of the tree is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _loadgen import get

HOST = "127.0.0.1"
READY = re.compile(r"paralela serve: ready on http://[\d.]+:(\d+)")
START_TIMEOUT = 180.0  # seconds; the model loads in ~3-4 s per worker on 2 cores
STOP_TIMEOUT = 15.0  # seconds after SIGINT before SIGTERM; paralela drains in-flight requests


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    cmd: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    t0: float
    port: int = 0
    startup_s: float = 0.0
    stopped: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 3000) -> str:
        return self.log_text()[-n:]

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def cpu_by_process(self) -> dict[int, tuple[str, float]]:
        """pid -> (role, CPU seconds so far) for every live process of the tree."""
        out = {}
        for i, p in enumerate(self.tree()):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[p.pid] = (_role(p, i == 0), t.user + t.system)
        return out

    def listening(self) -> list[str]:
        found = set()
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                for conn in p.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN:
                        found.add(f"{conn.laddr.ip}:{conn.laddr.port}")
        return sorted(found)

    def embedders(self) -> list[dict[str, object]]:
        """The lines the model's ``setup`` printed: pid, device, torch threads."""
        seen = []
        for line in self.log_text().splitlines():
            if line.startswith('{"embedder"'):
                with contextlib.suppress(ValueError):
                    seen.append(json.loads(line))
        return seen


def _role(p: psutil.Process, root: bool) -> str:
    cmd = " ".join(p.cmdline())
    if root:
        return "root"
    if "_serve_worker" in cmd:
        return "paralela worker"
    if "multiprocessing" in cmd and "resource_tracker" in cmd:
        return "resource tracker"
    if "multiprocessing" in cmd or "spawn_main" in cmd:
        return "mp child"
    return p.name()


def start(name: str, cmd: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path) -> Server:
    log = open(log_path, "wb")  # noqa: SIM115 (kept open by the child; closed here after Popen)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env=env, cwd=cwd, start_new_session=True,
    )  # fmt: skip
    log.close()
    return Server(name, list(cmd), proc, log_path, t0)


async def wait_ready(server: Server, port: int | None) -> None:
    """Wait for paralela's ready line (``port is None``) or a 200 from ``/health``."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServerError(f"{server.name} exited {server.proc.returncode}\n{server.tail()}")
        if port is None:
            m = READY.search(server.log_text())
            if m:
                server.port = int(m.group(1))
                server.startup_s = time.perf_counter() - server.t0
                return
        else:
            with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError, EOFError):
                status, _ = await get(HOST, port, "/health", timeout=2.0)
                if status == 200:
                    server.port = port
                    server.startup_s = time.perf_counter() - server.t0
                    return
        await asyncio.sleep(0.05)  # polling for readiness; start-up is timed to ~50 ms
    raise ServerError(f"{server.name} not ready after {START_TIMEOUT:.0f} s\n{server.tail()}")


def stop(server: Server) -> None:
    """SIGINT to the root; SIGTERM then SIGKILL to any process of the tree still alive."""
    procs = server.tree()
    how = "SIGINT"
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.proc.pid, signal.SIGINT)
    _gone, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT)
    for sig, label in ((signal.SIGTERM, "SIGTERM"), (signal.SIGKILL, "SIGKILL")):
        if not alive:
            break
        how += f", {label} for {len(alive)}"
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _gone, alive = psutil.wait_procs(alive, timeout=5.0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=5.0)
    server.stopped = ("yes" if how == "SIGINT" else "no") + f" ({how})"
