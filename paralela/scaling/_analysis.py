"""From timings per worker count to a :class:`ScalingResult`: points, fit, caveats.

::

    {workers: [seconds, ...]} ──> medians, speed-ups, efficiencies, Karp-Flatt
         │  counts above the usable CPUs: flagged, left out of the fit by default
         └──> fit_amdahl (strong) | fit_gustafson (weak) ──> predictions at 2..64x
    caveats: oversubscribed, noisy, superlinear, not monotonic, growing overhead + the fit's
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from paralela.errors import ConfigError
from paralela.scaling._fit import fit_amdahl, fit_gustafson, per_worker_cost, t_quantile
from paralela.scaling._model import (
    Caveat,
    Fit,
    Prediction,
    RunRecord,
    ScalingPoint,
    ScalingResult,
    median,
)

__all__ = ["PREDICTION_FACTORS", "analyse"]

# Predictions at these multiples of the largest count measured.
PREDICTION_FACTORS = (2, 4, 16, 64)
# Repetitions at one count that differ by more than this (slowest / fastest - 1): noisy.
NOISY_SPREAD = 0.25
# Efficiency above 1 + this is superlinear; a median this much slower than at a smaller
# count is "not monotonic". 5 %: below the spread of repetitions on a shared machine.
TOLERANCE = 0.05
# growing_overhead: the per-worker cost C of T(n) = A + B/n + C n is reported when it is
# above zero at this one-sided significance (t test: about one false alarm in 1000 on
# timings that follow Amdahl's law) and takes this share of the time at the largest count.
GROWTH_FALSE_ALARM = 0.001
GROWTH_SHARE = 0.05


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def _scale_value(n: int, base: int) -> float:
    return n / base


def _karp_flatt(speedup: float, ratio: float) -> float | None:
    """The serial fraction one point implies: ``(1/S - 1/n') / (1 - 1/n')``."""
    if ratio <= 1 or speedup <= 0:
        return None
    return (1.0 / speedup - 1.0 / ratio) / (1.0 - 1.0 / ratio)


def _oversubscription(
    counts: Sequence[int], usable_cpus: int | None, oversubscribe: bool
) -> tuple[set[int], list[Caveat]]:
    """The counts to leave out of the fit, and the caveat about them."""
    if usable_cpus is None:
        return set(), []
    over = [n for n in counts if n > usable_cpus]
    if not over:
        return set(), []
    within = [n for n in counts if n <= usable_cpus]
    shown = ", ".join(map(str, over))
    message = (
        f"This machine has {usable_cpus} usable CPU{'s' if usable_cpus != 1 else ''}; "
        f"counts above {usable_cpus} ({shown}) measure oversubscription: their workers "
        "share CPUs, so for CPU-bound work they show the CPU limit, not the serial "
        "fraction."
    )
    if oversubscribe:
        message += " They are fitted as asked (right for work that waits: I/O, sleep, GPUs)."
        return set(), [Caveat("oversubscribed", message)]
    if len(within) < 2:
        message += (
            " Fewer than two counts fit on this machine, so they are fitted anyway: "
            "read the serial fraction as the CPU limit."
        )
        return set(), [Caveat("oversubscribed", message)]
    message += (
        " They are left out of the fit (oversubscribe=True, or --oversubscribe, fits "
        "them: right for work that waits on I/O, sleeps or GPUs)."
    )
    return set(over), [Caveat("oversubscribed", message)]


def _data_caveats(
    points: list[ScalingPoint], weak: bool, base: int, strong_kf: bool
) -> list[Caveat]:
    caveats = []
    noisy = [p for p in points if len(p.times) > 1 and p.spread > NOISY_SPREAD]
    if noisy:
        worst = max(noisy, key=lambda p: p.spread)
        caveats.append(
            Caveat(
                "noisy",
                f"Repetitions differ by up to {worst.spread:.0%} (at {_workers(worst.workers)}): "
                "the machine is busy or the work is short. Use more repeats or longer work.",
            )
        )
    superlinear = [p for p in points if p.workers > base and p.efficiency > 1 + TOLERANCE]
    if superlinear:
        shown = ", ".join(f"{p.workers} ({p.efficiency:.0%})" for p in superlinear)
        caveats.append(
            Caveat(
                "superlinear",
                f"Efficiency above 100 % at {shown}: superlinear speed-up (the data fit "
                "in the caches of more cores, or the baseline run was slowed by start-up "
                "or a busy machine). Neither law models it.",
            )
        )
    if not weak:
        for before, after in itertools.pairwise(points):
            if after.median > before.median * (1 + TOLERANCE):
                caveats.append(
                    Caveat(
                        "not_monotonic",
                        f"{_workers(after.workers)} took longer than {_workers(before.workers)} "
                        f"({after.median:.3g} s against {before.median:.3g} s): adding "
                        "workers made it slower (oversubscription, contention, or a start-up "
                        "cost per worker).",
                    )
                )
                break
    fitted = [p for p in points if p.in_fit]
    cost = (
        per_worker_cost(
            [p.workers for p in fitted for _ in p.times], [t for p in fitted for t in p.times]
        )
        if strong_kf
        else None
    )
    if cost is not None and cost[0] > t_quantile(1 - GROWTH_FALSE_ALARM, cost[2]) * cost[1]:
        largest = fitted[-1]
        share = cost[0] * largest.workers / largest.median
        if share > GROWTH_SHARE:
            caveats.append(
                Caveat(
                    "growing_overhead",
                    f"A cost grows with the workers: about {cost[0] * 1000:.3g} ms per worker "
                    f"({share:.0%} of the time at {largest.workers} workers; fit of "
                    "T(n) = A + B/n + C·n). Start-up, communication or contention: Amdahl's "
                    "fixed serial part does not model it, so larger counts will do worse "
                    "than predicted.",
                )
            )
    return caveats


def analyse(
    times: Mapping[int, Sequence[float]],
    *,
    weak: bool = False,
    reference: Mapping[int, Sequence[float]] | None = None,
    usable_cpus: int | None = None,
    oversubscribe: bool = False,
    confidence: float = 0.95,
    target: str = "timings",
    target_kind: str = "timings",
    machine: Mapping[str, Any] | None = None,
    runs: Sequence[RunRecord] = (),
    extra_caveats: Sequence[Caveat] = (),
) -> ScalingResult:
    """Turn wall times per worker count into a :class:`ScalingResult` (no running).

    Use it for timings measured elsewhere (Slurm jobs, another tool). ``times`` maps a
    worker count to the seconds of each repetition; for ``weak=True`` the work at count
    ``n`` was ``n / min(times)`` times the smallest count's, and ``reference`` (the
    scaled work's times on the smallest count, per count) makes the scaled speed-ups
    measured instead of estimated.

    Args:
        times: ``{workers: [seconds, ...]}``, two counts at least.
        weak: weak scaling (Gustafson) instead of strong (Amdahl).
        reference: weak scaling: see above.
        usable_cpus: counts above it are flagged (and left out of the fit unless
            ``oversubscribe``); ``None``: not checked.
        oversubscribe: fit the counts above ``usable_cpus`` too.
        confidence: of the interval for the serial fraction.
        target: recorded as given.
        target_kind: recorded as given.
        machine: recorded as given.
        runs: recorded as given.
        extra_caveats: recorded as given.

    Raises:
        ConfigError: fewer than two counts, an empty or non-positive timing.
    """
    counts = _counts(times)
    base = counts[0]
    excluded, over_caveats = _oversubscription(counts, usable_cpus, oversubscribe)
    fitted = [n for n in counts if n not in excluded]
    fit = _fit(times, fitted, weak, reference, confidence, base)
    points = [
        _point(n, times, base, fit, weak, reference, usable_cpus, n not in excluded) for n in counts
    ]
    predictions = _predictions(fit, counts[-1])
    caveats = [
        *extra_caveats,
        *over_caveats,
        *_data_caveats(points, weak, base, strong_kf=not weak),
        *fit.caveats,
    ]
    return ScalingResult(
        mode="weak" if weak else "strong",
        target=target,
        target_kind=target_kind,
        points=points,
        fit=fit,
        predictions=predictions,
        caveats=_dedupe(caveats),
        machine=dict(machine or {}),
        baseline_workers=base,
        repeats=max(len(times[n]) for n in counts),
        runs=list(runs),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def _counts(times: Mapping[int, Sequence[float]]) -> list[int]:
    """The worker counts, in order; two at least, each with a timing."""
    counts = sorted(times)
    if len(counts) < 2:
        raise ConfigError(
            f"A scaling analysis needs timings at two worker counts at least, got "
            f"{counts or 'none'}."
        )
    for n in counts:
        if not times[n]:
            raise ConfigError(f"No timings for {n} workers; give at least one run per count.")
    return counts


def _fit(
    times: Mapping[int, Sequence[float]],
    fitted: list[int],
    weak: bool,
    reference: Mapping[int, Sequence[float]] | None,
    confidence: float,
    base: int,
) -> Fit:
    """Amdahl's (strong) or Gustafson's (weak) law fitted to the counts in ``fitted``."""
    fit_workers = [n for n in fitted for _ in times[n]]
    fit_times = [float(t) for n in fitted for t in times[n]]
    if weak:
        return fit_gustafson(
            fit_workers, fit_times, reference, confidence=confidence, baseline=base
        )
    return fit_amdahl(fit_workers, fit_times, confidence=confidence, baseline=base)


def _point(
    n: int,
    times: Mapping[int, Sequence[float]],
    base: int,
    fit: Fit,
    weak: bool,
    reference: Mapping[int, Sequence[float]] | None,
    usable_cpus: int | None,
    in_fit: bool,
) -> ScalingPoint:
    """The measured point at ``n`` workers: its speed-up over the baseline count,
    efficiency, Karp-Flatt (strong) or per-point Gustafson (weak) fraction."""
    base_median = median(times[base])
    med = median(times[n])
    ratio = n / base
    if not weak:
        speedup = base_median / med
    elif reference is not None and n != base:
        speedup = median(reference[n]) / med
    else:
        speedup = ratio * base_median / med
    if weak:  # the per-point Gustafson fraction: (n' - S) / (n' - 1)
        kf = (ratio - speedup) / (ratio - 1.0) if ratio > 1 else None
    else:
        kf = _karp_flatt(speedup, ratio)
    return ScalingPoint(
        workers=n,
        scale=_scale_value(n, base) if weak else 1.0,
        times=tuple(float(t) for t in times[n]),
        median=med,
        speedup=speedup,
        efficiency=speedup / ratio,
        predicted_speedup=fit.speedup(n),
        karp_flatt=kf,
        oversubscribed=usable_cpus is not None and n > usable_cpus,
        in_fit=in_fit,
        reference_times=tuple(reference.get(n, ())) if reference is not None else (),
    )


def _predictions(fit: Fit, largest: int) -> list[Prediction]:
    """Both laws' speed-ups, with their bands, at ``PREDICTION_FACTORS`` x ``largest``."""
    predictions = []
    for factor in PREDICTION_FACTORS:
        m = largest * factor
        a_lo, a_hi = fit.band(m, "amdahl")
        g_lo, g_hi = fit.band(m, "gustafson")
        predictions.append(
            Prediction(
                workers=m,
                amdahl=fit.speedup(m, "amdahl"),
                amdahl_low=a_lo,
                amdahl_high=a_hi,
                gustafson=fit.speedup(m, "gustafson"),
                gustafson_low=g_lo,
                gustafson_high=g_hi,
            )
        )
    return predictions


def _dedupe(caveats: list[Caveat]) -> list[Caveat]:
    seen: set[tuple[str, str]] = set()
    kept = []
    for c in caveats:
        if (c.code, c.message) not in seen:
            seen.add((c.code, c.message))
            kept.append(c)
    return kept
