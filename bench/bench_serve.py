"""``paralela serve`` against plain FastAPI + uvicorn and LitServe, serving a real
sentence-embedding model (all-MiniLM-L6-v2, CPU) on 127.0.0.1, in one run.

Targets (reported, not asserted): paralela with dynamic batching at least 3x the
throughput of ``--max-batch 1`` at an equal or better p99 and ahead of LitServe and plain
FastAPI at every concurrency >= 8; at c=1 no slower than ``--max-batch 1`` and ahead of
every LitServe row (issue 27).

    .venv-bench/bin/python bench/bench_serve.py              # ~12 minutes on 2 cores
    .venv-bench/bin/python bench/bench_serve.py --quick      # smoke run: c=1,8, 1 s windows
    .venv-bench/bin/python bench/bench_serve.py --only paralela_batch,paralela_w1
    .venv-bench/bin/python bench/bench_serve.py --profile    # + paralela's tuning rows
    .venv-bench/bin/python bench/bench_serve.py --levels 64 --window 4   # one level, shorter

Each server is its own process tree, alone, started from its own venv (paralela from
``.venv``, the peers from the interpreter running this script), loading the same model
class (``_serve_model.Embedder``). The closed-loop generator (``_loadgen.py``) runs in
this process on uvloop. After each level every response is checked against the model's
own batch-1 output for its input. Results go to ``bench/results/serve.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import _serve_model  # noqa: E402
import numpy as np  # noqa: E402
from _harness import child_env, machine_lines, md_table, sig  # noqa: E402
from _loadgen import Level, get, percentile, run_level  # noqa: E402
from _serve_procs import HOST, Server, ServerError, free_port, start, stop, wait_ready  # noqa: E402
from bench_sweep import machine_busy_s, wait_quiet  # noqa: E402

MODEL_SPEC = "bench/_serve_model.py:Embedder"
PINNED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ATOL = RTOL = 1e-4
RETRY_OTHER_CORES = 0.3  # a row whose windows saw more of other processes' CPU runs again

# name -> (kind, arguments, what it is, torch threads pinned to 1 by the environment)
ROWS: dict[str, tuple[str, list[str], str, bool]] = {
    "paralela_batch": ("paralela", [], "paralela serve, defaults (dynamic batching)", False),
    "paralela_mb1": ("paralela", ["--max-batch", "1"], "paralela serve --max-batch 1", False),
    "fastapi_async": ("peer", ["fastapi_async"], "FastAPI + uvicorn, `async def`", True),
    "fastapi_sync": ("peer", ["fastapi_sync"], "FastAPI + uvicorn, `def` (thread pool)", True),
    "fastapi_async_t2": (
        "peer",
        ["fastapi_async"],
        "FastAPI `async def`, torch's default threads (2)",
        False,
    ),
    "litserve_nobatch_w1": (
        "peer",
        ["litserve", "--workers", "1"],
        "LitServe, no batching, 1 worker",
        True,
    ),
    "litserve_b32_w1": (
        "peer",
        ["litserve", "--max-batch", "32", "--batch-timeout", "0.005", "--workers", "1"],
        "LitServe, max_batch_size 32, batch_timeout 5 ms, 1 worker",
        True,
    ),
    "litserve_nobatch_w2": (
        "peer",
        ["litserve", "--workers", "2"],
        "LitServe, no batching, 2 workers",
        True,
    ),
    "litserve_b32_w2": (
        "peer",
        ["litserve", "--max-batch", "32", "--batch-timeout", "0.005", "--workers", "2"],
        "LitServe, max_batch_size 32, batch_timeout 5 ms, 2 workers",
        True,
    ),
    # --profile: paralela's knobs, to see where its time goes
    "paralela_w1": ("paralela", ["--workers", "1"], "paralela serve --workers 1", False),
    "paralela_w2": ("paralela", ["--workers", "2"], "paralela serve --workers 2", False),
    "paralela_wait2": (
        "paralela",
        ["--max-wait-ms", "2"],
        "paralela serve --max-wait-ms 2",
        False,
    ),
    "paralela_wait10": (
        "paralela",
        ["--max-wait-ms", "10"],
        "paralela serve --max-wait-ms 10",
        False,
    ),
    "paralela_w2_wait2": (
        "paralela",
        ["--workers", "2", "--max-wait-ms", "2"],
        "paralela serve --workers 2 --max-wait-ms 2",
        False,
    ),
}
DEFAULT_ROWS = [n for n in ROWS if not n.startswith(("paralela_w", "paralela_wait"))]
PROFILE_ROWS = [n for n in ROWS if n not in DEFAULT_ROWS]
SETTINGS: dict[str, dict[str, Any]] = {
    "full": {"levels": (1, 8, 32, 64), "warmup": 2.0, "window": 8.0, "server_warmup": 3.0},
    "quick": {"levels": (1, 8), "warmup": 0.5, "window": 1.0, "server_warmup": 1.0},
}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: full or quick, with ``--levels`` and ``--window`` over them."""
    mode = dict(SETTINGS["quick" if args.quick else "full"])
    if args.levels:
        mode["levels"] = tuple(args.levels)
    if args.window is not None:
        mode["window"] = args.window
    return mode


