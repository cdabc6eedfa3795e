"""Model classes for the ``serve`` tests, and a real ``paralela serve`` process to test.

The models are configured by environment variables, which the server's workers inherit:

- ``SERVE_SETUP_S``: seconds ``setup`` sleeps (a model that loads slowly);
- ``SERVE_PREDICT_S``: seconds each ``predict`` call sleeps (a slow model: batches form);
- ``SERVE_SETUP_HOLD``: a file path; ``setup`` waits while that file exists (a test holds
  a restarting worker in its setup for as long as it needs, without timing anything).

An input of :class:`Echo` may ask for trouble: ``{"fail": true}`` raises in ``predict``,
``{"nan": true}`` returns NaN, ``{"sleep": S}`` sleeps S seconds in its batch.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

TESTS = Path(__file__).parent


class Echo:
    """Answers each input with itself and where it ran: the worker's pid, the batch's size,
    its thread limit and the GPUs it sees."""

    def setup(self, device: str) -> None:
        self.device = device
        time.sleep(float(os.environ.get("SERVE_SETUP_S", "0")))
        hold = os.environ.get("SERVE_SETUP_HOLD")
        deadline = time.monotonic() + 120
        while hold and os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.02)

    def predict(self, batch: list[Any]) -> list[Any]:
        time.sleep(float(os.environ.get("SERVE_PREDICT_S", "0")))
        for item in batch:
            if isinstance(item, dict) and item.get("sleep"):
                time.sleep(float(item["sleep"]))
            if isinstance(item, dict) and item.get("fail"):
                raise ValueError(f"cannot predict {item}")
        return [
            {
                "x": float("nan") if isinstance(item, dict) and item.get("nan") else item,
                "pid": os.getpid(),
                "batch": len(batch),
                "device": self.device,
                "threads": os.environ.get("OMP_NUM_THREADS"),
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
            for item in batch
        ]


class BrokenSetup:
    def setup(self, device: str) -> None:
        raise FileNotFoundError("no weights at /nowhere/model.pt")

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class Point(pydantic.BaseModel):
    x: float
    y: float


class Total(pydantic.BaseModel):
    total: float


class Adder:
    """Typed: inputs are validated as :class:`Point`, outputs as :class:`Total`."""

    input_model = Point
    output_model = Total

    def predict(self, batch: list[Point]) -> list[Total]:
        return [Total(total=p.x + p.y) for p in batch]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running ``paralela serve``: its URL, process and stderr so far."""

    url: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def workers(self) -> list[int]:
        """The pids of the model workers (the server's child processes)."""
        import psutil

        return [c.pid for c in psutil.Process(self.process.pid).children()]

    def stop(self, sig: int | None = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` (None: none), wait for the exit; its status."""
        if sig is not None and self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            if self.reader is not None:
                self.reader.join(10)
            if self.process.stderr is not None:
                self.process.stderr.close()


#: ``python -c`` code that sets this process's file descriptor limit (soft and hard: it
#: cannot be raised again) to its first argument, then runs ``python -m paralela`` with
#: the rest: a server that runs out of descriptors after a few hundred connections.
_WITH_NOFILE = (
    "import resource, runpy, sys; n = int(sys.argv.pop(1)); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
    "runpy.run_module('paralela', run_name='__main__', alter_sys=True)"
)


def start(
    spec: str,
    *args: str,
    env: dict[str, str] | None = None,
    port: int = 0,
    nofile: int | None = None,
) -> Server:
    """Start ``paralela serve SPEC ARGS`` from the tests directory; returns at once.
    ``nofile``: the server's limit of open file descriptors."""
    python = [sys.executable, "-m", "paralela"]
    if nofile is not None:
        python = [sys.executable, "-c", _WITH_NOFILE, str(nofile)]
    process = subprocess.Popen(
        [*python, "serve", spec, "--port", str(port), *args],
        cwd=TESTS,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(f"http://127.0.0.1:{port}", process)

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            server.lines.append(line)

    server.reader = threading.Thread(target=read, daemon=True)
    server.reader.start()
    return server


def wait_ready(server: Server, timeout: float = 60) -> Server:
    """Wait for the ready line; the server's URL is the one it names."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"ready on (http://\S+)", server.stderr)
        if match:
            server.url = match.group(1)
            return server
        if server.process.poll() is not None:
            time.sleep(0.2)  # let the reader catch the last lines
            raise AssertionError(f"the server exited {server.process.returncode}:\n{server.stderr}")
        time.sleep(0.05)
    raise AssertionError(f"the server was not ready in {timeout} s:\n{server.stderr}")


@contextlib.contextmanager
def serving(spec: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A ready server for the block; stopped (SIGTERM) after it."""
    server = start(spec, *args, env=env)
    try:
        yield wait_ready(server)
    finally:
        server.stop()


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample (or a histogram's ``_sum``/``_count``) in a
    Prometheus page."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics:\n{text}"
    return float(match.group(1))
