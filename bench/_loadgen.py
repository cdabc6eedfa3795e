"""A closed-loop HTTP/1.1 load generator on raw asyncio streams, for ``bench_serve.py``.

``c`` connections, each kept alive: a connection sends its next request only once the
whole previous response has arrived. Each request body is ``{"input": <sentence>}`` for
one of the given sentences, in turn (connection k starts at sentence k). Per level::

    warm-up (warmup_s) | measured window (window_s) | drain (up to drain_s) -> cancel

A response counts when it completes inside the window; its latency runs from the first
byte sent to the last byte received. Sending stops at the end of the window or after
``max_requests``; whatever is still in flight ``drain_s`` later is cancelled. The
responses' bodies are kept (bytes) and checked after the level by the caller, so that
checking costs no CPU during the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Sample:
    """One request that completed inside the window."""

    index: int  # which sentence
    latency_s: float
    status: int
    body: bytes


@dataclass
class Level:
    concurrency: int
    window_s: float
    samples: list[Sample] = field(default_factory=list)
    sent: int = 0  # requests sent in warm-up and window together
    errors: list[str] = field(default_factory=list)  # connection errors, with their count
    unfinished: int = 0  # cancelled after the drain
    cpu: dict[str, float] = field(default_factory=dict)  # filled by the caller's hooks


class HttpError(RuntimeError):
    pass


def request_bytes(host: str, port: int, path: str, text: str) -> bytes:
    body = json.dumps({"input": text}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response: (status, body). Content-Length or chunked bodies."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are expected
                return status, b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    raise HttpError(f"response without Content-Length or chunked body: {lines[0]}")


async def get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on a fresh connection (health checks, /metrics)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()


async def run_level(
    host: str,
    port: int,
    texts: Sequence[str],
    concurrency: int,
    *,
    warmup_s: float,
    window_s: float,
    drain_s: float = 10.0,
    max_requests: int = 400_000,
    path: str = "/predict",
    on_window_start: Callable[[], Awaitable[None]] | None = None,
    on_window_end: Callable[[], Awaitable[None]] | None = None,
) -> Level:
    """One load level: ``concurrency`` keep-alive connections, closed loop (module doc)."""
    payloads = [request_bytes(host, port, path, t) for t in texts]
    level = Level(concurrency, window_s)
    errors: dict[str, int] = {}
    state = {"stop": False, "sent": 0}
    bounds = [0.0, 0.0]  # window start, end (perf_counter)

    async def connection(k: int) -> None:
        i = k % len(payloads)
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        try:
            while not state["stop"] and state["sent"] < max_requests:
                state["sent"] += 1
                t0 = time.perf_counter()
                writer.write(payloads[i])
                status, body = await read_response(reader)
                t1 = time.perf_counter()
                if bounds[0] and bounds[0] <= t1 and (not bounds[1] or t1 <= bounds[1]):
                    level.samples.append(Sample(i, t1 - t0, status, body))
                i = (i + concurrency) % len(payloads)
        except (OSError, asyncio.IncompleteReadError, HttpError, ValueError) as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
        finally:
            writer.close()

    tasks = [asyncio.ensure_future(connection(k)) for k in range(concurrency)]
    await asyncio.sleep(warmup_s)
    if on_window_start is not None:
        await on_window_start()
    bounds[0] = time.perf_counter()
    await asyncio.sleep(window_s)
    bounds[1] = time.perf_counter()
    state["stop"] = True
    level.window_s = bounds[1] - bounds[0]
    if on_window_end is not None:
        await on_window_end()
    _done, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:
        task.cancel()
    level.unfinished = len(pending)
    await asyncio.gather(*tasks, return_exceptions=True)
    level.sent = state["sent"]
    level.errors = [f"{name} x{n}" for name, n in sorted(errors.items())]
    return level


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]