def _levels_arg(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of concurrencies: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrencies must be 1 or more: {text!r}")
    return levels


@dataclass
class LevelResult:
    c: int
    window_s: float
    rps: float
    p50_ms: float
    p99_ms: float
    checked: int
    wrong_status: int
    wrong_value: int
    max_err: float
    errors: list[str]
    unfinished: int
    server_cores: float
    gen_cores: float
    machine_cores: float
    by_role: dict[str, float]
    batch: dict[str, float] = field(default_factory=dict)  # paralela's /metrics, this window


@dataclass
class RowResult:
    name: str
    what: str
    levels: list[LevelResult] = field(default_factory=list)
    startup_s: float = 0.0
    processes: int = 0
    listening: list[str] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    stopped: str = ""
    failed: str = ""
    metrics_names: list[str] = field(default_factory=list)
    runs: int = 1  # more than 1: run again for other load, the cleaner run kept

    def at(self, c: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.c == c), None)


# ------------------------------------------------------------------- the reference


def reference(
    texts: Sequence[str], log: Callable[[str], None]
) -> tuple[np.ndarray, dict[str, Any]]:
    """Batch-1 embeddings of every sentence, computed in a child, cached in bench/.cache."""
    cache = BENCH / ".cache"
    cache.mkdir(exist_ok=True)
    ignore = cache / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    key = hashlib.sha256("\n".join(texts).encode())
    for path in (REPO / _serve_model.SOURCE, BENCH / "_serve_model.py"):
        key.update(path.read_bytes())
    out = cache / f"serve-ref-{key.hexdigest()[:16]}.npz"
    if not out.exists():
        log(f"reference: embedding {len(texts)} sentences one by one (~15 s)")
        env = child_env({**PINNED, "HF_HUB_OFFLINE": "1"})
        code = subprocess.run(
            [sys.executable, str(BENCH / "_serve_model.py"), str(out)], env=env, check=False
        ).returncode
        if code != 0:
            raise SystemExit(f"bench_serve: the reference run exited {code}")
    meta = json.loads(out.with_suffix(".json").read_text())
    with np.load(out) as data:
        return data["ref"], meta


# ------------------------------------------------------------------------ servers


def command(name: str, paralela: Path, port: int) -> tuple[list[str], dict[str, str]]:
    kind, args, _, pinned = ROWS[name]
    env = child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    for var in PINNED:
        env.pop(var, None)
    if pinned:
        env.update(PINNED)
    if kind == "paralela":
        return [str(paralela), "serve", MODEL_SPEC, "--port", "0", *args], env
    return [sys.executable, str(BENCH / "_serve_peers.py"), *args, "--port", str(port)], env


