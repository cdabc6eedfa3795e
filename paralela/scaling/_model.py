"""What a scaling measurement holds, and ``scaling.json``: dataclasses and pure functions.

This module imports nothing heavy (no numpy, no matplotlib), so that a report can read
a ``scaling.json`` cheaply::

    run_dir/scaling.json   ScalingResult.to_dict(): points, fit, predictions, caveats,
                           machine (format documented in docs/scaling.md)
    run_dir/scaling.png    the speed-up curve with the fit (when matplotlib is installed)
    run_dir/logs/          one log per command run (command targets only)

Speed-ups are relative to the smallest worker count measured (``baseline_workers``,
normally 1). Both laws are written relative to that baseline ``b``, with ``s`` the
serial fraction::

    Amdahl     S(n) = (s + (1 - s) / b) / (s + (1 - s) / n)     fixed work
    Gustafson  S(n) = n/b - s (n/b - 1)                         work grows with n
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paralela.errors import ParalelaError

__all__ = [
    "FORMAT",
    "PLOT_FILE",
    "SCALING_FILE",
    "Caveat",
    "Fit",
    "Prediction",
    "RunRecord",
    "ScalingError",
    "ScalingPoint",
    "ScalingResult",
    "amdahl_speedup",
    "gustafson_speedup",
    "load_scaling",
]

FORMAT = 1
SCALING_FILE = "scaling.json"
PLOT_FILE = "scaling.png"
MODELS = ("amdahl", "gustafson")


class ScalingError(ParalelaError):
    """A scaling measurement cannot go on (the target failed or timed out), or a
    ``scaling.json`` cannot be read."""


def amdahl_speedup(s: float, n: float, baseline: float = 1.0) -> float:
    """Amdahl's speed-up on ``n`` workers over ``baseline`` workers, the work fixed.

    ``s`` is clamped to [0, 1]: a fit outside that range is outside the model.
    """
    s = min(max(s, 0.0), 1.0)
    return (s + (1.0 - s) / baseline) / (s + (1.0 - s) / n)


def gustafson_speedup(s: float, n: float, baseline: float = 1.0) -> float:
    """Gustafson's scaled speed-up on ``n`` workers over ``baseline`` workers, the work
    grown in proportion to the workers. ``s`` is clamped to [0, 1]."""
    s = min(max(s, 0.0), 1.0)
    ratio = n / baseline
    return ratio - s * (ratio - 1.0)


@dataclass(frozen=True)
class Caveat:
    """Something that makes the numbers less trustworthy, with a stable ``code``.

    Codes: ``oversubscribed``, ``too_few_points``, ``poor_fit``, ``out_of_model``,
    ``uncertain``, ``superlinear``, ``not_monotonic``, ``noisy``, ``growing_overhead``,
    ``estimated_reference`` (see docs/scaling.md).
    """

    code: str
    message: str


@dataclass(frozen=True)
class RunRecord:
    """One run of the target.

    Attributes:
        workers: the worker count it ran with.
        repeat: 1, 2, ... (0 for a warm-up run, whose time is not used).
        seconds: its wall time (the call, or the whole command).
        scale: the work's scale (weak scaling: ``workers / baseline``; else 1).
        reference: a weak-scaling reference run: the work of ``scale`` on the baseline
            count, timed to compute the scaled speed-up.
        run_dir: the ``paralela map`` run directory this run wrote, if any (relative
            to the scaling run directory when inside it).
        map_seconds: that map's own wall time, from its ``summary.json``.
    """

    workers: int
    repeat: int
    seconds: float
    scale: float = 1.0
    reference: bool = False
    run_dir: str | None = None
    map_seconds: float | None = None


@dataclass(frozen=True)
class ScalingPoint:
    """One worker count: its timings and what they give.

    Attributes:
        workers: the worker count.
        scale: the work's scale (1 for strong scaling).
        times: wall seconds of each repetition.
        median: their median.
        speedup: over the baseline count, from the medians; for weak scaling the scaled
            speed-up (the scaled work's time on the baseline count over its time here).
        efficiency: ``speedup / (workers / baseline)``.
        predicted_speedup: the fitted law's speed-up at this count (``None`` without a fit).
        karp_flatt: the serial fraction this point alone implies (Karp-Flatt metric,
            ``None`` at the baseline); a value that grows with the count means a cost
            that grows with the workers.
        oversubscribed: more workers than usable CPUs.
        in_fit: whether the fit used this point.
        reference_times: weak scaling with reference runs: the scaled work's times on
            the baseline count.
    """

    workers: int
    scale: float
    times: tuple[float, ...]
    median: float
    speedup: float
    efficiency: float
    predicted_speedup: float | None
    karp_flatt: float | None
    oversubscribed: bool
    in_fit: bool
    reference_times: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """Slowest over fastest repetition, minus 1 (0.2: they differ by 20 %)."""
        return max(self.times) / min(self.times) - 1.0 if min(self.times) > 0 else math.inf


@dataclass(frozen=True)
class Fit:
    """A law fitted to the timings.

    Attributes:
        model: ``"amdahl"`` (fixed work) or ``"gustafson"`` (work grows with workers).
        serial_fraction: the fitted ``s`` (may fall outside [0, 1]: see caveats).
        stderr: its standard error, ``None`` without residual degrees of freedom.
        ci_low, ci_high: the confidence interval (``confidence``, Student's t).
        confidence: 0.95 unless asked otherwise.
        t1_seconds: Amdahl: the fitted time on one worker.
        r_squared: goodness of fit (weighted, on times for Amdahl, on scaled speed-ups
            for Gustafson).
        n_points: timed runs fitted; ``n_counts``: distinct worker counts among them.
        dof: residual degrees of freedom.
        residuals: ``(workers, relative residual of the median)``: measured over
            fitted, minus 1.
        method: how it was fitted, in words.
        reference: Gustafson: ``"measured"`` (reference runs) or ``"estimated"``.
        baseline_workers: the count speed-ups are relative to.
        caveats: what makes this fit less trustworthy.
    """

    model: str
    serial_fraction: float
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    t1_seconds: float | None
    r_squared: float | None
    n_points: int
    n_counts: int
    dof: int
    residuals: tuple[tuple[int, float], ...]
    method: str
    reference: str | None = None
    baseline_workers: int = 1
    caveats: tuple[Caveat, ...] = ()

    def speedup(self, workers: float, model: str | None = None) -> float:
        """The speed-up the fit predicts at ``workers`` under ``model`` (default: its own)."""
        law = amdahl_speedup if (model or self.model) == "amdahl" else gustafson_speedup
        return law(self.serial_fraction, workers, self.baseline_workers)

    def band(self, workers: float, model: str | None = None) -> tuple[float, float]:
        """``(low, high)`` speed-up at ``workers`` from the ends of the confidence
        interval (the point value twice when there is no interval)."""
        law = amdahl_speedup if (model or self.model) == "amdahl" else gustafson_speedup
        lo = self.serial_fraction if self.ci_high is None else self.ci_high
        hi = self.serial_fraction if self.ci_low is None else self.ci_low
        b = self.baseline_workers
        return law(lo, workers, b), law(hi, workers, b)  # more serial: less speed-up

    @property
    def max_speedup(self) -> float | None:
        """Amdahl's ceiling over the baseline (infinite workers); ``None`` for s <= 0."""
        s = min(self.serial_fraction, 1.0)
        if s <= 0:
            return None
        return (s + (1.0 - s) / self.baseline_workers) / s

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "serial_fraction": self.serial_fraction,
            "stderr": self.stderr,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "confidence": self.confidence,
            "t1_seconds": self.t1_seconds,
            "r_squared": self.r_squared,
            "n_points": self.n_points,
            "n_counts": self.n_counts,
            "dof": self.dof,
            "residuals": [{"workers": n, "relative": r} for n, r in self.residuals],
            "method": self.method,
            "reference": self.reference,
            "baseline_workers": self.baseline_workers,
            "max_speedup": self.max_speedup,
            "caveats": [_caveat_dict(c) for c in self.caveats],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fit:
        return cls(
            model=data["model"],
            serial_fraction=float(data["serial_fraction"]),
            stderr=data.get("stderr"),
            ci_low=data.get("ci_low"),
            ci_high=data.get("ci_high"),
            confidence=float(data.get("confidence", 0.95)),
            t1_seconds=data.get("t1_seconds"),
            r_squared=data.get("r_squared"),
            n_points=int(data["n_points"]),
            n_counts=int(data["n_counts"]),
            dof=int(data["dof"]),
            residuals=tuple((int(r["workers"]), float(r["relative"])) for r in data["residuals"]),
            method=data.get("method", ""),
            reference=data.get("reference"),
            baseline_workers=int(data.get("baseline_workers", 1)),
            caveats=tuple(Caveat(c["code"], c["message"]) for c in data.get("caveats", [])),
        )


@dataclass(frozen=True)
class Prediction:
    """The speed-up predicted at a larger count, by both laws, with the band from the
    confidence interval of ``s``."""

    workers: int
    amdahl: float
    amdahl_low: float
    amdahl_high: float
    gustafson: float
    gustafson_low: float
    gustafson_high: float


def _caveat_dict(c: Caveat) -> dict[str, str]:
    return {"code": c.code, "message": c.message}


def _fmt_s(fit: Fit) -> str:
    if fit.stderr is None:
        return f"{fit.serial_fraction:.4f} (no uncertainty: too few runs)"
    interval = ""
    if fit.ci_low is not None and fit.ci_high is not None:
        interval = f", {fit.confidence:.0%} CI {fit.ci_low:.4f} .. {fit.ci_high:.4f}"
    return f"{fit.serial_fraction:.4f} ± {fit.stderr:.4f}{interval}"


@dataclass
class ScalingResult:
    """A scaling measurement: what :func:`paralela.scaling.measure` returns and
    ``scaling.json`` holds.

    Attributes:
        mode: ``"strong"`` (fixed work, Amdahl) or ``"weak"`` (work grows, Gustafson).
        target: what ran: ``module:function`` or the command line.
        target_kind: ``"function"``, ``"command"`` or ``"timings"`` (given, not run).
        points: one per worker count, in increasing order.
        fit: the fitted law (``None`` with fewer than two worker counts).
        predictions: speed-ups at 2, 4, 16 and 64 times the largest count.
        caveats: every warning about these numbers.
        machine: host, usable CPUs, memory, GPUs, Slurm job, Python and paralela versions.
        baseline_workers: the count speed-ups are relative to (the smallest measured).
        repeats, warmup: timed and untimed runs per count.
        runs: every run, warm-ups and references included.
        command: the command's arguments (command targets).
        timer: what the times are: ``"wall"`` (the call, or the whole command) or
            ``"map"`` (each command's map, from its ``summary.json``).
        created: when the measurement started (ISO 8601).
        duration_seconds: how long it took, every run included.
        run_dir: where it was saved (not stored in the file).
        plot_note: why :meth:`save` drew no PNG, if it did not.
    """

    mode: str
    target: str
    target_kind: str
    points: list[ScalingPoint]
    fit: Fit | None
    predictions: list[Prediction]
    caveats: list[Caveat]
    machine: dict[str, Any]
    baseline_workers: int = 1
    repeats: int = 1
    warmup: int = 0
    runs: list[RunRecord] = field(default_factory=list)
    command: list[str] | None = None
    timer: str = "wall"
    created: str = ""
    duration_seconds: float = 0.0
    run_dir: Path | None = None
    plot_note: str | None = field(default=None, repr=False, compare=False)

    @property
    def serial_fraction(self) -> float | None:
        """The fitted serial fraction, ``None`` without a fit."""
        return None if self.fit is None else self.fit.serial_fraction

    @property
    def workers(self) -> list[int]:
        return [p.workers for p in self.points]

    # -- text ---------------------------------------------------------------------------

    def table_rows(self) -> tuple[list[str], list[list[str]]]:
        """Column names and formatted rows, one per worker count (what ``table`` and
        the CLI print)."""
        b = self.baseline_workers
        law = "Amdahl" if self.mode == "strong" else "Gustafson"
        vs = f" vs {b}" if b != 1 else ""
        if self.mode == "weak":
            headers = ["workers", "scale", "median s", f"scaled speed-up{vs}", "weak eff."]
        else:
            headers = ["workers", "median s", f"speed-up{vs}", "efficiency"]
        headers += [f"{law} fit", "spread", "note"]
        rows = []
        for p in self.points:
            row = [str(p.workers)]
            if self.mode == "weak":
                row.append(f"{p.scale:g}")
                weak_eff = self.points[0].median / p.median if p.median > 0 else math.nan
                row += [f"{p.median:.4g}", f"{p.speedup:.2f}", f"{weak_eff:.0%}"]
            else:
                row += [f"{p.median:.4g}", f"{p.speedup:.2f}", f"{p.efficiency:.0%}"]
            row.append("-" if p.predicted_speedup is None else f"{p.predicted_speedup:.2f}")
            row.append(f"{p.spread:.0%}" if len(p.times) > 1 else "-")
            notes = []
            if p.oversubscribed:
                notes.append("over CPUs")
            if not p.in_fit:
                notes.append("not fitted")
            row.append(", ".join(notes))
            rows.append(row)
        return headers, rows

    def summary_lines(self) -> list[str]:
        """The fit, the predictions and the caveats, as lines of text."""
        lines = []
        fit = self.fit
        if fit is None:
            lines.append("No fit: measure at least two worker counts.")
        else:
            law = "Amdahl" if fit.model == "amdahl" else "Gustafson"
            r2 = "-" if fit.r_squared is None else f"{fit.r_squared:.3f}"
            lines.append(
                f"Serial fraction s = {_fmt_s(fit)} ({law} fit of {fit.n_points} runs "
                f"at {fit.n_counts} counts, R² {r2})"
            )
            if fit.model == "amdahl" and fit.max_speedup is not None:
                lines.append(f"Amdahl's ceiling: at most {fit.max_speedup:.1f}x, at any count")
        if self.predictions:
            name = "speed-up" if self.mode == "strong" else "scaled speed-up"
            vs = f" (vs {self.baseline_workers} workers)" if self.baseline_workers != 1 else ""
            parts = []
            for pr in self.predictions:
                if self.mode == "strong":
                    value, lo, hi = pr.amdahl, pr.amdahl_low, pr.amdahl_high
                else:
                    value, lo, hi = pr.gustafson, pr.gustafson_low, pr.gustafson_high
                band = f" ({lo:.1f}..{hi:.1f})" if hi - lo > 0.05 else ""
                parts.append(f"{pr.workers}: {value:.1f}x{band}")
            lines.append(f"Predicted {name}{vs}: " + ", ".join(parts))
        lines.extend(f"Warning: {c.message}" for c in self.caveats)
        return lines

    def table(self) -> str:
        """The measurement as plain text: a table, then the fit, predictions, caveats."""
        headers, rows = self.table_rows()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        last = len(headers) - 1  # the note column reads left to right

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.ljust(w) if i == last else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()

        out = [line(headers)] + [line(r) for r in rows]
        return "\n".join([*out, "", *self.summary_lines()])

    def __str__(self) -> str:
        return self.table()

    # -- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The content of ``scaling.json`` (format :data:`FORMAT`)."""
        return {
            "format": FORMAT,
            "kind": "scaling",
            "mode": self.mode,
            "target": self.target,
            "target_kind": self.target_kind,
            "command": self.command,
            "timer": self.timer,
            "created": self.created,
            "duration_seconds": self.duration_seconds,
            "baseline_workers": self.baseline_workers,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "machine": self.machine,
            "points": [
                {
                    "workers": p.workers,
                    "scale": p.scale,
                    "times": list(p.times),
                    "median": p.median,
                    "min": min(p.times),
                    "max": max(p.times),
                    "speedup": p.speedup,
                    "efficiency": p.efficiency,
                    "predicted_speedup": p.predicted_speedup,
                    "karp_flatt": p.karp_flatt,
                    "oversubscribed": p.oversubscribed,
                    "in_fit": p.in_fit,
                    "reference_times": list(p.reference_times),
                }
                for p in self.points
            ],
            "fit": None if self.fit is None else self.fit.to_dict(),
            "predictions": [vars(pr).copy() for pr in self.predictions],
            "caveats": [_caveat_dict(c) for c in self.caveats],
            "runs": [vars(r).copy() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalingResult:
        """Rebuild a result from :meth:`to_dict`'s output.

        Raises:
            ScalingError: not a scaling file, a newer format, or a field missing.
        """
        if data.get("kind") != "scaling":
            raise ScalingError("This JSON is not a paralela scaling result (no kind=scaling).")
        if int(data.get("format", 0)) > FORMAT:
            raise ScalingError(
                f"This scaling.json has format {data['format']}, newer than this paralela "
                f"reads ({FORMAT}). Upgrade paralela to read it."
            )
        try:
            return cls(
                mode=data["mode"],
                target=data["target"],
                target_kind=data["target_kind"],
                points=[
                    ScalingPoint(
                        workers=int(p["workers"]),
                        scale=float(p["scale"]),
                        times=tuple(float(t) for t in p["times"]),
                        median=float(p["median"]),
                        speedup=float(p["speedup"]),
                        efficiency=float(p["efficiency"]),
                        predicted_speedup=p.get("predicted_speedup"),
                        karp_flatt=p.get("karp_flatt"),
                        oversubscribed=bool(p["oversubscribed"]),
                        in_fit=bool(p.get("in_fit", True)),
                        reference_times=tuple(float(t) for t in p.get("reference_times", [])),
                    )
                    for p in data["points"]
                ],
                fit=None if data.get("fit") is None else Fit.from_dict(data["fit"]),
                predictions=[Prediction(**pr) for pr in data.get("predictions", [])],
                caveats=[Caveat(c["code"], c["message"]) for c in data.get("caveats", [])],
                machine=dict(data.get("machine", {})),
                baseline_workers=int(data.get("baseline_workers", 1)),
                repeats=int(data.get("repeats", 1)),
                warmup=int(data.get("warmup", 0)),
                runs=[RunRecord(**r) for r in data.get("runs", [])],
                command=data.get("command"),
                timer=data.get("timer", "wall"),
                created=data.get("created", ""),
                duration_seconds=float(data.get("duration_seconds", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScalingError(
                f"The scaling result is incomplete or malformed ({type(exc).__name__}: {exc})."
            ) from exc

    def save(self, run_dir: str | os.PathLike[str], plot: bool = True) -> list[Path]:
        """Write ``scaling.json`` (atomically) and, with ``plot``, ``scaling.png`` into
        ``run_dir`` (created if missing).

        Returns:
            The files written. Without matplotlib the PNG is left out and
            :attr:`plot_note` says why (``pip install 'paralela[sweep]'``).

        Raises:
            ScalingError: the directory cannot be written.
        """
        from paralela._files import atomic_write

        path = Path(run_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            data = json.dumps(self.to_dict(), indent=2, allow_nan=False).encode()
            atomic_write(path / SCALING_FILE, data)
        except OSError as exc:
            raise ScalingError(
                f"Cannot write {SCALING_FILE} into {path}: {exc.strerror or exc}. "
                "Pass a run directory you can write to."
            ) from exc
        self.run_dir = path
        written = [path / SCALING_FILE]
        self.plot_note = None
        if plot:
            from paralela.scaling._plot import plot_scaling

            png, note = plot_scaling(self, path / PLOT_FILE)
            if png is not None:
                written.append(png)
            self.plot_note = note
        return written


def load_scaling(path: str | os.PathLike[str]) -> ScalingResult:
    """Read a ``scaling.json``: give the file, or the run directory that holds it.

    Raises:
        ScalingError: no such file, not JSON, not a scaling result, or a newer format.
    """
    p = Path(path)
    file = p / SCALING_FILE if p.is_dir() else p
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScalingError(
            f"No {SCALING_FILE} at {p}. Run `paralela scale --run-dir {p} ...` to make one."
        ) from None
    except (OSError, ValueError) as exc:
        raise ScalingError(f"Cannot read {file}: {exc}.") from exc
    if not isinstance(data, dict):
        raise ScalingError(f"{file} does not hold a JSON object.")
    result = ScalingResult.from_dict(data)
    result.run_dir = file.parent
    return result


def median(values: Sequence[float]) -> float:
    """The median (no statistics import needed for one line)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
