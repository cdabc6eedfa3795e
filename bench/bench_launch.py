"""``paralela launch`` against ``torchrun --nproc-per-node 2``: start-up, DDP steps/s and
restart after a SIGKILL, on the same program (``bench/_launch_work.py``), in one run.

Targets (issue 12; reported, not asserted): start-up and restart no slower than
torchrun's, steps/s within 2 %.

    .venv/bin/python bench/bench_launch.py            # ~4-5 minutes on 2 cores
    .venv/bin/python bench/bench_launch.py --quick    # smoke run, under a minute
    .venv/bin/python bench/bench_launch.py --only startup,restart --reps 6

Both launchers are the console scripts next to this interpreter (``paralela``,
``torchrun``: the same torch). Each repetition runs the two launchers one after the other,
alternating (paralela, torchrun, paralela, torchrun, ...), and every figure is a ratio
paralela / torchrun per pair, so that drift on a shared machine hits both alike:

- start-up: wall clock from just before the command is started to the moment the last
  rank is past its first ``all_reduce`` (each rank writes ``time.time()`` there);
- steps/s: a 2-rank DDP training (gloo, CPU) of two MLPs, a fixed number of steps after
  a warm-up, timed between barriers by the ranks themselves (the slower rank counts);
- restart (``--max-restarts 1`` for both): once both ranks of attempt 0 are past their
  all-reduce, rank 1 is SIGKILLed; wall clock from the kill to the moment the last rank
  of attempt 1 is past its first all-reduce.

Results go to ``bench/results/launch.md`` (``--out FILE`` elsewhere); progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _harness import machine_lines, md_table, sig  # noqa: E402
from bench_sweep import machine_busy_s, wait_quiet  # noqa: E402

WORK = BENCH / "_launch_work.py"
BIN = Path(sys.executable).parent
TOOLS = ("paralela", "torchrun")
SECTIONS = ("startup", "train", "restart")
MODELS = ("digits", "wide")
RUN_TIMEOUT = 180.0  # seconds; one run takes 3-12 s
RESTART_TIMEOUT = 60.0  # seconds from the kill; a restart that recovers takes 1-3 s
SETTINGS: dict[str, dict[str, Any]] = {
    # reps: pairs (one run of each launcher) per section; steps: per model, after warm-up
    "full": {
        "reps": {"startup": 10, "train": 4, "restart": 6},
        "steps": {"digits": 1500, "wide": 300},
        "warmup": 30,
    },
    "quick": {
        "reps": {"startup": 2, "train": 2, "restart": 2},
        "steps": {"digits": 300, "wide": 60},
        "warmup": 10,
    },
}


class BenchError(RuntimeError):
    """A launcher run failed or hung: the benchmark stops with its output's tail."""


@dataclass
class Run:
    """One launcher command, start to exit, and what its ranks wrote."""

    tool: str
    t0: float  # time.time() just before the command started
    exit_s: float  # command start to exit
    stamps: list[dict[str, Any]]
    tree_cpu_s: float  # CPU of the launcher and its ranks (they are all waited for)
    other_cores: float  # CPU the rest of the machine used meanwhile, in cores
    kill_t: float | None = None  # restart runs: when rank 1 was SIGKILLed

    def ready(self, attempt: int) -> list[dict[str, Any]]:
        return [s for s in self.stamps if s["event"] == "ready" and s["attempt"] == attempt]


