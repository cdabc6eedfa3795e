"""``measure``: run the same work at several worker counts and time it.

::

    target ──> function(workers) | function(workers, scale) | command with --workers N
    for each count (ascending): warm-up runs (untimed), then the timed repeats
        weak scaling: at the baseline count, also the reference runs (the work of every
        larger count on the baseline count) while its workers are warm
        function targets: the shared pools the count started are stopped after it
    ──> analyse() ──> ScalingResult ──> run_dir/scaling.json (+ scaling.png, logs/)
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paralela._config import config
from paralela._version import __version__
from paralela.backends import keeping_pools
from paralela.errors import ConfigError, add_note
from paralela.loading import load_function
from paralela.scaling._analysis import _oversubscription, analyse
from paralela.scaling._command import CommandTarget
from paralela.scaling._model import Caveat, RunRecord, ScalingError, ScalingResult

__all__ = ["default_workers", "machine_info", "measure"]

Log = Callable[[str], None]


def default_workers(usable_cpus: int) -> list[int]:
    """Powers of two up to the usable CPUs, and the usable count itself: 1, 2, 4, 6."""
    counts = [1]
    while counts[-1] * 2 <= usable_cpus:
        counts.append(counts[-1] * 2)
    if counts[-1] != usable_cpus:
        counts.append(usable_cpus)
    return counts if len(counts) > 1 else [1, 2]


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_info() -> tuple[dict[str, Any], int]:
    """What ran the measurement (for ``scaling.json``), and the usable CPU count."""
    from paralela.resources import detect

    res = detect()
    info = {
        "host": res.host,
        "usable_cpus": res.cpus.usable,
        "logical_cpus": res.cpus.logical,
        "cgroup_quota": res.cpus.cgroup_quota,
        "memory_bytes": res.memory.limit,
        "gpus": [g.name for g in res.gpus],
        "slurm_job_id": res.slurm.job_id if res.slurm is not None else None,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "paralela": __version__,
    }
    return info, res.cpus.usable


@dataclass
class _FunctionTarget:
    fn: Callable[..., Any]
    weak: bool
    kind: str = "function"
    command: list[str] | None = None

    @property
    def describe(self) -> str:
        module = getattr(self.fn, "__module__", None) or "?"
        return f"{module}:{getattr(self.fn, '__qualname__', repr(self.fn))}"

    def run(
        self, workers: int, scale: float, tag: str, label: str
    ) -> tuple[float, str | None, float | None]:
        """Call the function once; returns its wall seconds (and no run directory).

        Raises:
            ScalingError: the function raised (the exception is the cause).
        """
        args: tuple[Any, ...] = (workers, _plain(scale)) if self.weak else (workers,)
        with config(progress=False):
            t0 = time.perf_counter()
            try:
                self.fn(*args)
            except Exception as exc:
                raise ScalingError(
                    f"{self.describe} raised {type(exc).__name__} at {label}: {exc}. Fix the "
                    "target (it must run the same work at any worker count) and measure again."
                ) from exc
            return time.perf_counter() - t0, None, None


def _plain(scale: float) -> float:
    """``2`` rather than ``2.0`` where the scale is whole (``range(1000 * scale)``)."""
    return int(scale) if float(scale).is_integer() else scale


@contextlib.contextmanager
def _released_pools() -> Iterator[None]:
    """Stop the shared backends a run started (a 64-worker pool left idle holds 64
    processes' memory); backends that existed before are left alone."""
    from paralela import backends

    shared = backends._shared
    before = {id(b) for b in shared.values()}
    try:
        yield
    finally:
        for b in list(shared.values()):
            if id(b) not in before:
                backends.discard_backend(b)


@dataclass
class _Plan:
    counts: list[int]
    repeats: int
    warmup: int
    weak: bool
    reference: bool
    timer: str
    runs: list[RunRecord] = field(default_factory=list)


def _resolve(target: Any, weak: bool) -> _FunctionTarget | CommandTarget:
    if callable(target):
        return _FunctionTarget(target, weak)
    if isinstance(target, str) and ":" in target and not any(c.isspace() for c in target):
        return _FunctionTarget(load_function(target), weak)
    if isinstance(target, str):
        return CommandTarget(shlex.split(target), weak)
    if isinstance(target, Sequence) and target and all(isinstance(a, str) for a in target):
        return CommandTarget(list(target), weak)
    raise ConfigError(
        f"target must be a function, 'module:function', or a command (a list of "
        f"arguments or a string), got {type(target).__name__}."
    )


def _check_counts(workers: Sequence[int] | None, usable: int) -> list[int]:
    if workers is None:
        return default_workers(usable)
    counts = list(workers)
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"Worker counts must be positive integers, got {n!r}.")
    distinct = sorted(set(counts))
    if len(distinct) < 2:
        raise ConfigError(
            f"Measure at two worker counts at least (e.g. workers=[1, 2, 4, 8]), got {counts}."
        )
    return distinct


