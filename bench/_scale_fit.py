"""Fits, projections and the report of ``bench_scale.py``.

::

    scale.jsonl (one line per row and cluster size)
      -> fit(nodes, y): y = a + b*n by least squares (b's standard error), and the
         exponent k of y ~ c*n^k on log-log axes (its standard error): k + 2 se <= 1.15
         reads "at most linear", k <= 0.3 "about constant"
      -> projection to 1,000 nodes from the linear fit (a + 1000 b, +- its error)
      -> latency model: each Slurm command's median latency on this machine, and
         scontrol's against the array tasks it reports, for 10,000 array tasks
      -> results/scale.md (tables) and results/scale-<row>.svg (the curves)
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Figures fitted against the nodes, with how they read in the tables.
METRICS = (
    ("overhead_s", "wall - own work (s)"),
    ("first_result_s", "first result (s)"),
    ("driver_cpu_s", "driver CPU (s)"),
    ("commands_cpu_s", "Slurm commands' CPU (s)"),
    ("peak_rss_mb", "driver peak RSS (MB)"),
    ("files", "files left"),
    ("scheduler_calls", "scheduler calls"),
    ("calls_per_s", "scheduler calls/s"),
)


@dataclass(frozen=True)
class Fit:
    a: float
    b: float
    b_se: float
    k: float
    k_se: float

    def at(self, n: float) -> tuple[float, float]:
        """The linear fit's value at ``n``, and its error (from b's standard error)."""
        return self.a + self.b * n, self.b_se * n

    @property
    def reads(self) -> str:
        if math.isnan(self.k):
            return "n/a"
        if self.k + 2 * self.k_se <= 0.3:
            return "about constant"
        if self.k + 2 * self.k_se <= 1.15:
            return "at most linear"
        if self.k - 2 * self.k_se > 1.15:
            return "FASTER than linear"
        return "linear or worse (uncertain)"


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns a, b and b's standard error."""
    n = len(x)
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((xi - mx) ** 2 for xi in x)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / sxx
    a = my - b * mx
    if n <= 2:
        return a, b, float("nan")
    residual = sum((yi - a - b * xi) ** 2 for xi, yi in zip(x, y, strict=True))
    return a, b, math.sqrt(residual / (n - 2) / sxx)


def fit(nodes: Sequence[float], values: Sequence[float]) -> Fit:
    a, b, b_se = _line(nodes, values)
    positive = [(n, v) for n, v in zip(nodes, values, strict=True) if v > 0]
    if len(positive) >= 3:
        _, k, k_se = _line([math.log(n) for n, _ in positive], [math.log(v) for _, v in positive])
    else:
        k, k_se = float("nan"), float("nan")
    return Fit(a, b, b_se, k, k_se)