def parse_metrics(text: str) -> dict[str, float]:
    """paralela's counters and histogram sums, each summed over its label sets:
    ``batch_size_sum``, ``batch_size_count``, ``batch_seconds_sum``, ``requests_total``..."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"paralela_serve_(\w+?)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        with contextlib.suppress(ValueError):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


async def metrics_text(server: Server) -> str:
    with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError, EOFError):
        status, body = await get(HOST, server.port, "/metrics")
        if status == 200:
            return body.decode(errors="replace")
    return ""


def check(level: Level, ref: np.ndarray) -> tuple[int, int, int, float]:
    wrong_status = wrong_value = 0
    max_err = 0.0
    for s in level.samples:
        if s.status != 200:
            wrong_status += 1
            continue
        try:
            out = np.asarray(json.loads(s.body)["output"], dtype=np.float64)
        except (ValueError, KeyError, TypeError):
            wrong_value += 1
            continue
        want = ref[s.index]
        if out.shape != want.shape:
            wrong_value += 1
            continue
        max_err = max(max_err, float(np.max(np.abs(out - want))))
        if not np.allclose(out, want, atol=ATOL, rtol=RTOL):
            wrong_value += 1
    return len(level.samples), wrong_status, wrong_value, max_err


async def measure(
    server: Server, c: int, mode: dict[str, Any], texts: Sequence[str], ref: np.ndarray,
    is_paralela: bool,
) -> LevelResult:  # fmt: skip
    snap: dict[str, Any] = {}

    async def window_start() -> None:
        if is_paralela:
            snap["m0"] = parse_metrics(await metrics_text(server))
        snap["tree0"] = server.cpu_by_process()
        snap["busy0"] = machine_busy_s()
        snap["gen0"] = time.process_time()

    async def window_end() -> None:
        snap["gen1"] = time.process_time()
        snap["busy1"] = machine_busy_s()
        snap["tree1"] = server.cpu_by_process()
        if is_paralela:
            snap["m1"] = parse_metrics(await metrics_text(server))

    level = await run_level(
        HOST, server.port, texts, c, warmup_s=mode["warmup"], window_s=mode["window"],
        on_window_start=window_start, on_window_end=window_end,
    )  # fmt: skip
    w = level.window_s
    by_role: dict[str, float] = {}
    for pid, (role, cpu1) in snap["tree1"].items():
        cpu0 = snap["tree0"].get(pid, (role, 0.0))[1]
        label = f"{role} {pid}"
        by_role[label] = (cpu1 - cpu0) / w
    lat = sorted(s.latency_s for s in level.samples)
    checked, wrong_status, wrong_value, max_err = check(level, ref)
    batch = {}
    if is_paralela and snap.get("m0") is not None and snap.get("m1"):
        m0, m1 = snap["m0"], snap["m1"]
        batch = {k: v - m0.get(k, 0.0) for k, v in m1.items()}
    return LevelResult(
        c=c,
        window_s=w,
        rps=len(level.samples) / w,
        p50_ms=1e3 * percentile(lat, 50),
        p99_ms=1e3 * percentile(lat, 99),
        checked=checked,
        wrong_status=wrong_status,
        wrong_value=wrong_value,
        max_err=max_err,
        errors=level.errors,
        unfinished=level.unfinished,
        server_cores=sum(by_role.values()),
        gen_cores=(snap["gen1"] - snap["gen0"]) / w,
        machine_cores=(snap["busy1"] - snap["busy0"]) / w,
        by_role=by_role,
        batch=batch,
    )


async def run_row(
    name: str, args: argparse.Namespace, mode: dict[str, Any], texts: Sequence[str],
    ref: np.ndarray, tmp: Path, log: Callable[[str], None],
) -> RowResult:  # fmt: skip
    kind, _, what, _ = ROWS[name]
    result = RowResult(name, what)
    port = free_port()
    cmd, env = command(name, args.paralela, port)
    server = start(name, cmd, env, tmp / f"{name}.log", REPO)
    try:
        await wait_ready(server, None if kind == "paralela" else port)
        result.startup_s = server.startup_s
        result.processes = len(server.tree())
        result.listening = server.listening()
        result.threads = sorted({f"{e['threads']}" for e in server.embedders()})
        log(f"  {name}: ready in {server.startup_s:.1f} s on port {server.port}, "
            f"{result.processes} processes, torch threads {','.join(result.threads)}")  # fmt: skip
        await run_level(HOST, server.port, texts, 8, warmup_s=0.0, window_s=mode["server_warmup"])
        for c in mode["levels"]:
            lv = await measure(server, c, mode, texts, ref, kind == "paralela")
            result.levels.append(lv)
            mean_batch = _per_batch(lv, "batch_size") or 0.0
            log(f"  {name} c={c}: {lv.rps:.0f} req/s, p50 {lv.p50_ms:.1f} ms, p99 "
                f"{lv.p99_ms:.1f} ms, server {lv.server_cores:.2f} cores, gen "
                f"{lv.gen_cores:.2f}, machine {lv.machine_cores:.2f}"
                + (f", mean batch {mean_batch:.1f}" if lv.batch else "")
                + (f", {lv.wrong_status + lv.wrong_value} WRONG" if lv.wrong_status
                   or lv.wrong_value else "")
                + (f", errors {lv.errors}" if lv.errors else ""))  # fmt: skip
        if kind == "paralela":
            text = await metrics_text(server)
            result.metrics_names = sorted(
                {ln.split("{")[0].split()[0] for ln in text.splitlines() if ln and ln[0] != "#"}
            )
    except ServerError as exc:
        result.failed = str(exc).splitlines()[0]
        log(f"  {name}: FAILED: {exc}")
    finally:
        stop(server)
        result.stopped = server.stopped
    return result


def paralela_available(paralela: Path) -> str:
    """'' when ``paralela serve --help`` works, else why not."""
    if not paralela.exists():
        return f"{paralela} not found"
    proc = subprocess.run(
        [str(paralela), "serve", "--help"], capture_output=True, text=True, check=False
    )
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


# ------------------------------------------------------------------------- report


def _levels(rows: Sequence[RowResult]) -> list[int]:
    return sorted({lv.c for r in rows for lv in r.levels})


def _grid(
    rows: Sequence[RowResult], cell: Callable[[RowResult, LevelResult], str], extra: bool = False
) -> str:
    cs = _levels(rows)
    body = []
    for r in rows:
        cells = []
        for c in cs:
            lv = r.at(c)
            cells.append(cell(r, lv) if lv else (r.failed and "failed") or "-")
        body.append([f"`{r.name}`", *cells, *([r.what] if extra else [])])
    return md_table(["server", *[f"c={c}" for c in cs], *(["what"] if extra else [])], body)


def _per_batch(lv: LevelResult, what: str) -> float | None:
    """The window's mean of paralela's histogram ``what`` (batch_size, batch_seconds)."""
    n = lv.batch.get(f"{what}_count")
    return lv.batch.get(f"{what}_sum", 0.0) / n if n else None


def _batch_cell(lv: LevelResult) -> str:
    size, secs = _per_batch(lv, "batch_size"), _per_batch(lv, "batch_seconds")
    req = _per_batch(lv, "request_seconds")
    if size is None:
        return "-"
    rate = lv.batch.get("batch_size_count", 0.0) / lv.window_s
    return (
        f"{sig(size)} / {sig(rate)} / {sig(1e3 * secs) if secs is not None else '-'} / "
        f"{sig(1e3 * req) if req is not None else '-'}"
    )


def _ratios(rows: Sequence[RowResult], base: RowResult) -> str:
    cs = _levels(rows)
    body = []
    for r in rows:
        if r is base:
            continue
        cells = []
        for c in cs:
            a, b = base.at(c), r.at(c)
            cells.append(f"{a.rps / b.rps:.2f}x" if a and b and b.rps else "-")
        body.append([f"`{base.name}` / `{r.name}`", *cells])
    return md_table(["throughput ratio", *[f"c={c}" for c in cs]], body)


def verdicts(rows: Sequence[RowResult]) -> list[str]:
    by = {r.name: r for r in rows}
    base, mb1 = by.get("paralela_batch"), by.get("paralela_mb1")
    if base is None or not base.levels:
        return ["- paralela serve did not run: no verdict."]
    out = []
    if mb1 is not None and mb1.levels:
        for c in _levels([base]):
            a, b = base.at(c), mb1.at(c)
            if not (a and b):
                continue
            if c == 1:  # issue 27: batching costs a lone client nothing
                out.append(
                    f"- c=1: defaults / `--max-batch 1` = {a.rps / b.rps:.2f}x throughput "
                    f"(target ≥ 1x): **{'met' if a.rps >= b.rps else 'MISSED'}**"
                )
            if c < 8:
                continue
            ok = a.rps >= 3 * b.rps and a.p99_ms <= b.p99_ms
            out.append(
                f"- c={c}: batching / `--max-batch 1` = {a.rps / b.rps:.2f}x throughput "
                f"(target ≥ 3x), p99 {sig(a.p99_ms)} ms against {sig(b.p99_ms)} ms "
                f"(target ≤): **{'met' if ok else 'MISSED'}**"
            )
    peers = [r for r in rows if not r.name.startswith("paralela") and r.levels]
    for c in _levels([base]):
        a = base.at(c)
        if a is None:
            continue
        # c=1 (issue 27): ahead of LitServe's best; c >= 8: ahead of every peer
        rivals = peers if c >= 8 else [r for r in peers if r.name.startswith("litserve")]
        who = "every peer" if c >= 8 else "every LitServe row"
        beaten = [
            (r.name, a.rps / lv.rps) for r in rivals if (lv := r.at(c)) is not None and lv.rps
        ]
        behind = [f"`{n}` ({x:.2f}x)" for n, x in beaten if x <= 1.0]
        worst = min(beaten, key=lambda t: t[1]) if beaten else None
        out.append(
            f"- c={c}: ahead of {who}: **{'met' if not behind else 'MISSED'}**"
            + (f" (closest: `{worst[0]}`, {worst[1]:.2f}x)" if worst and not behind else "")
            + (f"; behind or level with {', '.join(behind)}" if behind else "")
        )
    return out


def report(rows: Sequence[RowResult], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    mode = settings(args)
    flags = (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    flags += " --profile" if args.profile else ""
    flags += f" --levels {','.join(map(str, args.levels))}" if args.levels else ""
    flags += f" --window {args.window:g}" if args.window is not None else ""
    cost = meta["cost_s"]
    by = {r.name: r for r in rows}
    ran = [r for r in rows if r.levels]
    base = by.get("paralela_batch")
    lines = [
        "# `paralela serve` against FastAPI and LitServe (`bench_serve.py`)",
        "",
        f"Generated by `.venv-bench/bin/python bench/bench_serve.py{flags}`. Targets: "
        "paralela with dynamic batching ≥ 3x the throughput of `--max-batch 1` at an equal "
        "or better p99 and ahead of LitServe and plain FastAPI at every concurrency ≥ 8; at "
        "c=1 no slower than `--max-batch 1` and ahead of every LitServe row.",
        "",
        "## Machine and versions",
        "",
        *machine_lines(
            [
                "torch",
                "sentence-transformers",
                "transformers",
                "fastapi",
                "starlette",
                "uvicorn",
                "uvloop",
                "httptools",
                "litserve",
                "pydantic",
                "psutil",
                "numpy",
            ]
        ),
        f"- paralela: `{args.paralela}` (its own venv), {args.paralela_commit}; its "
        f"versions: {args.paralela_versions}",
        "",
        "## Method",
        "",
        f"- Model: all-MiniLM-L6-v2 (`{_serve_model.SOURCE}`'s `Embedder`, loaded through "
        f"`{MODEL_SPEC}` by every server), CPU. In process, 1 torch thread: "
        + ", ".join(
            f"batch {b}: {1e3 * s:.1f} ms ({1e3 * s / int(b):.2f} ms/row)" for b, s in cost.items()
        )
        + f"; load {meta['load_s']:.1f} s.",
        f'- Requests: `POST /predict {{"input": "<sentence>"}}` → `{{"output": [384 '
        f"floats]}}` for every server, one of {len(_serve_model.sentences())} distinct "
        "sentences of 6-18 words each (seeded).",
        "- Peers run with `OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=MKL_NUM_THREADS=1` as in the "
        "anchors (the model gives torch that many threads), except `fastapi_async_t2` "
        "(torch's default, 2 threads). paralela's rows get no such variable: paralela sets "
        "each worker's `OMP_NUM_THREADS` to its slot's CPU count. The table of processes "
        "gives the threads each server's model reported.",
        '- FastAPI 1 uvicorn worker, pydantic request model; LitServe `accelerator="cpu"`, '
        "`max_batch_size`/`batch_timeout` on the `LitAPI`; all `log_level=warning`, "
        "127.0.0.1. paralela: `paralela serve "
        f"{MODEL_SPEC} --port 0 [options]`, port read from its ready line.",
        f"- Load: closed loop, asyncio + uvloop streams, HTTP/1.1 keep-alive (`_loadgen.py`), "
        f"concurrency {', '.join(map(str, mode['levels']))}. Each server: "
        f"{mode['server_warmup']:.0f} s warm-up at c=8; each level: {mode['warmup']:.1f} s "
        f"warm-up, then a {mode['window']:g} s window (the anchors: 2 s + 15 s; shorter "
        "here for a model ~1,000x slower). A response counts when it completes in the "
        "window; latency is first byte sent to last byte received. Sending stops at the "
        "window's end or after 400,000 requests; what is in flight 10 s later is cancelled.",
        "- After each window, every counted response is checked against the model's own "
        f"batch-1 output for its input: status 200, `allclose(atol={ATOL}, rtol={RTOL})`.",
        "- CPU over the window: the server's process tree (psutil, per process), the "
        "generator (`process_time`), the whole machine (/proc/stat); `other` = machine -"
        " server - generator. paralela rows: `paralela_serve_batch_size` from `/metrics` "
        "before and after the window.",
        "- Each server alone, one after another; before each the parent waits (up to "
        f"{args.wait_quiet:.0f} s) for an idle machine. Stop: SIGINT to the root, then "
        "SIGTERM and SIGKILL for leftovers.",
        "",
        "**A shared, noisy 2-core VM:** compare rows within this run; a cell can move "
        "10-20 % between runs.",
        "",
        "## Targets",
        "",
        *verdicts(rows),
        "",
        "## Throughput (req/s completed in the window)",
        "",
        _grid(rows, lambda r, lv: sig(lv.rps), extra=True),
        "",
    ]
    if base is not None and base.levels:
        lines += ["### Ratios: paralela (batching) / each server", "", _ratios(ran, base), ""]
    lines += [
        "## Latency p50 / p99 (ms)",
        "",
        _grid(rows, lambda r, lv: f"{sig(lv.p50_ms)} / {sig(lv.p99_ms)}"),
        "",
        "## CPU over the window (cores of 2): server tree / generator / machine / other",
        "",
        _grid(
            rows,
            lambda r, lv: (
                f"{lv.server_cores:.2f} / {lv.gen_cores:.2f} / {lv.machine_cores:.2f} / "
                f"{max(0.0, lv.machine_cores - lv.server_cores - lv.gen_cores):.2f}"
            ),
        ),
        "",
        "## Server CPU per request (ms) = server cores / req/s",
        "",
        _grid(rows, lambda r, lv: sig(1e3 * lv.server_cores / lv.rps) if lv.rps else "-"),
        "",
    ]
    pr = [r for r in ran if r.name.startswith("paralela")]
    if pr:
        lines += [
            "## paralela's `/metrics` over the window",
            "",
            "Mean batch size / batches per second / mean `paralela_serve_batch_seconds` (ms) "
            "/ mean `paralela_serve_request_seconds` (ms).",
            "",
            _grid(pr, lambda r, lv: _batch_cell(lv)),
            "",
        ]
    cmax = max(_levels(rows), default=0)
    lines += [
        "## Correctness, start-up, processes",
        "",
        md_table(
            [
                "server",
                "checked",
                "wrong status",
                "wrong value",
                "max abs err",
                "conn. errors",
                "unfinished",
                "start-up s",
                "processes",
                "torch threads",
                "listens on",
                "stopped cleanly",
                "runs",
                "other load (max)",
            ],
            [
                [
                    f"`{r.name}`",
                    f"{sum(lv.checked for lv in r.levels):,}",
                    str(sum(lv.wrong_status for lv in r.levels)),
                    str(sum(lv.wrong_value for lv in r.levels)),
                    f"{max((lv.max_err for lv in r.levels), default=0):.1e}",
                    "; ".join(e for lv in r.levels for e in lv.errors) or "0",
                    str(sum(lv.unfinished for lv in r.levels)),
                    f"{r.startup_s:.1f}",
                    str(r.processes),
                    ",".join(r.threads) or "?",
                    ", ".join(r.listening),
                    r.stopped + (f"; FAILED: {r.failed}" if r.failed else ""),
                    str(r.runs),
                    f"{other_load(r):.2f}",
                ]
                for r in rows
            ],
        ),
        "",
        f"## CPU by process at c={cmax} (cores)",
        "",
        md_table(
            ["server", "processes (role pid: cores)"],
            [
                [
                    f"`{r.name}`",
                    ", ".join(
                        f"{k} {v:.2f}" for k, v in sorted(lv.by_role.items(), key=lambda t: -t[1])
                    ),
                ]
                for r in ran
                if (lv := r.at(cmax))
            ],
        ),
        "",
    ]
    names = next((r.metrics_names for r in pr if r.metrics_names), [])
    if names:
        lines += [f"paralela's `/metrics` series: {', '.join(f'`{n}`' for n in names)}.", ""]
    return "\n".join(lines)


def _paralela_versions(paralela: Path) -> str:
    py = paralela.parent / "python"
    code = (
        "from importlib import metadata as m\n"
        "for p in ('fastapi','uvicorn','uvloop','httptools','torch'):\n"
        "    try: print(p, m.version(p), end=', ')\n"
        "    except m.PackageNotFoundError: print(p, 'not installed', end=', ')\n"
    )
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip().rstrip(",") or "unknown"


def _commit() -> str:
    """The commit paralela ran at, and whether its serving code had changes not committed."""

    def git(*cmd: str) -> str:
        proc = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=REPO, check=False)
        return proc.stdout.strip()

    dirty = git("status", "--porcelain", "--", "paralela/serving", "paralela/cli")
    return f"commit {git('rev-parse', '--short', 'HEAD') or '?'}" + (
        " with uncommitted changes in paralela/serving or paralela/cli" if dirty else ""
    )


async def run_all(
    args: argparse.Namespace, names: Sequence[str], log: Callable[[str], None]
) -> list[RowResult]:
    mode = settings(args)
    texts = _serve_model.sentences()
    ref, meta = reference(texts, log)
    args.meta = meta
    why = paralela_available(args.paralela)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        for name in names:
            if ROWS[name][0] == "paralela" and why:
                log(f"{name}: not available ({why})")
                rows.append(RowResult(name, ROWS[name][2], failed=f"not available: {why}"))
                continue
            log(f"{name}: {ROWS[name][2]}")
            wait_quiet(args.wait_quiet, log)
            rows.append(await run_row(name, args, mode, texts, ref, Path(tmp), log))
        for _ in range(args.retries):  # rows that shared the machine run once more
            for i, row in enumerate(rows):
                if row.levels and other_load(row) > RETRY_OTHER_CORES:
                    log(f"{row.name}: again (other load {other_load(row):.2f} cores)")
                    wait_quiet(args.wait_quiet, log)
                    again = await run_row(row.name, args, mode, texts, ref, Path(tmp), log)
                    if again.levels and other_load(again) < other_load(row):
                        again.runs = row.runs + 1
                        rows[i] = again
                    else:
                        row.runs += 1
    return rows


def other_load(row: RowResult) -> float:
    """The most cores the rest of the machine used in any window of the row."""
    return max(
        (max(0.0, lv.machine_cores - lv.server_cores - lv.gen_cores) for lv in row.levels),
        default=0.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke run: c=1,8, 1 s windows")
    ap.add_argument("--only", default="", help=f"rows, comma-separated: {','.join(ROWS)}")
    ap.add_argument("--profile", action="store_true", help="add paralela's tuning rows")
    ap.add_argument(
        "--levels", type=_levels_arg, default=None, help="concurrencies, e.g. 64 or 8,32,64"
    )
    ap.add_argument("--window", type=float, default=None, help="seconds a level is measured")
    ap.add_argument("--wait-quiet", type=float, default=20.0, help="seconds to wait for idle")
    ap.add_argument("--retries", type=int, default=1, help="reruns of rows with other load")
    ap.add_argument("--paralela", type=Path, default=REPO / ".venv" / "bin" / "paralela")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "serve.md")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(DEFAULT_ROWS)
    if args.profile:
        names += [n for n in PROFILE_ROWS if n not in names]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown row(s) {', '.join(unknown)}; rows are: {', '.join(ROWS)}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    args.paralela_versions = _paralela_versions(args.paralela)
    args.paralela_commit = _commit()
    started = time.monotonic()
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        rows = runner.run(run_all(args, names, log))
    log(f"done in {time.monotonic() - started:.0f} s")
    text = report(rows, args, args.meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
