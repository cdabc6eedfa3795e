"""Input-pipeline benchmark: paralela.data against a serial loop, DataLoader and tf.data.

    parent ── N small files in a temp dir; decode calibrated to ~2 ms of CPU
      for each repetition, for each setting (consumer step), engines in rotated order:
        fresh child: `bench_data.py --child ENGINE` (imports and pipeline definition
        untimed; one short untimed warm-up epoch)
          timed epoch:  iter() ─► next batch ─► consumer: time.sleep(step) ─► ...
            read   = open + read a 4 KiB file + time.sleep(5 ms)      (I/O-bound)
            decode = FNV-1a over the bytes, PASSES times (pure Python) (CPU-bound)
            batch  = B elements
          figures: consumer busy = 1 - waiting for the next batch / wall, elements/s,
          CPU-s of the process tree (psutil: the child, its live descendants, and the
          children it reaped), the machine's other load (/proc/stat) and load average

Engines (all from the same virtual environment, each alone in a fresh process):
``serial`` (read, decode, batch, consume in one thread), ``paralela``
(``Pipeline.from_files(dir).map(read_file, kind="thread").map(decode, kind="process")
.batch(B).prefetch(2)``, no worker counts), ``torch_0`` ... ``torch_4``
(``DataLoader(map-style dataset, batch_size=B, num_workers=k)``, read and decode in
``__getitem__``), ``tf_autotune`` (``from_tensor_slices(paths).map(py_function(read +
decode), num_parallel_calls=AUTOTUNE).batch(B).prefetch(AUTOTUNE)``).

Usage::

    .venv/bin/python bench/bench_data.py            # 2 settings x 8 engines x 3 reps (~8 min)
    .venv/bin/python bench/bench_data.py --quick    # smoke run: 256 files, 1 setting (~40 s)
    .venv/bin/python bench/bench_data.py --only paralela,torch_4 --reps 1

Progress goes to stderr; the results to ``bench/results/data.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import BENCH_DIR, child_env, machine_lines, md_table, run_child, sig
from bench_sweep import machine_busy_s

RESULTS = BENCH_DIR / "results" / "data.md"
PACKAGES = ("torch", "tensorflow", "numpy", "psutil")
ENGINES = (
    "serial",
    "paralela",
    "torch_0",
    "torch_1",
    "torch_2",
    "torch_3",
    "torch_4",
    "tf_autotune",
)
#: Engines that run a fraction of the files (marked `*`): one element at a time they
#: would take 15-30 s an epoch; their rates are per element, their CPU-s projected.
FRACTION = {"serial": 4, "torch_0": 4, "torch_1": 2}

FILE_BYTES = 4096
READ_LATENCY_S = 0.005  # simulated storage latency per read (time.sleep)
DECODE_MS = 2.0  # pure-Python CPU per element, calibrated in the parent
BATCH = 32
WARMUP_FILES = 64  # the untimed warm-up epoch (2 batches)
SEED = 20261125

#: Consumer steps (s per batch of 32). 0.100 needs 320 elements/s, 0.64 CPUs of decode:
#: 2 cores can keep that consumer busy. 0.010 needs 3,200 elements/s, 6.4 CPUs of
#: decode: no engine can on 2 cores; the figure there is the throughput.
SETTINGS = {"feasible": 0.100, "infeasible": 0.010}
MODES: dict[str, dict[str, Any]] = {
    "full": {"files": 2048, "settings": ("feasible", "infeasible"), "reps": 3},
    "quick": {"files": 256, "settings": ("feasible",), "reps": 1},
}
TARGET_BUSY = 0.95

# Read by every worker (forked, spawned or a thread): the parent's calibration.
PASSES = int(os.environ.get("BENCH_DATA_PASSES", "8"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ work functions
# Module-level, imported by name as ``bench_data`` (bench/ is on PYTHONPATH), so every
# engine's workers pickle them by reference.


def read_file(path: str) -> bytes:
    """A small file's bytes, after a simulated storage latency."""
    with open(path, "rb") as f:
        data = f.read()
    time.sleep(READ_LATENCY_S)
    return data


def decode(data: bytes) -> int:
    """A pure-Python pass over every byte (FNV-1a), ``PASSES`` times: ~2 ms of CPU."""
    h = 0x811C9DC5
    for _ in range(PASSES):
        for b in data:
            h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def read_decode(path: str) -> int:
    return decode(read_file(path))