def _derived(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row["overhead_s"] = row["wall_s"] - row["own_work_s"]
    row["scheduler_calls"] = sum(row["calls"].values())
    return row


def _g(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _plot(name: str, rows: list[dict[str, Any]], out: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: files 5x smaller
        matplotlib.rcParams["svg.hashsalt"] = "scale"  # the same data, the same file
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    nodes = [r["nodes"] for r in rows]
    fig, axes = plt.subplots(2, 4, figsize=(14, 6))
    for ax, (key, label) in zip(axes.flat, METRICS, strict=True):
        ax.plot(nodes, [r[key] for r in rows], "o-")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)  # from zero: a flat curve must look flat
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("emulated nodes", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"bench_scale.py: {name} (2-core machine shared with others)")
    fig.tight_layout()
    path = out.parent / f"scale-{name}.svg"
    fig.savefig(path)
    plt.close(fig)
    return path.name


def latency_model(rows: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Each command's median latency (s) and how many calls it is measured on."""
    by_name: dict[str, list[float]] = {}
    for row in rows:
        for name, latencies in row.get("latency_s", {}).items():
            by_name.setdefault(name, []).extend(latencies)
    return {n: (statistics.median(v), len(v)) for n, v in sorted(by_name.items())}


def report_lines(rows: list[dict[str, Any]], out: Path) -> list[str]:
    lines: list[str] = []
    names = sorted({r["row"] for r in rows if r["row"].startswith("map")}, key=len)
    for name in names:
        mine = sorted((_derived(r) for r in rows if r["row"] == name), key=lambda r: r["nodes"])
        # The latest run of each size.
        by_size = {r["nodes"]: r for r in mine}
        mine = [by_size[n] for n in sorted(by_size)]
        first = mine[0]
        lines += [
            "",
            f"### `{name}`: {first['items']:,} items of {first['item_ms']:g} ms, "
            "one array task per node",
            "",
        ]
        table = []
        for r in mine:
            calls = ", ".join(f"{k} {v}" for k, v in sorted(r["calls"].items()))
            table.append(
                [
                    str(r["nodes"]),
                    f"{r['arrays']} / {r['array_tasks']}",
                    _g(r["wall_s"]),
                    _g(r["own_work_s"]),
                    _g(r["first_result_s"]),
                    _g(r["driver_cpu_s"]),
                    _g(r["commands_cpu_s"]),
                    _g(r["peak_rss_mb"]),
                    str(r["files"]),
                    calls,
                    _g(r["calls_per_s"]),
                    f"{r['load']:.1f}",
                ]
            )
        lines += _table(
            [
                "nodes", "arrays / tasks", "wall s", "own work s", "first result s",
                "driver CPU s", "commands CPU s", "peak RSS MB", "files", "calls",
                "calls/s", "load",
            ],
            table,
        )  # fmt: skip
        if len(mine) >= 3:
            nodes = [float(r["nodes"]) for r in mine]
            fits = []
            for key, label in METRICS:
                values = [float(r[key]) for r in mine]
                f = fit(nodes, values)
                at, err = f.at(1000)
                projected = f"{_g(at)} ± {_g(err)}"
                if f.b <= 0 or f.reads == "about constant":
                    projected = f"≈ {_g(max(values))} (no growth: the largest measured)"
                fits.append(
                    [
                        label,
                        f"{_g(f.a)} + {_g(f.b)}·n (± {_g(f.b_se)})",
                        f"{_g(f.k)} ± {_g(f.k_se)}",
                        f.reads,
                        projected,
                    ]
                )
            lines += [
                "",
                f"Fits over {len(mine)} sizes ({', '.join(str(int(n)) for n in nodes)} nodes):",
                "",
                *_table(
                    ["figure", "linear fit", "exponent k (y ~ n^k)", "grows", "at 1,000 nodes"],
                    fits,
                ),
            ]
        chart = _plot(name, mine, out)
        if chart:
            lines += ["", f"![{name}]({chart})"]
    lines += sweep_lines([r for r in rows if r["row"] == "sweep"])
    lines += lock_lines([r for r in rows if r["row"] == "sweep"])
    lines += launch_lines([r for r in rows if r["row"] == "launch"])
    lines += poll_lines([r for r in rows if r["row"] == "latency"])
    model = latency_model(rows)
    if model:
        lines += [
            "",
            "### Latency model: the Slurm commands on this machine",
            "",
            "Median latency of each command the drivers above ran (the wrappers' clock, "
            "start to end, process start-up included):",
            "",
            *_table(
                ["command", "median s", "calls measured"],
                [[n, _g(m), str(c)] for n, (m, c) in model.items()],
            ),
        ]
    return lines


def _lock(r: dict[str, Any]) -> str:
    if "lock_waits" not in r:
        return "not timed"
    return (
        f"{r['lock_waits']:,} holds, wait {_g(r['lock_wait_s'])} s "
        f"(max {_g(r['lock_wait_max_s'])}), held {_g(r['lock_hold_s'])} s"
    )


def sweep_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    by_size = {r["nodes"]: r for r in rows}
    table = []
    for n in sorted(by_size):
        r = by_size[n]
        problems = len(r["errors"]) + r["failed_trials"] + len(r["lock_messages"])
        table.append(
            [
                str(n),
                f"{r['drivers']} / {n * 2}",
                f"{r['trials_run']:,} / {r['trials_asked']:,}",
                _g(r["wall_s"]),
                _g(r["first_trial_s"])
                + (f" ({_g(r['first_trial_after_release_s'])})" if r.get("barrier") else ""),
                _g(r["span_s"]),
                _g(r["ideal_s"]),
                _g(r["trials_per_s"]),
                f"{r['slot_busy']:.0%}",
                str(problems),
                _lock(r),
                f"{r['load']:.1f}",
            ]
        )
    lines = [
        "",
        "### `sweep`: trials of 0.1-1 s, one per fake GPU, one driver per node on one SQLite study",
        "",
        "`span` runs from the first trial's start to the last one's end; `ideal` is the "
        "trials' own time over the slots; `busy` = ideal / span; `errors` counts drivers' "
        "exceptions, FAILed trials and 'database is locked' messages together; `budget lock` "
        "is the run directory's lock that every driver takes to reserve trials (the shared "
        "budget; since a7f5857 a trial per slot at each hold): holds, total and longest "
        "wait, total time held, over all drivers. `first trial s` counts from `srun`; "
        "where the drivers started together (a7f5857 on), from their release in brackets.",
        "",
        *_table(
            [
                "nodes",
                "drivers / slots",
                "trials run / asked",
                "wall s",
                "first trial s",
                "span s",
                "ideal s",
                "trials/s",
                "busy",
                "errors",
                "budget lock",
                "load",
            ],
            table,
        ),
    ]
    sizes = sorted(by_size)
    if len(sizes) >= 3:
        nodes = [float(n) for n in sizes]
        fits = []
        figures = [("trials_per_s", "trials/s"), ("first_trial_s", "first trial (s)")]
        if all("lock_waits" in by_size[n] for n in sizes):
            figures += [
                ("lock_wait_s", "budget lock: wait, all drivers (s)"),
                ("lock_wait_max_s", "budget lock: longest wait (s)"),
            ]
        for key, label in figures:
            f = fit(nodes, [float(by_size[n][key]) for n in sizes])
            fits.append([label, f"{_g(f.a)} + {_g(f.b)}·n (± {_g(f.b_se)})",
                         f"{_g(f.k)} ± {_g(f.k_se)}", f.reads])  # fmt: skip
        lines += ["", *_table(["figure", "linear fit", "exponent k", "grows"], fits)]
    return lines


# The sweep rows by the code they ran: each step starts at the time given (a row's
# "when"), the latest row of each size in each step is shown.
LOCK_STEPS = (
    ("before", ""),  # the lock held for the whole ask, the sampler included
    ("3c54153", "2026-11-27 13:28:12"),  # held to count and reserve (Optuna's queue pop)
    ("b98ef28", "2026-11-27 13:38:50"),  # the pop (reading the study back) only if one waits
    # a trial per slot reserved at each hold, the study opened outside the lock (3d8842e),
    # the drivers released together once imported (_scale_sweep._barrier; the rows of
    # 15:44-15:46 without it are superseded here, see the findings)
    ("a7f5857", "2026-11-27 15:43:00"),
    ("bc8e177", "2026-11-27 15:58:00"),  # the count reads only the trials not yet finished
)


def _step(row: dict[str, Any]) -> str:
    return [name for name, start in LOCK_STEPS if row["when"] >= start][-1]


def lock_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The budget lock at each step of its fix (``LOCK_STEPS``); the wait once every
    driver has opened the study where it was timed."""
    timed = [r for r in rows if "lock_waits" in r]
    steps = {name: {r["nodes"]: r for r in timed if _step(r) == name} for name, _ in LOCK_STEPS}
    shown = [name for name, _ in LOCK_STEPS if steps[name]]
    sizes = sorted(set.intersection(*(set(steps[name]) for name in shown))) if shown else []
    if len(shown) < 2 or not sizes:
        return []

    def cells(key: str, n: int, fmt: Any = _g) -> str:
        return " → ".join(fmt(steps[name][n][key]) for name in shown)

    def pct(x: float) -> str:
        return f"{x:.0%}"

    def steady(r: dict[str, Any]) -> str:
        if "steady_wait_s" not in r:
            return "not timed"
        return (
            f"{r['steady_asks']:,} holds, wait {_g(r['steady_wait_s'])} s "
            f"(max {_g(r['steady_wait_max_s'])}); open held {_g(r['open_hold_s'])} s"
        )

    table = []
    for n in sizes:
        last = steps[shown[-1]][n]
        problems = len(last["errors"]) + last["failed_trials"] + len(last["lock_messages"])
        table.append(
            [
                str(n),
                cells("lock_wait_s", n),
                cells("lock_wait_max_s", n),
                cells("lock_hold_s", n),
                cells("first_trial_s", n),
                cells("slot_busy", n, pct),
                cells("trials_per_s", n),
                str(problems),
                steady(last),
                " → ".join(f"{steps[name][n]['load']:.1f}" for name in shown),
            ]
        )
    lines = [
        "",
        "### The sweep's budget lock, step by step (" + " → ".join(shown) + ")",
        "",
        "`before`: each driver held the run directory's lock for its whole ask; `3c54153`: "
        "only to count the claimed trials and reserve one (the sampler after); `b98ef28`: "
        "the reserve no longer reads the study back (Optuna's queue pop) unless a queued "
        "trial waits; `a7f5857`: each hold reserves a trial per slot of the driver (one "
        "at a time once a wave or fewer is left), the study is opened outside the lock "
        "(3d8842e), and the drivers call sweep together once every one has imported "
        "(before, 64 interpreters starting on 2 cores spread the drivers' starts over "
        "~20 s; the lock's queue had lined them up); `bc8e177`: the count reads only the "
        "trials from the first unfinished one on (it read every trial). All drivers "
        "together. In the last step's `steady` column, the holds that began once every "
        "driver had made its first, and the time the drivers held the same lock to open "
        "(create) the SQLite study at start-up.",
        "",
        *_table(
            [
                "drivers",
                "total wait s",
                "longest wait s",
                "held s",
                "first trial s",
                "busy",
                "trials/s",
                "errors (last)",
                "last: steady state",
                "load",
            ],
            table,
        ),
    ]
    if len(sizes) >= 3:
        nodes = [float(n) for n in sizes]
        fits = []
        for name in shown:
            for key, label in (("lock_wait_s", "total wait"), ("lock_hold_s", "held")):
                f = fit(nodes, [max(float(steps[name][n][key]), 1e-6) for n in sizes])
                fits.append([f"{label}, {name}", f"{_g(f.k)} ± {_g(f.k_se)}", f.reads])
        last = steps[shown[-1]]
        if all("steady_wait_s" in last[n] for n in sizes):
            f = fit(nodes, [max(float(last[n]["steady_wait_s"]), 1e-6) for n in sizes])
            fits.append([f"steady-state wait, {shown[-1]}", f"{_g(f.k)} ± {_g(f.k_se)}", f.reads])
        lines += ["", *_table(["budget lock", "exponent k (y ~ n^k)", "grows"], fits)]
    return lines


def launch_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    by_size = {r["nodes"]: r for r in rows}
    table = []
    for n in sorted(by_size):
        t = by_size[n]["srun_to_all_ranks_s"]
        best_p, best_t = min(t["paralela"]), min(t["torchrun"])
        table.append(
            [
                str(n),
                ", ".join(_g(x) for x in t["paralela"]),
                ", ".join(_g(x) for x in t["torchrun"]),
                f"{best_p / best_t:.2f}",
                f"{by_size[n]['load']:.1f}",
            ]
        )
    return [
        "",
        "### `launch`: `srun` to every rank past its first all-reduce, one rank per node",
        "",
        *_table(
            ["ranks (= nodes)", "paralela launch s", "torchrun (c10d) s", "best / best", "load"],
            table,
        ),
    ]


def polls_in(run_s: float, lo: float = 1.0, hi: float = 15.0) -> int:
    """State polls the backend makes in a run of ``run_s`` seconds: every
    ``min(hi, max(lo, age / 10))`` seconds (``STATE_POLL_S`` in the backend)."""
    age, polls = 0.0, 0
    while age < run_s:
        age += min(hi, max(lo, age / 10))
        polls += 1
    return polls


def poll_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    tasks = rows[-1]["tasks"]
    table = [
        [
            f"{int(k):,}",
            _g(v["sbatch_s"]),
            _g(v["scontrol_s"]),
            f"{v['scontrol_bytes']:,}",
            _g(v["squeue_s"]),
            f"{v['squeue_bytes']:,}",
        ]
        for k, v in sorted(tasks.items(), key=lambda kv: int(kv[0]))
    ]
    lines = [
        "",
        f"### Latency model: one array of K no-op tasks on {rows[-1]['nodes']} nodes",
        "",
        "`sbatch` of the array, then, once every task ended, `scontrol show job` (what the "
        "backend asks per array and poll when there is no accounting) and `squeue -t all "
        "-r -j` of it (best of 3):",
        "",
        *_table(
            ["K tasks", "sbatch s", "scontrol s", "scontrol bytes", "squeue s", "squeue bytes"],
            table,
        ),
    ]
    sizes = sorted(int(k) for k in tasks)
    if len(sizes) >= 2:
        lo, hi = tasks[str(sizes[0])], tasks[str(sizes[-1])]
        per_task = (hi["scontrol_s"] - lo["scontrol_s"]) / (sizes[-1] - sizes[0])
        fixed = lo["scontrol_s"] - per_task * sizes[0]
        arrays = math.ceil(10_000 / 1001)
        poll_s = arrays * (fixed + per_task * 1001)
        hour = polls_in(3600)
        lines += [
            "",
            f"Projection to 10,000 array tasks (`MaxArraySize=1001`: {arrays} arrays, "
            f"{arrays} sbatch calls of ~{_g(hi['sbatch_s'])} s): scontrol costs "
            f"{_g(fixed)} s + {per_task * 1000:.3g} ms per task of the array (linear between "
            f"{sizes[0]:,} and {sizes[-1]:,} tasks), so one state poll of {arrays} full arrays "
            f"takes ~{_g(poll_s)} s of scontrol, and a one-hour map makes {hour} polls "
            f"(every 1 s at first, at most every 15 s): ~{_g(hour * poll_s)} s of scheduler "
            f"calls in an hour, {hour * arrays} calls, {hour * arrays / 3600:.2f} calls/s. "
            "With accounting (`sacct`, the usual case) it is one call per poll for every "
            "array together.",
        ]
    return lines


def write_report(results: Path, out: Path, preamble: str = "", epilogue: str = "") -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    body = report_lines(rows, out)
    out.write_text(preamble + "\n".join(body) + "\n" + epilogue)
    print(out.read_text())
