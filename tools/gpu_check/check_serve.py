"""Check: ``paralela serve`` of a MiniLM-sized embedder on CUDA under 64 clients.

Proves: the worker holds the model on the GPU (``setup`` got ``cuda:0``, the worker saw
exactly the GPU's UUID), every answer under 64 concurrent clients, batched or not, is the
embedding that the same server on the CPU (``--gpus none``) gives the sentence sent
alone, and dynamic batching pays: requests/s against ``--max-batch 1`` and against the
CPU.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import embedder
from common import HERE, Mode, Outcome, gpu_uuid

CLIENTS = 64  # 16 in the dry run
TOLERANCE = 1e-3  # an embedding's numbers, GPU float32 kernels against the CPU's
MIN_BATCHING_GAIN = 1.5  # batched requests/s over --max-batch 1, on the GPU
MIN_GPU_GAIN = 1.0  # GPU requests/s over the CPU's, batched


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    uuid = gpu_uuid(mode)
    clients = mode.size(CLIENTS, 16)
    texts = embedder.sentences(mode.size(256, 16))
    per_client = mode.size(24, 2)
    configs = {  # the CPU first: its answers to each sentence sent alone are the reference
        "CPU, batched": ["--max-batch", "64", "--gpus", "none"],
        "GPU, batched": ["--max-batch", "64"],
        "GPU, --max-batch 1": ["--max-batch", "1"],
    }
    expected: list[list[float]] = []
    rates = {}
    for label, options in configs.items():
        load = (clients, per_client)
        answers, rate, alone = _serve_and_load(mode, options, texts, load, not expected)
        expected = expected or [out["embedding"] for out in alone]
        rates[label] = rate
        outcome.figures[f"{label}: requests/s"] = round(rate, 1)
        wrong = [i for i, (text_index, out) in enumerate(answers)
                 if _diff(out["embedding"], expected[text_index]) > TOLERANCE]  # fmt: skip
        outcome.expect(not wrong, f"{label}: {len(wrong)} of {len(answers)} answers are wrong")
        outcome.expect(len(answers) == clients * per_client, f"{label}: answers missing")
        devices = {(out["device"], out["visible"]) for _, out in answers}
        want = {("cpu", "")} if "CPU" in label else {("cuda:0", uuid)}
        outcome.expect(devices == want, f"{label}: served from {devices}, expected {want}")
    batching = rates["GPU, batched"] / rates["GPU, --max-batch 1"]
    on_gpu = rates["GPU, batched"] / rates["CPU, batched"]
    outcome.figures["batched / --max-batch 1"] = f"{batching:.2f}x"
    outcome.figures["GPU / CPU"] = f"{on_gpu:.2f}x"
    if not mode.dry:
        outcome.expect(batching >= MIN_BATCHING_GAIN, f"batching gains {batching:.2f}x only")
        outcome.expect(on_gpu >= MIN_GPU_GAIN, f"the GPU serves {on_gpu:.2f}x the CPU's rate")
    return outcome


def _diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


Answers = list[tuple[int, dict[str, Any]]]


def _serve_and_load(
    mode: Mode, options: list[str], texts: list[str], requests: tuple[int, int], alone: bool
) -> tuple[Answers, float, list[dict[str, Any]]]:
    """Start a server, (if ``alone``) send each text alone, then load it with
    ``requests``: (clients, requests each)."""
    argv = [sys.executable, "-m", "paralela", "serve", f"{HERE / 'embedder.py'}:Embedder",
            "--port", "0", "--max-queue", "4096", *options]  # fmt: skip
    print(f"$ {' '.join(argv)}", flush=True)
    server = subprocess.Popen(argv, env=mode.env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stderr or ()), daemon=True)
    reader.start()
    try:
        url = _wait_ready(server, lines, deadline=time.monotonic() + 120)
        return asyncio.run(_load(url, texts, *requests, alone))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        reader.join(timeout=5)
        print("".join(lines)[-3000:], f"(server exit {server.returncode})", sep="\n", flush=True)


def _wait_ready(server: subprocess.Popen[str], lines: list[str], deadline: float) -> str:
    while time.monotonic() < deadline:
        for line in list(lines):
            found = re.search(r"ready on (http://\S+)", line)
            if found:
                return found.group(1)
        if server.poll() is not None:
            raise RuntimeError(f"paralela serve exited {server.returncode}: {''.join(lines)}")
        time.sleep(0.05)
    raise RuntimeError(f"paralela serve not ready within 120 s: {''.join(lines)}")


async def _load(
    url: str, texts: list[str], clients: int, per_client: int, alone: bool
) -> tuple[Answers, float, list[dict[str, Any]]]:
    """Each text alone (one request at a time: batches of one), if asked; then
    ``clients`` clients, each sending ``per_client`` requests one after the other."""
    import httpx

    answers: Answers = []
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one_client(c: int) -> None:
            for r in range(per_client):
                index = (c * per_client + r) % len(texts)
                reply = await client.post("/predict", json={"input": texts[index]})
                reply.raise_for_status()
                answers.append((index, reply.json()["output"]))

        singles = []
        for text in texts if alone else texts[:1]:  # one at least: CUDA starts on the first
            reply = await client.post("/predict", json={"input": text})
            reply.raise_for_status()
            singles.append(reply.json()["output"])
        started = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in range(clients)))
        seconds = time.perf_counter() - started
    return answers, len(answers) / seconds, singles