def calibrate(path: str, target_ms: float) -> tuple[int, float]:
    """The passes that take ``target_ms`` of this thread's CPU, and one pass's ms (the
    fastest of 30: CPU time, so another process on the machine does not inflate it)."""
    global PASSES
    data = Path(path).read_bytes()
    PASSES = 1
    best = min(_thread_ms(decode, data) for _ in range(30))
    return max(1, round(target_ms / best)), best


def _thread_ms(fn: Callable[[bytes], Any], data: bytes) -> float:
    t0 = time.thread_time()
    fn(data)
    return (time.thread_time() - t0) * 1e3


def digest(values: Iterable[int], start: int) -> int:
    """An order-sensitive sum of the decoded values (positions from ``start``)."""
    return sum((start + i + 1) * v for i, v in enumerate(values)) % (2**61 - 1)


# ------------------------------------------------------------------------- children


def tree_cpu_s() -> float:
    """user + sys of this process, its live descendants and every child it reaped."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # gone between the listing and the read: reaped, counted above
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


def _as_ints(batch: Any) -> list[int]:
    if hasattr(batch, "numpy"):  # a torch or tf tensor
        batch = batch.numpy()
    if hasattr(batch, "tolist"):
        batch = batch.tolist()
    return [int(v) for v in batch]


class _Serial:
    """The reference loop: read, decode and batch in the consumer's thread."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[list[int]]:
        for i in range(0, len(self.paths), BATCH):
            yield [decode(read_file(p)) for p in self.paths[i : i + BATCH]]


class _MapStyle:
    """A map-style dataset for torch's DataLoader: read and decode in ``__getitem__``."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        return read_decode(self.paths[index])


def _tf_read_decode(path: Any) -> int:
    return read_decode(path.numpy().decode())


def define(engine: str, paths: list[str], directory: str | None) -> Any:
    """The engine's pipeline over ``paths``: an iterable whose ``iter()`` starts it."""
    if engine == "serial":
        return _Serial(paths)
    if engine == "paralela":
        from paralela.data import Pipeline

        source = Pipeline.from_files(directory) if directory else Pipeline.from_iterable(paths)
        return (
            source.map(read_file, kind="thread")
            .map(decode, kind="process")
            .batch(BATCH)
            .prefetch(2)
        )
    if engine.startswith("torch_"):
        from torch.utils.data import DataLoader

        return DataLoader(_MapStyle(paths), batch_size=BATCH, num_workers=int(engine[6:]))
    if engine == "tf_autotune":
        import tensorflow as tf

        def fn(path: Any) -> Any:
            return tf.py_function(_tf_read_decode, [path], Tout=tf.int64)

        return (
            tf.data.Dataset.from_tensor_slices(paths)
            .map(fn, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(BATCH)
            .prefetch(tf.data.AUTOTUNE)
        )
    raise SystemExit(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}")


def epoch(pipeline: Any, batches: int, step_s: float) -> dict[str, Any]:
    """One timed epoch: the consumer takes ``batches`` batches, ``step_s`` each."""
    cpu0, busy0 = tree_cpu_s(), machine_busy_s()
    t0 = time.perf_counter()
    it = iter(pipeline)  # starts the workers: part of the epoch
    consumed = 0.0
    first = None
    values: list[int] = []
    for _ in range(batches):
        batch = next(it)
        c0 = time.perf_counter()
        if first is None:
            first = c0 - t0
        values.extend(_as_ints(batch))
        time.sleep(step_s)  # the "GPU step"
        consumed += time.perf_counter() - c0
    wall = time.perf_counter() - t0
    # The CPU of the tree at the last batch, before the workers are shut down (their CPU
    # is read while they live; DataLoader's are reaped in next()'s StopIteration).
    cpu = tree_cpu_s() - cpu0
    machine = machine_busy_s() - busy0
    leftover = next(it, None)
    return {
        "wall": wall,
        "waited": wall - consumed,
        "busy": consumed / wall,
        "first_batch_s": first,
        "elements": len(values),
        "per_s": len(values) / wall,
        "cpu_s": cpu,
        "other_cores": max(0.0, (machine - cpu) / wall),
        "loadavg": os.getloadavg()[0],
        "digest": digest(values, 0),
        "leftover": leftover is not None,
        "iterator": it,
    }


def child_main(engine: str, spec: dict[str, Any], result_path: str) -> None:
    paths: list[str] = spec["paths"]
    out: dict[str, Any] = {"engine": engine}
    define(engine, paths[:WARMUP_FILES], None)  # imports, untimed
    for _ in define(engine, paths[:WARMUP_FILES], None):  # warm-up epoch, untimed
        pass
    pipeline = define(engine, paths, spec["directory"] if engine == "paralela" else None)
    batches = -(-len(paths) // BATCH)
    t_start = time.perf_counter()
    res = epoch(pipeline, batches, spec["step_s"])
    it = res.pop("iterator")
    if engine == "paralela":
        stats = pipeline.stats()
        out["stats_text"] = str(stats)
        out["stats"] = stats.to_dict()
        out["history"] = {
            s.name: [(round(t - t_start, 3), n) for t, n in s.history] for s in stats.stages
        }
        out["cpus"] = stats.cpus
    del it
    out.update(res)
    Path(result_path).write_text(json.dumps(out))


# --------------------------------------------------------------------------- parent


@dataclass
class Row:
    engine: str
    setting: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.runs]

    def median(self, key: str) -> float | None:
        v = self.values(key)
        return statistics.median(v) if v else None


def write_files(directory: Path, n: int) -> list[str]:
    rng = random.Random(SEED)
    paths = []
    for i in range(n):
        p = directory / f"{i:05d}.bin"
        p.write_bytes(rng.randbytes(FILE_BYTES))
        paths.append(str(p))
    return paths


def run_one(engine: str, setting: str, paths: list[str], directory: str, passes: int) -> dict:
    n = len(paths) // FRACTION.get(engine, 1)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        spec = Path(tmp, "spec.json")
        result = Path(tmp, "result.json")
        spec.write_text(
            json.dumps(
                {"paths": paths[:n], "directory": directory if n == len(paths) else None,
                 "step_s": SETTINGS[setting]}
            )
        )  # fmt: skip
        env = child_env({"BENCH_DATA_PASSES": str(passes), "TF_CPP_MIN_LOG_LEVEL": "2"})
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine]
        cmd += ["--spec", str(spec), "--result", str(result)]
        run = run_child(cmd, timeout=300, env=env)
        if run.returncode != 0 or not result.exists():
            return {"error": f"exit {run.returncode}: {run.tail[-600:]}"}
        out: dict[str, Any] = json.loads(result.read_text())
        out["process_wall"] = run.wall
        return out


