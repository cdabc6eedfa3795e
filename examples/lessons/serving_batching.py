"""Lesson 11: serving with dynamic batching, and the prediction swarm.

A model behind HTTP gets one input per request, but a forward pass of 32 inputs costs
far less than 32 passes of one: the weights are read once, the matrix products are
larger. ``paralela serve`` queues the inputs of all requests and gives a free worker
what is waiting, up to ``--max-batch``: with one client, batches of one and no added
latency; with many, batches grow with the load. For data already on disk there is no
need for HTTP at all: ``paralela predict`` streams the records through workers that
each load the model once (the prediction swarm).

This script serves ``WideMLP`` below (a seeded, untrained torch MLP on 8x8 digit
images, 64 -> 1024 -> 1024 -> 1024 -> 10; its answers do not matter here, its cost
does) with ``paralela serve`` on 127.0.0.1 (a free port, one model worker), twice:
``--max-batch 1`` (no batching) and the default ``--max-batch 32``. For each, client
threads send ``POST /predict`` with one image each, at a few concurrencies, for a fixed
time; it prints requests per second, the median latency and the mean batch the server
made (from ``/metrics``). Then offline, from a JSON-lines file of scikit-learn's 1,797
digits images repeated 10 times to a file of outputs: a serial loop one image per call,
one in batches of 64, and ``paralela.predict`` (2 workers, batches of 64), whose
outputs it checks against the serial loop's. Run::

    python examples/lessons/serving_batching.py [--quick]

``--quick`` (CI) sends for a shorter time, at fewer concurrencies, and predicts two
copies of the images.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


class WideMLP:
    """A model class for ``paralela serve`` and ``paralela predict``: 64 pixels -> 10 scores."""

    def setup(self, device: str) -> None:
        """Build the seeded MLP on ``device`` (once per worker)."""
        import torch

        # One thread: on a shared 2-core machine, torch's threads waiting for each other at
        # every layer cost far more than they give (docs/serve.md, "Workers and devices").
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.torch = torch
        self.device = device
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        ).to(device)
        self.model.eval()

    def predict(self, batch: list[Any]) -> list[int]:
        """The predicted class of each image (a list of 64 numbers from 0 to 16)."""
        x = self.torch.tensor(np.asarray(batch, dtype=np.float32) / 16.0, device=self.device)
        with self.torch.no_grad():
            return self.model(x).argmax(dim=1).tolist()  # type: ignore[no-any-return]


def start_server(max_batch: int) -> tuple[subprocess.Popen[str], int]:
    """``paralela serve lesson:WideMLP`` on a free loopback port; the process and port."""
    command = [
        sys.executable, "-m", "paralela", "serve", f"{Path(__file__).resolve()}:WideMLP",
        "--port", "0", "--workers", "1", "--max-batch", str(max_batch),
    ]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        lines.append(line)
        if found := re.search(r"ready on http://127\.0\.0\.1:(\d+)", line):
            # keep draining stderr so that the server never blocks on a full pipe
            threading.Thread(target=server.stderr.read, daemon=True).start()
            return server, int(found.group(1))
        if not line and server.poll() is not None:
            break
    server.kill()
    raise SystemExit("paralela serve did not start:\n" + "".join(lines))


def stop_server(server: subprocess.Popen[str]) -> None:
    """SIGTERM: the server answers what is in flight, stops its workers and exits 0."""
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def batch_sizes(port: int) -> tuple[float, float]:
    """(sum, count) of the server's ``paralela_serve_batch_size`` histogram."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    total = float(re.search(r"^paralela_serve_batch_size_sum (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
    count = float(re.search(r"^paralela_serve_batch_size_count (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
    return total, count


def load(port: int, images: np.ndarray, clients: int, seconds: float) -> tuple[float, float]:
    """``clients`` threads, each a keep-alive connection sending one image per request
    for ``seconds``; (requests per second, median latency in ms)."""
    bodies = [json.dumps({"input": image.tolist()}).encode() for image in images[:256]]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/json"}
        start.wait()
        n = i
        while not stop.is_set():
            t0 = time.perf_counter()
            conn.request("POST", "/predict", bodies[n % len(bodies)], headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                errors.append(f"{response.status} {body[:200]!r}")
                break
            latencies[i].append(time.perf_counter() - t0)
            n += clients
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)  # the measurement window itself
    stop.set()
    for t in threads:
        t.join(timeout=120)
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"the server answered {errors[0]}")
    done = [x for per_client in latencies for x in per_client]
    return len(done) / wall, statistics.median(done) * 1e3


def serve_rows(
    images: np.ndarray, concurrencies: list[int], seconds: float
) -> list[tuple[Any, ...]]:
    """Requests/s, median latency and mean batch for each max-batch and concurrency."""
    rows = []
    for max_batch in (1, 32):
        server, port = start_server(max_batch)
        try:
            load(port, images, 2, min(seconds, 1.0))  # warm-up: connections, torch's first calls
            for clients in concurrencies:
                before = batch_sizes(port)
                rate, median_ms = load(port, images, clients, seconds)
                after = batch_sizes(port)
                mean_batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
                rows.append((max_batch, clients, rate, median_ms, mean_batch))
        finally:
            stop_server(server)
    return rows


def serial_job(model: WideMLP, source: Path, target: Path, batch_size: int) -> None:
    """What ``paralela predict`` does, in one loop: read JSON lines, predict in batches,
    write one JSON line per output."""
    with source.open() as lines, target.open("w") as out:
        batch: list[Any] = []
        for line in lines:
            batch.append(json.loads(line))
            if len(batch) == batch_size:
                out.writelines(json.dumps({"output": y}) + "\n" for y in model.predict(batch))
                batch = []
        if batch:
            out.writelines(json.dumps({"output": y}) + "\n" for y in model.predict(batch))


def predict_rows(images: np.ndarray, copies: int) -> list[tuple[str, float]]:
    """Images per second from a JSON-lines file of ``copies`` times the images, to one of
    outputs: serial loops (one image per call, batches of 64), then ``paralela.predict``."""
    import paralela

    model = WideMLP()
    model.setup("cpu")
    n = len(images) * copies
    with tempfile.TemporaryDirectory(prefix="lesson-predict-") as tmp:
        source = Path(tmp) / "images.jsonl"
        with source.open("w") as f:
            for _ in range(copies):
                f.writelines(json.dumps(image.astype(int).tolist()) + "\n" for image in images)
        rates = []
        for batch_size in (1, 64):
            start = time.perf_counter()
            serial_job(model, source, Path(tmp) / f"serial-{batch_size}.jsonl", batch_size)
            rates.append(n / (time.perf_counter() - start))
        start = time.perf_counter()
        result = paralela.predict(
            WideMLP, str(source), output=Path(tmp) / "out", batch_size=64, workers=2,
            keep_input=False, progress=False,
        )  # fmt: skip
        rates.append(n / (time.perf_counter() - start))
        outputs = [
            json.loads(line)["output"]
            for part in sorted(result.output.glob("part-*.jsonl"))
            for line in part.read_text().splitlines()
        ]
        serial = [
            json.loads(line)["output"]
            for line in (Path(tmp) / "serial-64.jsonl").read_text().splitlines()
        ]
    if outputs != serial:
        raise SystemExit("paralela.predict's outputs differ from the serial loop's")
    return [
        ("serial loop, one image per predict call", rates[0]),
        ("serial loop, batches of 64", rates[1]),
        (
            f"paralela predict, 2 workers, batches of 64 ({result.shards} shards; "
            "the workers' start-up included)",
            rates[2],
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter, fewer concurrencies (CI)")
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    images = load_digits().data
    concurrencies, seconds = ([1, 16], 1.0) if args.quick else ([1, 4, 16, 32], 3.0)
    copies = 2 if args.quick else 10

    rows = serve_rows(images, concurrencies, seconds)
    print(f"paralela serve, 1 model worker, {seconds:.0f} s per row, one image per request")
    print("| --max-batch | clients | requests/s | median latency ms | mean batch |")
    print("|---|---|---|---|---|")
    for max_batch, clients, rate, median_ms, mean_batch in rows:
        print(f"| {max_batch} | {clients} | {rate:,.0f} | {median_ms:.1f} | {mean_batch:.1f} |")

    swarm = predict_rows(images, copies)
    print(
        f"\nOffline: {len(images) * copies:,} images (the digits, {copies} times) from a "
        "JSON-lines file to one of outputs, one torch thread per process"
    )
    print("| how | images/s |")
    print("|---|---|")
    for how, rate in swarm:
        print(f"| {how} | {rate:,.0f} |")

    top = max(concurrencies)
    one = next(r for r in rows if r[0] == 1 and r[1] == top)
    many = next(r for r in rows if r[0] == 32 and r[1] == top)
    print(
        f"\nRESULT: {top} clients: {one[2]:,.0f} requests/s with --max-batch 1, "
        f"{many[2]:,.0f} with --max-batch 32 ({many[2] / one[2]:.1f}x, mean batch "
        f"{many[4]:.1f}); paralela.predict {swarm[2][1]:,.0f} images/s offline"
    )
    print(
        "Conclusion: under load, batching serves more requests with the same worker; "
        "with one client it changes nothing, and offline data needs no HTTP at all."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