@dataclass
class Pairs:
    """Per figure: the paralela and torchrun values of each repetition, in order."""

    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    other: list[float] = field(default_factory=list)
    threads: set[tuple[str, int, str]] = field(default_factory=set)
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOOLS, 0))
    failures: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TOOLS})

    def add(self, tool: str, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.values.setdefault(name, {t: [] for t in TOOLS})[tool].append(value)


# --------------------------------------------------------------------------- runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(tool: str, program: Sequence[str], restarts: bool) -> list[str]:
    """The command a user would type, for 2 ranks on this machine."""
    again = ["--max-restarts", "1"] if restarts else []
    if tool == "paralela":
        return [str(BIN / "paralela"), "launch", "--nproc", "2", *again, *program]
    # torchrun's default static rendezvous on 127.0.0.1, on a free port rather than
    # 29500, which other torchrun users of this machine may hold.
    port = ["--master-port", str(_free_port())]
    return [str(BIN / "torchrun"), "--nproc-per-node", "2", *port, *again, *program]


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _read_stamps(directory: Path) -> list[dict[str, Any]]:
    stamps = []
    for path in sorted(directory.glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written right now
                stamps.append(json.loads(line))
    return stamps


def _wait_ready(stamps_dir: Path, proc: subprocess.Popen[bytes], deadline: float) -> int:
    """Poll until both ranks of attempt 0 are past their all-reduce; rank 1's pid."""
    while time.monotonic() < deadline and proc.poll() is None:
        ready = [s for s in _read_stamps(stamps_dir) if s["event"] == "ready"]
        if len(ready) == 2:
            return int(next(s["pid"] for s in ready if s["rank"] == 1))
        time.sleep(0.005)  # polling for an event; the figure is timed from the kill
    raise BenchError("attempt 0 never had both ranks ready")


def run_once(tool: str, mode: str, extra: Sequence[str], tmp: Path) -> Run:
    """Start one launcher command in a fresh directory (its cwd and TMPDIR), wait for it.

    ``mode == "restart"``: SIGKILL rank 1 once both ranks are past their all-reduce.
    """
    work = Path(tempfile.mkdtemp(prefix=f"{tool}-{mode}-", dir=tmp))
    stamps_dir = work / "stamps"
    stamps_dir.mkdir()
    program = [str(WORK), mode, "--stamps", str(stamps_dir), *extra]
    cmd = command(tool, program, restarts=mode == "restart")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONPATH")}
    env["TMPDIR"] = str(work)  # torchrun's log directories land here, not in /tmp
    log_path = work / "output.log"
    kill_t = None
    with open(log_path, "wb") as log:
        busy0, tree0 = machine_busy_s(), _children_cpu_s()
        t0 = time.time()
        p0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, cwd=work, start_new_session=True,
        )  # fmt: skip
        try:
            if mode == "restart":
                victim = _wait_ready(stamps_dir, proc, time.monotonic() + RUN_TIMEOUT)
                kill_t = time.time()
                os.kill(victim, signal.SIGKILL)
            code = proc.wait(timeout=RESTART_TIMEOUT if mode == "restart" else RUN_TIMEOUT)
        except (subprocess.TimeoutExpired, BenchError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_ranks_of(stamps_dir)
            what = f"did not exit within {exc.timeout:.0f} s" if isinstance(
                exc, subprocess.TimeoutExpired) else str(exc)  # fmt: skip
            if kill_t is not None:
                what += " of the kill"
            raise BenchError(f"{tool} {mode}: {what}\n{_tail(log_path)}") from exc
        exit_s = time.perf_counter() - p0
        tree = _children_cpu_s() - tree0
        other = max(0.0, machine_busy_s() - busy0 - tree) / exit_s
    if code != 0:
        raise BenchError(f"{tool} {mode}: exited {code}\n{' '.join(cmd)}\n{_tail(log_path)}")
    run = Run(tool, t0, exit_s, _read_stamps(stamps_dir), tree, other, kill_t)
    shutil.rmtree(work, ignore_errors=True)
    return run


def _kill_ranks_of(stamps_dir: Path) -> None:
    """SIGKILL every process of this run's program that outlived its launcher: a hung
    torchrun killed with its process group leaves ranks that run in sessions of their own."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(stamps_dir) in (p.info["cmdline"] or []):
                p.kill()


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


# ------------------------------------------------------------------------ figures


def startup_figures(run: Run) -> dict[str, float]:
    ready = run.ready(0)
    return {
        "startup": max(s["t"] for s in ready) - run.t0,
        "to_program": max(s["started"] for s in ready) - run.t0,
        "exit": run.exit_s,
        "cpu": run.tree_cpu_s,
    }


def train_figures(run: Run) -> dict[str, float]:
    figures = {}
    for model in MODELS:
        rates = [s["steps_per_s"] for s in run.stamps if s["event"] == f"train_{model}"]
        if len(rates) != 2:
            raise BenchError(f"{run.tool}: {len(rates)} rank(s) reported {model} steps/s")
        figures[f"steps_{model}"] = min(rates)  # the group goes at its slower rank's pace
    return figures


def restart_figures(run: Run) -> dict[str, float]:
    assert run.kill_t is not None
    again = run.ready(1)
    if len(again) != 2:
        raise BenchError(f"{run.tool}: {len(again)} rank(s) of attempt 1 reached the all-reduce")
    return {
        "restart": max(s["t"] for s in again) - run.kill_t,
        "restart_program": max(s["started"] for s in again) - run.kill_t,
    }


def _failure_reason(exc: BenchError) -> str:
    """The first line of a failed run's error, with the last exception its output shows
    (ports and pids replaced by N, so that the same failure is counted as one reason)."""
    lines = str(exc).splitlines()
    errors = [ln.strip() for ln in lines[1:] if re.match(r"\s*\w+(Error|Exception): ", ln)]
    reason = lines[0] + (f" ({errors[-1][:200]})" if errors else "")
    return re.sub(r"(?<=[:= ])\d{3,}", "N", reason)


def measure(
    section: str,
    reps: int,
    extra: Sequence[str],
    figures: Callable[[Run], dict[str, float]],
    tmp: Path,
    log: Callable[[str], None],
) -> Pairs:
    """``reps`` pairs of runs, paralela then torchrun, after one untimed run of each.

    In the restart section a launcher that does not recover (it fails or hangs) is a
    finding, not a broken benchmark: the failure is counted and reported, and the pair is
    left out of the ratios. Elsewhere a failed run stops the benchmark.
    """
    tolerate = section == "restart"
    pairs = Pairs()
    for tool in TOOLS:  # warm-up: the page cache, Python's bytecode caches
        try:
            run_once(tool, section, extra, tmp)
        except BenchError as exc:
            if not tolerate:
                raise
            log(f"  {section} warm-up {tool}: failed: {str(exc).splitlines()[0]}")
    for rep in range(reps):
        got: dict[str, tuple[Run, dict[str, float]]] = {}
        for tool in TOOLS:
            pairs.runs[tool] += 1
            try:
                run = run_once(tool, section, extra, tmp)
                values = figures(run)
            except BenchError as exc:
                if not tolerate:
                    raise
                reason = _failure_reason(exc)
                pairs.failures[tool].append(reason)
                log(f"  {section} {rep + 1}/{reps} {tool}: FAILED: {reason}")
                continue
            got[tool] = (run, values)
            shown = ", ".join(f"{k} {sig(v)}" for k, v in values.items())
            log(f"  {section} {rep + 1}/{reps} {tool}: {shown} (other load {run.other_cores:.2f})")
        if len(got) < len(TOOLS):
            continue
        for tool, (run, values) in got.items():
            pairs.add(tool, values)
            pairs.other.append(run.other_cores)
            for s in run.ready(0):
                pairs.threads.add((tool, s["threads"], ",".join(map(str, s["cpus"]))))
    return pairs


# ------------------------------------------------------------------------- report

# figure -> (what it is, unit, higher is better, target over the ratio paralela/torchrun)
FIGURES: dict[str, tuple[str, str, bool, str]] = {
    "startup": ("start-up: command to every rank past its first all-reduce", "s", False, "≤ 1"),
    "to_program": (
        "  of which: command to the program's first line (slowest rank)",
        "s",
        False,
        "",
    ),
    "exit": ("command start to exit (start-up, all-reduce, shut-down)", "s", False, ""),
    "cpu": ("CPU of the launcher and its ranks, start-up run", "s", False, ""),
    "steps_digits": ("steps/s, digits MLP (19 KB of gradients)", "steps/s", True, "0.98-1.02"),
    "steps_wide": ("steps/s, wide MLP (4.5 MB of gradients)", "steps/s", True, "0.98-1.02"),
    "restart": (
        "restart: SIGKILL of rank 1 to every new rank past its all-reduce",
        "s",
        False,
        "≤ 1",
    ),
    "restart_program": (
        "  of which: kill to the new program's first line (slowest rank)",
        "s",
        False,
        "",
    ),
}


def _spread(values: Sequence[float]) -> str:
    return f"{sig(statistics.median(values))} ({sig(min(values))}-{sig(max(values))})"


def _verdict(name: str, ratio: float) -> str:
    target = FIGURES[name][3]
    if not target:
        return ""
    ok = ratio <= 1.0 if target == "≤ 1" else abs(ratio - 1.0) <= 0.02
    return f"{target}: {'met' if ok else 'MISSED'}"


def table(results: dict[str, Pairs]) -> str:
    rows = []
    for section, pairs in results.items():
        if section == "restart":
            ok = {t: pairs.runs[t] - len(pairs.failures[t]) for t in TOOLS}
            rows.append(
                [
                    "restart: runs that recovered (new ranks past the all-reduce, exit 0, "
                    f"within {RESTART_TIMEOUT:.0f} s of the kill)",
                    "runs",
                    f"{ok['paralela']}/{pairs.runs['paralela']}",
                    f"{ok['torchrun']}/{pairs.runs['torchrun']}",
                    "",
                    str(pairs.runs["paralela"]),
                    "all: " + ("met" if not pairs.failures["paralela"] else "MISSED"),
                ]
            )
        for name, by_tool in pairs.values.items():
            what, unit, _, _ = FIGURES[name]
            ratios = [a / b for a, b in zip(by_tool["paralela"], by_tool["torchrun"], strict=True)]
            ratio = statistics.median(ratios)
            rows.append(
                [
                    what,
                    unit,
                    _spread(by_tool["paralela"]),
                    _spread(by_tool["torchrun"]),
                    f"**{ratio:.3f}** ({min(ratios):.3f}-{max(ratios):.3f})",
                    str(len(ratios)),
                    _verdict(name, ratio),
                ]
            )
    return md_table(
        [
            "figure",
            "unit",
            "paralela median (min-max)",
            "torchrun median (min-max)",
            "paralela / torchrun, median of pairs (min-max)",
            "pairs",
            "target",
        ],
        rows,
    )


def conditions(results: dict[str, Pairs]) -> list[str]:
    lines = []
    for section, pairs in results.items():
        seen = sorted(pairs.threads)
        ranks = "; ".join(
            f"{tool}: {threads} thread(s), CPUs {cpus}" for tool, threads, cpus in seen
        )
        load = (
            f"other load median {statistics.median(pairs.other):.2f} cores "
            f"(max {max(pairs.other):.2f})"
            if pairs.other
            else "no pair in which both launchers succeeded"
        )
        lines.append(f"- {section}: {load}; torch in each rank: {ranks or 'not recorded'}")
        for tool in TOOLS:
            for reason in sorted(set(pairs.failures[tool])):
                count = pairs.failures[tool].count(reason)
                lines.append(f"  - {tool} failed {count}x: {reason}")
    return lines


def report(results: dict[str, Pairs], args: argparse.Namespace, mode: dict[str, Any]) -> str:
    flags = " --quick" if args.quick else ""
    if args.only != ",".join(SECTIONS):
        flags += f" --only {args.only}"
    if args.reps:
        flags += f" --reps {args.reps}"
    steps = mode["steps"]
    return "\n".join(
        [
            "# `paralela launch` against `torchrun` (`bench_launch.py`)",
            "",
            f"Generated by `.venv/bin/python bench/bench_launch.py{flags}`. Issue 12's targets: "
            "start-up and restart no slower than torchrun's, steps/s within 2 %.",
            "",
            "## Machine and versions",
            "",
            *machine_lines(["paralela", "torch", "scikit-learn", "numpy"]),
            "",
            "## Method",
            "",
            "Both launchers start the same program, `bench/_launch_work.py`: plain "
            '`torch.distributed` (`init_process_group("gloo")` from the environment, one '
            "`all_reduce`), 2 ranks on this machine, each launcher with its defaults: "
            "`paralela launch --nproc 2 [--max-restarts 1] PROGRAM` and `torchrun "
            "--nproc-per-node 2 --master-port <free port> [--max-restarts 1] PROGRAM` (the "
            "default static rendezvous on 127.0.0.1; a free port rather than 29500). "
            "`OMP_NUM_THREADS` is unset in the benchmark's environment, so each launcher "
            "applies its own thread default (both give each rank 1 thread here; see below). "
            "Each run gets a fresh working directory (paralela's `paralela-runs/` and "
            "torchrun's `TMPDIR` go there).",
            "",
            "Each section runs one untimed run of each launcher, then repeated pairs in "
            "alternating order (paralela, torchrun, paralela, torchrun, ...). The ratio is "
            "taken per pair, and the table gives its median and range over the pairs.",
            "",
            "- start-up: from `time.time()` just before `Popen` of the launcher to the last "
            "rank's `time.time()` just after its first `all_reduce`. *Of which*: to the "
            "last rank's first line of the program (before torch is imported): the "
            "launcher's own share, the rest is the program importing torch and joining "
            "the group.",
            f"- steps/s: DDP over SGD, 32 images per rank and step: the digits demo's MLP "
            f"(64-64-10, `paralela/demos/_digits.py`) for {steps['digits']} steps, then "
            f"64-1024-1024-10 for {steps['wide']} steps, each after {mode['warmup']} "
            "untimed steps, timed between two barriers by the ranks; the slower rank's "
            "figure.",
            "- restart: `--max-restarts 1`; once both ranks of attempt 0 are past their "
            "all-reduce (they then wait), the benchmark SIGKILLs rank 1 and notes the "
            "time; the figure ends when the last rank of attempt 1 is past its first "
            "all-reduce. It covers noticing the death, stopping rank 0, starting the new "
            "ranks and their import of torch.",
            "- other load: CPU the rest of the machine used during each run (from "
            "/proc/stat, minus the launcher's process tree), in cores.",
            "",
            "**These numbers are noisy: a shared 2-core VM**, with other engineers' tests "
            "running at the same time; two ranks importing torch already fill both cores. "
            "Read the ratios, not the absolute times, and the range beside each median "
            "before a verdict: a ratio whose range straddles the target is within the "
            "noise.",
            "",
            "## Results",
            "",
            table(results),
            "",
            "Conditions:",
            "",
            *conditions(results),
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 pairs, fewer steps")
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections: startup,train,restart")
    ap.add_argument("--reps", type=int, default=0, help="pairs per section (default: by mode)")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        help="seconds to wait for an idle machine before each section",
    )
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "launch.md")
    args = ap.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or args.reps < 0:
        ap.error(f"--only takes some of {','.join(SECTIONS)} (got {args.only!r}); --reps >= 1")
    missing = [str(BIN / t) for t in TOOLS if not (BIN / t).exists()]
    if missing:
        ap.error(f"not found: {', '.join(missing)}. Run this with the interpreter of the venv "
                 "where paralela and torch are installed (.venv/bin/python).")  # fmt: skip
    mode = SETTINGS["quick" if args.quick else "full"]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    train = ["--train", ",".join(f"{m}={n}" for m, n in mode["steps"].items()),
             "--warmup", str(mode["warmup"])]  # fmt: skip
    how = {
        "startup": ((), startup_figures),
        "train": (train, train_figures),
        "restart": ((), restart_figures),
    }
    results: dict[str, Pairs] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        for section in sections:
            reps = args.reps or mode["reps"][section]
            log(f"{section}: {reps} pair(s)")
            wait_quiet(args.wait_quiet, log)
            extra, figures = how[section]
            results[section] = measure(section, reps, extra, figures, Path(tmp), log)
    log(f"done in {time.monotonic() - started:.0f} s")
    text = report(results, args, mode)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