def expected_digest(paths: list[str]) -> int:
    return digest((read_decode_untimed(p) for p in paths), 0)


def read_decode_untimed(path: str) -> int:
    return decode(Path(path).read_bytes())


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 256 files, 1 setting, 1 rep")
    ap.add_argument("--only", default="", help="comma-separated engines (default: all)")
    ap.add_argument("--reps", type=int, default=0, help="repetitions (default 3; quick 1)")
    ap.add_argument("--out", default=str(RESULTS), help="Markdown file to write")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child, json.loads(Path(args.spec).read_text()), args.result)
        return
    mode = MODES["quick" if args.quick else "full"]
    reps = args.reps or mode["reps"]
    engines = [e for e in args.only.split(",") if e] or list(ENGINES)
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r}; engines: {', '.join(ENGINES)}")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="bench-data-files-") as tmp:
        paths = write_files(Path(tmp), mode["files"])
        passes, pass_ms = calibrate(paths[0], DECODE_MS)
        globals()["PASSES"] = passes
        decode_ms = min(_thread_ms(decode, Path(paths[0]).read_bytes()) for _ in range(10))
        log(f"decode: {passes} passes of {pass_ms:.3f} ms = {decode_ms:.2f} ms CPU")
        expected = {n: expected_digest(paths[:n]) for n in {len(paths) // f for f in (1, 2, 4)}}
        rows = {(s, e): Row(e, s) for s in mode["settings"] for e in engines}
        loads: list[float] = []
        for rep in range(reps):
            for setting in mode["settings"]:
                k = rep % len(engines)
                for engine in engines[k:] + engines[:k]:  # alternated: a rotation per rep
                    loads.append(os.getloadavg()[0])
                    log(f"rep {rep + 1}/{reps} {setting} {engine} (load {loads[-1]:.2f})")
                    res = run_one(engine, setting, paths, tmp, passes)
                    row = rows[(setting, engine)]
                    if "error" in res:
                        log(f"  FAILED: {res['error']}")
                        row.errors.append(res["error"])
                        continue
                    if res["digest"] != expected[res["elements"]] or res["leftover"]:
                        row.errors.append("wrong or out-of-order values")
                    row.runs.append(res)
                    log(
                        f"  busy {res['busy']:.3f}  {res['per_s']:.0f} el/s  "
                        f"cpu {res['cpu_s']:.2f} s  other {res['other_cores']:.2f} cores"
                    )
                    facts = {"passes": passes, "pass_ms": pass_ms, "decode_ms": decode_ms}
                    text = render(args, mode, reps, facts, rows, loads, started, len(paths))
                    Path(args.out).write_text(text)
    log(f"wrote {args.out}")


# ------------------------------------------------------------------------ rendering


def _spread(values: list[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "-"
    med = fmt(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({fmt(min(values))}-{fmt(max(values))})"


def _label(engine: str) -> str:
    if engine.startswith("torch_"):
        return f"DataLoader num_workers={engine[6:]}"
    return {"tf_autotune": "tf.data AUTOTUNE", "paralela": "paralela (auto)"}.get(engine, engine)


def _best_torch(rows: dict[tuple[str, str], Row], setting: str) -> Row | None:
    torch = [r for (s, e), r in rows.items() if s == setting and e.startswith("torch_") and r.runs]
    return max(
        torch, key=lambda r: (r.median("per_s") or 0, -(r.median("cpu_s") or 0)), default=None
    )


def render(
    args: argparse.Namespace,
    mode: dict[str, Any],
    reps: int,
    facts: dict[str, Any],
    rows: dict[tuple[str, str], Row],
    loads: list[float],
    started: str,
    n_files: int,
) -> str:
    lines = [
        "# paralela.data: input pipelines (`bench/bench_data.py`)",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'bench/bench_data.py', *sys.argv[1:]])}`"
        + (" (quick smoke run: figures only show that every engine works)" if args.quick else ""),
        "",
        *machine_lines(PACKAGES),
        f"- Every engine ran from the same virtual environment ({sys.prefix}), in a fresh "
        "child process of its own; engines alternated (a rotation of the order per "
        f"repetition), {reps} repetition(s); started {started}.",
        f"- Machine load (1-min load average before each child): median "
        f"{sig(statistics.median(loads)) if loads else '-'}, min {sig(min(loads, default=0))}, "
        f"max {sig(max(loads, default=0))} on {os.cpu_count()} CPUs. Other engineers' "
        "benchmarks shared the machine; `other load` is the CPU the rest of the machine "
        "used while the epoch ran (/proc/stat minus this engine's tree).",
        "",
        "## Workload",
        "",
        f"- {n_files} files of {FILE_BYTES} random bytes in a temporary directory. Read: "
        f"open + read + `time.sleep({READ_LATENCY_S})` (storage latency). Decode: FNV-1a "
        f"over every byte, {facts['passes']} passes, pure Python: {facts['decode_ms']:.2f} ms "
        f"of CPU (one pass {facts['pass_ms']:.3f} ms, calibrated by thread CPU time). "
        f"Batches of {BATCH}; the consumer sleeps a fixed step per batch (a GPU step).",
        "- Settings: "
        + "; ".join(
            f"`{s}`: {SETTINGS[s] * 1e3:.0f} ms a batch, needs {BATCH / SETTINGS[s]:,.0f} "
            f"elements/s = {BATCH / SETTINGS[s] * facts['decode_ms'] / 1e3:.2f} CPUs of decode"
            for s in mode["settings"]
        )
        + f". On {os.cpu_count()} CPUs decode alone caps the rate at "
        f"{(os.cpu_count() or 1) / facts['decode_ms'] * 1e3:,.0f} elements/s.",
        "- Busy = 1 - (time the consumer waited for its next batch, from `iter()` on) / "
        "wall; throughput = elements / wall; CPU-s = user + sys of the child's process tree "
        "over the epoch (psutil: the child, its live workers and the children it reaped), "
        "read after the last batch, before the workers shut down. One untimed warm-up "
        f"epoch of {WARMUP_FILES} files first. Values are checked (order-sensitive digest).",
        "- Median (min-max) over the repetitions. Rows with `*` ran 1/"
        + ", 1/".join(f"{v} ({k})" for k, v in FRACTION.items())
        + " of the files; their CPU-s are projected to the full epoch.",
        "",
    ]
    for setting in mode["settings"]:
        lines += _setting_section(rows, setting, n_files)
    lines += _paralela_section(rows, mode)
    return "\n".join(lines) + "\n"


def _setting_section(rows: dict[tuple[str, str], Row], setting: str, n_files: int) -> list[str]:
    step = SETTINGS[setting]
    lines = [
        f"## `{setting}`: consumer step {step * 1e3:.0f} ms per batch of {BATCH} "
        f"(ideal epoch {n_files / BATCH * step:.1f} s, {BATCH / step:,.0f} elements/s)",
        "",
    ]
    headers = ["engine", "busy", "elements/s", "CPU-s per epoch", "CPU ms/element",
               "first batch s", "other load (cores)", "errors"]  # fmt: skip
    table = []
    for (s, engine), row in rows.items():
        if s != setting:
            continue
        scale = FRACTION.get(engine, 1)
        star = " *" if scale > 1 else ""
        if not row.runs:
            table.append([_label(engine) + star, *["-"] * 6, "; ".join(row.errors)[:200]])
            continue
        cpu_ms = [r["cpu_s"] / r["elements"] * 1e3 for r in row.runs]
        table.append([
            _label(engine) + star,
            _spread(row.values("busy"), lambda v: f"{v:.3f}"),
            _spread(row.values("per_s"), lambda v: f"{v:,.0f}"),
            _spread([v * scale for v in row.values("cpu_s")], lambda v: f"{v:.2f}"),
            _spread(cpu_ms, lambda v: f"{v:.2f}"),
            _spread(row.values("first_batch_s"), lambda v: f"{v:.2f}"),
            _spread(row.values("other_cores"), lambda v: f"{v:.2f}"),
            "; ".join(row.errors)[:200] or "-",
        ])  # fmt: skip
    lines += [md_table(headers, table), ""]
    lines += _targets(rows, setting)
    return lines


def _targets(rows: dict[tuple[str, str], Row], setting: str) -> list[str]:
    par = rows.get((setting, "paralela"))
    if par is None or not par.runs:
        return ["- paralela did not run: no targets.", ""]
    busy, rate, cpu = par.median("busy"), par.median("per_s"), par.median("cpu_s")
    assert busy is not None
    assert rate is not None
    assert cpu is not None
    out = ["Targets (issue 15), medians:", ""]
    if setting == "feasible":
        out.append(
            f"- Consumer busy ≥ {TARGET_BUSY} (2 cores can feed this consumer): paralela "
            f"{busy:.3f} (runs: {', '.join(f'{v:.3f}' for v in par.values('busy'))}): "
            f"**{'met' if busy >= TARGET_BUSY else 'MISSED'}**."
        )
    else:
        out.append(
            f"- Busy ≥ {TARGET_BUSY} is out of reach here for every engine (the consumer "
            f"needs {BATCH / SETTINGS[setting]:,.0f} elements/s); paralela's busy {busy:.3f}."
        )
    best = _best_torch(rows, setting)
    if best is not None:
        b_rate = best.median("per_s") or 0.0
        out.append(
            f"- Throughput ≥ the best DataLoader's (`{_label(best.engine)}`, "
            f"{b_rate:,.0f} elements/s): paralela {rate:,.0f} ({rate / b_rate:.2f}x): "
            f"**{'met' if rate >= b_rate * 0.99 else 'MISSED'}** (1 % tolerance)."
        )
    tf = rows.get((setting, "tf_autotune"))
    if tf is not None and tf.runs:
        t_rate, t_cpu = tf.median("per_s") or 0.0, tf.median("cpu_s") or 0.0
        same = abs(rate / t_rate - 1) <= 0.05 if t_rate else False
        out.append(
            f"- CPU-s < tf.data AUTOTUNE's for the same throughput: paralela {cpu:.2f} CPU-s "
            f"at {rate:,.0f} elements/s, tf.data {t_cpu:.2f} CPU-s at {t_rate:,.0f} "
            f"({cpu / t_cpu:.2f}x the CPU; throughput {rate / t_rate:.2f}x"
            + ("" if same else ", not the same throughput: compare CPU ms/element")
            + f"): **{'met' if cpu < t_cpu and rate >= t_rate * 0.95 else 'MISSED'}**."
        )
    out.append("")
    return out


def _paralela_section(rows: dict[tuple[str, str], Row], mode: dict[str, Any]) -> list[str]:
    lines = ["## paralela's stats and tuner", ""]
    for setting in mode["settings"]:
        row = rows.get((setting, "paralela"))
        if row is None or not row.runs:
            continue
        run = sorted(row.runs, key=lambda r: r["busy"])[len(row.runs) // 2]  # the median run
        lines += [
            f"`print(p.stats())` of the median-busy run, `{setting}` (busy {run['busy']:.3f}, "
            f"{run['per_s']:,.0f} elements/s; the stats' wall starts at `iter()`):",
            "",
            "```",
            run["stats_text"],
            "```",
            "",
            "Workers over time (`StageStats.history`: seconds from the epoch's `iter()`, "
            "workers), every run:",
            "",
        ]
        for i, r in enumerate(row.runs):
            for stage, hist in r["history"].items():
                if len(hist) > 0 and "map" in stage:
                    steps = ", ".join(f"{t:.2f}s→{n}" for t, n in hist)
                    lines.append(f"- run {i + 1}, `{stage}`: {steps}")
        lines.append("")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