def measure(
    target: Callable[..., Any] | str | Sequence[str],
    workers: Sequence[int] | None = None,
    *,
    repeats: int = 3,
    weak: bool = False,
    reference: bool = True,
    warmup: int = 1,
    oversubscribe: bool = False,
    run_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    confidence: float = 0.95,
    plot: bool = True,
    timer: str = "wall",
    log: Log | None = None,
) -> ScalingResult:
    """Run the same work at each worker count, time it, and fit Amdahl's (or, with
    ``weak``, Gustafson's) law.

    Args:
        target: a function called as ``target(workers)`` (weak: ``target(workers,
            scale)``, the work to do being ``scale`` times the smallest count's) that
            runs the work with that many workers, e.g. ``paralela.map(..., workers=
            workers)``; or ``"module:function"``; or a command (a list of arguments,
            or a string split like a shell does) with ``{workers}`` (and, weak,
            ``{scale}``) where the counts go. A ``paralela ...`` command without
            ``{workers}`` gets ``--workers N`` (replaced where it has one) and runs
            with this Python (``python -m paralela``).
        workers: the counts (default: powers of two up to the usable CPUs).
        repeats: timed runs per count.
        weak: weak scaling: the work grows with the workers.
        reference: weak scaling: also time the work of each count on the smallest
            count (the measured scaled speed-up; costs about ``sum(n/b)`` baseline
            runs); ``False`` estimates it and makes the serial fraction a lower bound.
        warmup: untimed runs per count first (starts the workers, fills caches).
        oversubscribe: fit counts above the usable CPUs too (work that waits: I/O,
            sleep, GPUs); by default they are measured, flagged and left out of the fit.
        run_dir: save ``scaling.json``, ``scaling.png`` and command logs there; a
            ``paralela map --run-dir`` in the command gets a fresh ``runs/w{n}-r{k}``
            under it per run (else a temporary one), so that no run resumes another.
        timeout: seconds per command run (commands only).
        confidence: of the interval for the serial fraction.
        plot: draw ``scaling.png`` when saving (needs matplotlib).
        timer: ``"wall"`` times the call or the whole command (interpreter start-up,
            imports and worker start-up included: what a user waits for); ``"map"``
            times a ``paralela map --run-dir ...`` command's map alone, from its
            ``summary.json`` (start-up left out).
        log: called with a line per run, and with the oversubscription warning before
            anything runs (every caveat is in the result).

    Returns:
        The :class:`ScalingResult`, saved into ``run_dir`` when given.

    Raises:
        ConfigError: bad counts, repeats or target (before anything runs).
        ScalingError: the target raised, a command failed or timed out (the message
            has the tail of its log); the runs so far are lost. Ctrl-C stops the
            running command and propagates.
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}.")
    if timer not in ("wall", "map"):
        raise ConfigError(f"timer must be 'wall' or 'map', got {timer!r}.")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout must be positive seconds or None, got {timeout!r}.")
    say: Log = log or (lambda line: None)
    runner = _resolve(target, weak)
    machine, usable = machine_info()
    counts = _check_counts(workers, usable)
    base = counts[0]
    if isinstance(runner, CommandTarget):
        runner.validate(base, timer == "map")
    elif timer == "map":
        raise ConfigError(
            "timer='map' reads the summary.json of a `paralela map --run-dir ...` command; "
            "a function target is timed as a call (timer='wall')."
        )
    plan = _Plan(counts, repeats, warmup, weak, weak and reference, timer)
    out = Path(run_dir) if run_dir is not None else None
    early = _early_caveats(counts, usable, oversubscribe)
    for c in early:
        say(f"Warning: {c.message}")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_start = time.perf_counter()
    with _workspace(out) as space:
        if isinstance(runner, CommandTarget):
            runner.workspace = space
            runner.keep = out is not None
            runner.timeout = timeout
        with keeping_pools():  # each count's pool stays warm between its runs
            times, refs = _run_all(runner, plan, say)
    result = analyse(
        times,
        weak=weak,
        reference=refs if plan.reference else None,
        usable_cpus=usable,
        oversubscribe=oversubscribe,
        confidence=confidence,
        target=runner.describe,
        target_kind=runner.kind,
        machine=machine,
        runs=plan.runs,
    )
    result.created = started
    result.duration_seconds = time.perf_counter() - t_start
    result.repeats = repeats
    result.warmup = warmup
    result.command = runner.command
    result.timer = timer
    if out is not None:
        result.save(out, plot=plot)
    return result


def _early_caveats(counts: list[int], usable: int, oversubscribe: bool) -> list[Caveat]:
    return _oversubscription(counts, usable, oversubscribe)[1]


@contextlib.contextmanager
def _workspace(out: Path | None) -> Iterator[Path]:
    """The directory for logs and per-run map directories: ``out``, or a temporary one,
    removed afterwards unless the measurement failed: its error points at a log in it."""
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"Cannot create the run directory {out}: {exc.strerror or exc}. "
                "Pass a run_dir you can write to."
            ) from exc
        yield out
        return
    tmp = Path(tempfile.mkdtemp(prefix="paralela-scale-"))
    try:
        yield tmp
    except Exception as exc:
        add_note(exc, f"The logs and run directories are kept in {tmp}; delete it when done.")
        raise
    except BaseException:  # Ctrl-C: nothing failed that a log would explain
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)


def _run_all(
    runner: _FunctionTarget | CommandTarget, plan: _Plan, say: Log
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    base = plan.counts[0]
    times: dict[int, list[float]] = {}
    refs: dict[int, list[float]] = {}

    def one(workers: int, repeat: int, scale: float, reference: bool) -> float:
        label = ("reference run, " if reference else "") + f"workers={workers}"
        if plan.weak:
            label += f" scale={_plain(scale)}"
        label += f" repetition {repeat}/{plan.repeats}" if repeat else " warm-up"
        tag = f"ref{workers}-s{_plain(scale)}" if reference else f"w{workers}"
        tag += f"-r{repeat}" if repeat else "-warmup"
        seconds, run_dir, map_seconds = runner.run(workers, scale, tag, label)
        plan.runs.append(
            RunRecord(workers, repeat, seconds, scale, reference, run_dir, map_seconds)
        )
        if plan.timer == "wall":
            say(f"{label}: {seconds:.3f} s")
            return seconds
        if map_seconds is None:
            raise ScalingError(
                f"The map wrote no readable summary.json into its run directory at {label}, "
                "so its time is unknown (see the run's log). Use timer='wall'."
            )
        say(f"{label}: map {map_seconds:.3f} s (command {seconds:.3f} s)")
        return map_seconds

    for n in plan.counts:
        scale = n / base if plan.weak else 1.0
        # A function's shared pools are stopped after its count: warm for the repeats,
        # and no idle 64-worker pool holding memory while the next count runs.
        block = _released_pools() if isinstance(runner, _FunctionTarget) else None
        with block or contextlib.nullcontext():
            for _ in range(plan.warmup):
                one(n, 0, scale, False)
            times[n] = [one(n, k, scale, False) for k in range(1, plan.repeats + 1)]
            if plan.reference and n == base:
                for m in plan.counts[1:]:
                    refs[m] = [one(n, k, m / base, True) for k in range(1, plan.repeats + 1)]
    return times, refs
