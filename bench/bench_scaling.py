"""The cost of recording timings: ``paralela.map`` of trivial items with and without the
per-chunk ``ChunkTiming`` records (``PARALELA_RECORD_TIMINGS=0`` turns them off).

Target: < 2 % overhead on 100,000 trivial items (issue 6).

Both variants run in this one process, on the same warm 2-worker pool, interleaved in
ABBA order (on, off, off, on, ...) so that drift on a shared machine hits both alike.
Four figures:

- best-of: the fastest sample of each variant (the least disturbed);
- paired: the median of the per-pair ratios on/off, with a bootstrap 95 % interval;
- driver CPU: the CPU time of the driver process, where the recording happens;
- direct: the cost of the recording step itself (``ChunkTiming`` built and appended,
  plus ``MapSummary.finish`` over the timeline), timed in a tight loop, times the
  chunks a map makes, over the map's wall time. It has no scheduling noise, so it
  is the figure to trust when the other two drown in the machine's noise.

    .venv-bench/bin/python bench/bench_scaling.py               # ~1 minute
    .venv-bench/bin/python bench/bench_scaling.py --reps 50     # quicker, noisier

Results go to ``bench/results/scaling.md`` (``--out FILE`` elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from _harness import machine_lines, md_table, sig  # noqa: E402
from _work import inc  # noqa: E402

import paralela  # noqa: E402
from paralela.mapping._summary import RECORD_TIMINGS_ENV, ChunkTiming, MapSummary  # noqa: E402

ITEMS = 100_000
WORKERS = 2
TARGET = 0.02
BOOTSTRAP = 2000
SAMPLE_SECONDS = 0.1


def _cpu_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def run_map(record: bool, chunksize: int | str, items: range) -> int:
    """One map, checked; returns its chunk count."""
    if record:
        os.environ.pop(RECORD_TIMINGS_ENV, None)
    else:
        os.environ[RECORD_TIMINGS_ENV] = "0"
    result = paralela.map(inc, items, workers=WORKERS, chunksize=chunksize, progress=False)  # type: ignore[arg-type]
    if result[0] != items[0] + 1 or result[-1] != items[-1] + 1 or len(result) != len(items):
        raise SystemExit("wrong results")
    if record != bool(result.summary.timeline):
        raise SystemExit(f"the switch did not work: record={record}")
    return result.summary.chunks


def run_sample(
    record: bool, chunksize: int | str, batch: int, rep: int
) -> tuple[float, float, int]:
    """``batch`` maps in a row: wall and driver CPU seconds per map, chunks per map."""
    chunks = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(batch):
        start = (rep * batch + k) * 7  # a different input range each time, as bench_map does
        chunks += run_map(record, chunksize, range(start, start + ITEMS))
    return (
        (time.perf_counter() - t0) / batch,
        (time.process_time() - c0) / batch,
        chunks // batch,
    )


def record_cost(chunks: int, loops: int = 200) -> float:
    """Seconds to record ``chunks`` chunk timings and summarise them (best of ``loops``)."""
    best = float("inf")
    for _ in range(loops):
        summary = MapSummary()
        t0 = time.perf_counter()
        for i in range(chunks):
            summary.timeline.append(
                ChunkTiming(i * 100, 100, 1.0, 2.0, str(1000 + i % WORKERS), "host", 1)
            )
        summary.finish(1.0)
        best = min(best, time.perf_counter() - t0)
    # The same loop without the records: the bare loop and finish() over nothing.
    bare = float("inf")
    for _ in range(loops):
        summary = MapSummary()
        t0 = time.perf_counter()
        for _i in range(chunks):
            pass
        summary.finish(1.0)
        bare = min(bare, time.perf_counter() - t0)
    return max(best - bare, 0.0)


def bootstrap_ci(values: list[float], stat: Callable[[list[float]], float]) -> tuple[float, float]:
    rng = random.Random(6)
    samples = sorted(stat([rng.choice(values) for _ in values]) for _ in range(BOOTSTRAP))
    return samples[int(0.025 * BOOTSTRAP)], samples[int(0.975 * BOOTSTRAP) - 1]


def measure_row(chunksize: int | str, reps: int) -> dict[str, Any]:
    for _ in range(3):  # warm the pool, the chunker and the caches, both ways
        run_map(True, chunksize, range(ITEMS))
        run_map(False, chunksize, range(ITEMS))
    one, _, _ = run_sample(False, chunksize, 3, 0)
    # Several maps per sample, so that a sample lasts ~0.1 s: a single 10 ms map is
    # at the mercy of one scheduler tick.
    batch = max(1, round(SAMPLE_SECONDS / one))
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    chunks: list[int] = []
    busy0, own0, t0 = _cpu_busy(), _own_cpu(), time.perf_counter()
    for rep in range(reps):
        order = (True, False) if rep % 2 == 0 else (False, True)  # ABBA
        for record in order:
            wall, cpu, n_chunks = run_sample(record, chunksize, batch, rep)
            (on if record else off).append((wall, cpu))
            if record:
                chunks.append(n_chunks)
    wall_total = time.perf_counter() - t0
    # Clamped: /proc/stat and psutil count CPU ticks at different moments.
    other = max(0.0, (_cpu_busy() - busy0 - (_own_cpu() - own0)) / wall_total)
    os.environ.pop(RECORD_TIMINGS_ENV, None)
    ratios = [a[0] / b[0] for a, b in zip(on, off, strict=True)]
    cpu_diffs = [a[1] - b[1] for a, b in zip(on, off, strict=True)]
    best_off = min(w for w, _ in off)
    mean_chunks = statistics.mean(chunks)
    direct = record_cost(round(mean_chunks))
    return {
        "chunksize": chunksize,
        "batch": batch,
        "chunks": mean_chunks,
        "best_on": min(w for w, _ in on),
        "best_off": best_off,
        "median_on": statistics.median(w for w, _ in on),
        "median_off": statistics.median(w for w, _ in off),
        "paired": statistics.median(ratios) - 1,
        "paired_ci": tuple(r - 1 for r in bootstrap_ci(ratios, statistics.median)),
        "cpu_on": statistics.median(c for _, c in on),
        "cpu_off": statistics.median(c for _, c in off),
        "cpu_overhead": statistics.median(cpu_diffs) / best_off,
        "cpu_ci": tuple(d / best_off for d in bootstrap_ci(cpu_diffs, statistics.median)),
        "direct_s": direct,
        "direct": direct / best_off,
        "spread_off": max(w for w, _ in off) / best_off - 1,
        "other_load": other,
        "reps": reps,
    }


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def verdict(row: dict[str, Any]) -> str:
    """met: the direct cost and the upper ends of both in-place intervals (wall, driver
    CPU) under the target; MISSED: the direct cost, or the lower end of an in-place
    interval, at or over it; else met by the direct cost, the intervals too wide."""
    lows = (row["paired_ci"][0], row["cpu_ci"][0])
    highs = (row["paired_ci"][1], row["cpu_ci"][1])
    if row["direct"] >= TARGET or max(lows) >= TARGET:
        return "MISSED"
    if max(highs) < TARGET:
        return "met"
    return "met by the direct cost (in-place intervals reach past 2 %: noise)"


def reading(rows: list[dict[str, Any]]) -> list[str]:
    auto, many = rows
    per_chunk = many["direct_s"] / many["chunks"] * 1e6
    return [
        f'- The issue\'s workload (default `chunksize="auto"`, {auto["chunks"]:.0f} chunks '
        f"per map): recording costs {pct(auto['direct'])} directly and "
        f"{pct(auto['cpu_overhead'])} in driver CPU; the wall-clock pairs put it at "
        f"{pct(auto['paired'])} ({pct(auto['paired_ci'][0])} .. "
        f"{pct(auto['paired_ci'][1])}). Target < 2 %: {verdict(auto)}.",
        f"- Recording one chunk costs about {per_chunk:.1f} µs on its own (a frozen "
        "`ChunkTiming` built and appended, its share of `MapSummary.finish`), so its "
        "share of a map is that times the chunks over the map's time: negligible with "
        "automatic chunking, which keeps chunks near 50 ms.",
        f"- Stress case, {many['chunks']:,.0f} chunks of 100 trivial items: "
        f"{pct(many['direct'])} directly, {pct(many['paired'])} by wall-clock pairs "
        f"({pct(many['paired_ci'][0])} .. {pct(many['paired_ci'][1])}), "
        f"{pct(many['cpu_overhead'])} ({pct(many['cpu_ci'][0])} .. {pct(many['cpu_ci'][1])}) "
        f"in driver CPU: {verdict(many)}. Here the driver is the bottleneck (its threads "
        "pickle 1,000 chunks a map), so whatever it adds shows in the wall time. "
        "`PARALELA_RECORD_TIMINGS=0` removes the records for such runs.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=150, help="pairs per row (default 150)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "scaling.md")
    args = parser.parse_args()
    rows = []
    for chunksize in ("auto", 100):
        print(f"chunksize={chunksize}: {args.reps} pairs ...", file=sys.stderr, flush=True)
        rows.append(measure_row(chunksize, args.reps))
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    table = md_table(
        [
            "chunksize",
            "maps/sample",
            "chunks/map",
            "best on s",
            "best off s",
            "best-of overhead",
            "median on s",
            "median off s",
            "paired overhead (95% CI)",
            "driver CPU on / off ms",
            "driver CPU overhead (95% CI)",
            "direct cost",
            "direct overhead",
            "spread (off)",
            "other load",
            "target < 2%",
        ],
        [
            [
                f"`{r['chunksize']}`",
                str(r["batch"]),
                sig(r["chunks"]),
                sig(r["best_on"]),
                sig(r["best_off"]),
                pct(r["best_on"] / r["best_off"] - 1),
                sig(r["median_on"]),
                sig(r["median_off"]),
                f"{pct(r['paired'])} ({pct(r['paired_ci'][0])} .. {pct(r['paired_ci'][1])})",
                f"{sig(r['cpu_on'] * 1e3)} / {sig(r['cpu_off'] * 1e3)}",
                f"{pct(r['cpu_overhead'])} ({pct(r['cpu_ci'][0])} .. {pct(r['cpu_ci'][1])})",
                f"{sig(r['direct_s'] * 1e6)} µs",
                pct(r["direct"]),
                f"{100 * r['spread_off']:.0f}%",
                f"{r['other_load']:.2f} cores",
                verdict(r),
            ]
            for r in rows
        ],
    )
    text = "\n".join(
        [
            "# The cost of recording timings (`bench_scaling.py`)",
            "",
            "Generated by `python bench/bench_scaling.py"
            + (f" --reps {args.reps}" if args.reps != 150 else "")
            + "`. Issue 6's target: recording each chunk's start, end, worker and host "
            "costs a map of 100,000 trivial items less than 2 %.",
            "",
            "## Machine and versions",
            "",
            *machine_lines(["paralela", "cloudpickle", "psutil"]),
            "",
            "## Method",
            "",
            f"`paralela.map(inc, range(100_000), workers={WORKERS}, progress=False)` "
            "(`inc(x) = x + 1`, `bench/_work.py`), processes backend, one warm pool for "
            "both variants in one process. *on*: the default, every chunk's `ChunkTiming` "
            f"recorded; *off*: `{RECORD_TIMINGS_ENV}=0` (read once per map call). 3 "
            f"warm-up pairs, then {rows[0]['reps']} pairs of samples per row in ABBA order; "
            f"a sample is as many maps in a row as last ~{SAMPLE_SECONDS} s "
            "(`maps/sample`), each on a different input range; every result checked. "
            "Times are per map.",
            "",
            "- best-of overhead: fastest *on* over fastest *off*, minus 1.",
            "- paired overhead: median over pairs of *on*/*off* - 1, with a bootstrap "
            f"95 % interval ({BOOTSTRAP} resamples).",
            "- driver CPU: the driver process's CPU time per map (`time.process_time`: all "
            "its threads, the workers excluded), median per variant; its overhead is the "
            "median over pairs of the difference, over the best *off* wall time, with a "
            "bootstrap interval. The recording runs in the driver, so this is its cost in "
            "place (garbage collection included); contention on a busy machine makes it "
            "noisy too.",
            "- direct cost: building and appending the `ChunkTiming`s of one map plus "
            "`MapSummary.finish` over them, timed alone in a loop (best of 200, minus the "
            "empty loop); direct overhead = direct cost / best *off* map time.",
            "- other load: CPU the rest of the machine used while the row ran, in cores "
            "(from /proc/stat, minus this process and its workers).",
            f"- `chunksize=100` makes {rows[1]['chunks'] / rows[0]['chunks']:.0f} times more "
            "chunks than `auto` (which aims at ~50 ms of work per chunk) for these items: a "
            "stress case for a per-chunk cost, not the issue's workload.",
            "",
            "**This is a shared, noisy 2-core VM** (other people's tests run on it at the "
            "same time): single map times vary by tens of per cent from one repetition to "
            "the next (the `spread` column), far more than the effect measured. That is why "
            "the pairs are many and interleaved, and why the direct cost, which no "
            "scheduling noise touches, is measured too. Verdict: *met* when the direct "
            "overhead and the upper ends of both in-place intervals (wall, driver CPU) are "
            "under 2 %; *MISSED* when the direct overhead or the lower end of an in-place "
            "interval is 2 % or more; otherwise met by the direct cost, with the in-place "
            "intervals too wide to confirm it.",
            "",
            "## Results",
            "",
            table,
            "",
            "## Reading",
            "",
            *reading(rows),
            "",
        ]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
