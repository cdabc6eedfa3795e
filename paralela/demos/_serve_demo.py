"""The serve step of ``paralela demo``: the digits MLP behind ``paralela serve``, queried
by concurrent clients, then stopped.

::

    paralela serve paralela.demos._digits_model:DigitsClassifier --port 0   (a child process)
      ready line on stderr ──> its URL
    CLIENTS clients, each sending its next image when its last is answered ──> req/s, p50, p99
      every answer == the model's own answer for that image alone (in this process)
    /metrics ──> the mean batch the server made of the concurrent requests
    SIGTERM ──> the server drains and exits 0
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ServeDemoResult", "run_serve_demo"]

MODEL = "paralela.demos._digits_model:DigitsClassifier"
READY_SECONDS = 120  # the server's start: a fresh interpreter importing torch, on a busy CI


@dataclass(frozen=True)
class ServeDemoResult:
    """What the serve step measured (the start is from the command to the ready line)."""

    url: str
    requests: int
    clients: int
    start_seconds: float
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    agree: int
    exit_code: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def run_serve_demo(
    requests: int = 300, clients: int = 16, run_dir: Path | None = None
) -> ServeDemoResult:
    """Serve the digits MLP, send ``requests`` images from ``clients`` clients, stop it.

    ``run_dir`` (default a fresh temporary directory) holds the checkpoint (trained
    there in about 1 s when missing; the predict step leaves one).

    Raises:
        MissingExtraError: FastAPI, uvicorn, httpx, torch or scikit-learn is missing.
        RuntimeError: the server did not start (its stderr is in the message).
    """
    from paralela.demos._digits_model import CHECKPOINT_ENV, DigitsClassifier, digits_set
    from paralela.errors import MissingExtraError

    for module, extra in (("fastapi", "serve"), ("uvicorn", "serve"), ("httpx", "serve")):
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError(module, extra, "The serve step of paralela demo") from None
    directory = run_dir or Path(tempfile.mkdtemp(prefix="paralela-demo-serve-"))
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = directory / "digits-mlp.pt"
    env = {**os.environ, CHECKPOINT_ENV: str(checkpoint)}
    pixels, _labels = digits_set()
    images = [pixels[i % len(pixels)] for i in range(requests)]
    previous = os.environ.get(CHECKPOINT_ENV)
    os.environ[CHECKPOINT_ENV] = str(checkpoint)
    try:
        model = DigitsClassifier()
        model.setup("cpu")  # trains and saves the checkpoint if there is none
    finally:
        if previous is None:
            os.environ.pop(CHECKPOINT_ENV, None)
        else:
            os.environ[CHECKPOINT_ENV] = previous
    expected = [model.predict([image])[0] for image in images]

    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "paralela", "serve", MODEL, "--port", "0", "--workers", "1"],
        env=env,
        cwd=directory,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_read, args=(process, lines), daemon=True)
    reader.start()
    try:
        url = _wait_ready(process, lines)
        start_seconds = time.perf_counter() - started
        answers, latencies, seconds = asyncio.run(_query(url, images, clients))
        page = _get(url + "/metrics")
        exit_code = _stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
        if process.stderr is not None:
            process.stderr.close()
    from paralela.demos._predict_demo import _same

    latencies.sort()
    return ServeDemoResult(
        url=url,
        requests=requests,
        clients=clients,
        start_seconds=start_seconds,
        seconds=seconds,
        p50_ms=latencies[len(latencies) // 2] * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        mean_batch=_metric(page, "sum") / max(1.0, _metric(page, "count")),
        agree=sum(_same(a, b) for a, b in zip(answers, expected, strict=True)),
        exit_code=exit_code,
    )


def _read(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)


def _wait_ready(process: subprocess.Popen[str], lines: list[str]) -> str:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        match = re.search(r"ready on (http://\S+)", "".join(lines))
        if match:
            return match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    time.sleep(0.2)
    raise RuntimeError("paralela serve did not start:\n" + "".join(lines)[-2000:])


async def _query(
    url: str, images: list[list[float]], clients: int
) -> tuple[list[dict[str, Any]], list[float], float]:
    import httpx

    answers: list[Any] = [None] * len(images)
    latencies: list[float] = []

    async def client(k: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(k, len(images), clients):
                sent = time.perf_counter()
                response = await http.post(f"{url}/predict", json={"input": images[i]})
                latencies.append(time.perf_counter() - sent)
                response.raise_for_status()
                answers[i] = response.json()["output"]

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return answers, latencies, time.perf_counter() - started


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=30).text


def _metric(page: str, part: str) -> float:
    match = re.search(rf"^paralela_serve_batch_size_{part} (\S+)$", page, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
