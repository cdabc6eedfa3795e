"""Amdahl's and Gustafson's laws fitted to timings, with the uncertainty of ``s``.

Plain Python (no numpy, no scipy): both fits are weighted linear least squares in two
(Amdahl) or one (Gustafson) parameters, solved in closed form::

    Amdahl     T(n) = A + B/n              s = A / (A + B),  T1 = A + B
    Gustafson  n' - S(n) = s (n' - 1)      n' = n / baseline, S the scaled speed-up

Every repetition is a data point; the weights are 1 / median(count)^2 because timing
noise grows with the time. The standard error comes from the residuals (the noise is
estimated, not assumed), through the covariance of the parameters and, for Amdahl's
``s``, the delta method; the interval uses Student's t with the residual degrees of
freedom.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

from paralela.errors import ConfigError
from paralela.scaling._model import Caveat, Fit, gustafson_speedup, median

__all__ = ["fit_amdahl", "fit_gustafson", "per_worker_cost", "t_quantile"]

# A fit whose median at some count is further than MAX_RESIDUAL from the fitted curve
# (relative), or whose weighted R^2 falls below MIN_R_SQUARED (repetitions scattered as
# widely as the counts differ), gets a poor_fit caveat. Timings that follow the law on a
# quiet machine give R^2 > 0.99 and residuals of a few per cent.
MIN_R_SQUARED = 0.95
MAX_RESIDUAL = 0.10


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (e.g. ``p=0.975`` for a two-sided 95 % interval).

    Exact for 1 and 2 degrees of freedom; from 3 on, the Cornish-Fisher expansion
    around the normal quantile (Abramowitz & Stegun 26.7.5): within 0.2 % of the exact
    value at 3 degrees of freedom for p <= 0.975, and closer with more.
    """
    if not 0.0 < p < 1.0 or dof < 1:
        raise ConfigError(f"t_quantile needs 0 < p < 1 and dof >= 1, got p={p}, dof={dof}.")
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        a = 2.0 * p - 1.0
        return a * math.sqrt(2.0 / (1.0 - a * a))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    v = float(dof)
    return z + g1 / v + g2 / v**2 + g3 / v**3 + g4 / v**4


def _check(workers: Sequence[int], times: Sequence[float], what: str) -> dict[int, list[float]]:
    if len(workers) != len(times):
        raise ConfigError(
            f"{what}: workers and times must have the same length (one entry per run), "
            f"got {len(workers)} and {len(times)}."
        )
    by_count: dict[int, list[float]] = {}
    for n, t in zip(workers, times, strict=True):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{what}: worker counts must be positive integers, got {n!r}.")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ConfigError(f"{what}: times must be positive seconds, got {t!r} at {n}.")
        by_count.setdefault(n, []).append(float(t))
    if len(by_count) < 2:
        raise ConfigError(
            f"{what} needs timings at two worker counts at least, got "
            f"{sorted(by_count) or 'none'}. Measure e.g. workers=[1, 2, 4, 8]."
        )
    return dict(sorted(by_count.items()))


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def _interval(
    s: float, se: float | None, dof: int, confidence: float
) -> tuple[float | None, float | None]:
    if se is None or dof < 1:
        return None, None
    half = t_quantile(0.5 + confidence / 2.0, dof) * se
    return s - half, s + half


def _fit_caveats(
    model: str,
    s: float,
    ci: tuple[float | None, float | None],
    r_squared: float | None,
    residuals: Sequence[tuple[int, float]],
    n_counts: int,
    stderr: float | None,
) -> list[Caveat]:
    caveats = []
    law = "Amdahl" if model == "amdahl" else "Gustafson"
    if n_counts < 3:
        caveats.append(
            Caveat(
                "too_few_points",
                f"Only {n_counts} worker counts: any curve through two points fits, so the "
                f"fit cannot show whether {law}'s law holds. Measure at least three counts.",
            )
        )
    if stderr is None:
        caveats.append(
            Caveat(
                "too_few_points",
                "One run per count at two counts leaves no residual to estimate the noise: "
                "the serial fraction has no uncertainty. Use repeats of 3 or more.",
            )
        )
    worst = max(residuals, key=lambda r: abs(r[1]))
    if abs(worst[1]) > MAX_RESIDUAL:
        r2 = "-" if r_squared is None else f"{r_squared:.3f}"
        caveats.append(
            Caveat(
                "poor_fit",
                f"{law}'s law fits poorly (the median at {_workers(worst[0])} is "
                f"{worst[1]:+.0%} off the curve; R² {r2}): the cost is not one fixed serial "
                "part. Look for costs that grow with the workers (start-up, communication, "
                "contention); read the predictions as rough.",
            )
        )
    elif r_squared is not None and r_squared < MIN_R_SQUARED:
        caveats.append(
            Caveat(
                "poor_fit",
                f"The repetitions scatter almost as much as the worker counts differ "
                f"(R² {r_squared:.3f}): the timings say little about the serial fraction. "
                "Use longer work, more repeats, or a quieter machine.",
            )
        )
    low, high = ci
    outside = (high if high is not None else s) < 0 or (low if low is not None else s) > 1
    if outside:
        caveats.append(
            Caveat(
                "out_of_model",
                f"The fitted serial fraction {s:.3f} is outside [0, 1]"
                + (
                    " (speed-ups above the worker count: caching effects, or the baseline "
                    "run was slowed)."
                    if s < 0
                    else " (more workers made it slower: oversubscription or contention)."
                )
                + " Predictions use it clamped to [0, 1].",
            )
        )
    if low is not None and high is not None:
        half = (high - low) / 2.0
        if half > max(0.02, 0.5 * abs(s)):
            caveats.append(
                Caveat(
                    "uncertain",
                    f"The serial fraction is poorly determined ({s:.3f}, interval "
                    f"{low:.3f}..{high:.3f}): use more repeats, longer work, a wider "
                    "range of worker counts, or a quieter machine.",
                )
            )
    return caveats


def fit_amdahl(
    workers: Sequence[int],
    times: Sequence[float],
    *,
    confidence: float = 0.95,
    baseline: int | None = None,
) -> Fit:
    """Fit Amdahl's law ``T(n) = T1 (s + (1 - s)/n)`` to wall times of a fixed work.

    It fits the times, not the speed-ups: a speed-up divides by the one-worker time, so
    the noise of that one run would enter every point, and a run on one worker would be
    required. ``T(n) = A + B/n`` is linear in ``(A, B)``: weighted least squares over
    every repetition, in closed form, with the covariance from the residuals; then
    ``s = A / (A + B)`` and ``T1 = A + B``, the standard error of ``s`` by the delta
    method, and a Student's t interval.

    Args:
        workers: the worker count of each run.
        times: the wall seconds of each run (same length; repetitions are repeated
            entries).
        confidence: of the interval for ``s``.
        baseline: the count speed-ups are relative to (default: the smallest).

    Returns:
        The fit, with caveats: too few counts, a poor fit, ``s`` outside [0, 1], a wide
        interval.

    Raises:
        ConfigError: fewer than two distinct counts, non-positive times or counts, or
            lengths that differ.
    """
    by_count = _check(workers, times, "fit_amdahl")
    _check_confidence(confidence)
    medians = {n: median(ts) for n, ts in by_count.items()}
    rows = [(1.0 / n, t, 1.0 / medians[n] ** 2) for n, ts in by_count.items() for t in ts]
    sw = sum(w for _, _, w in rows)
    sx = sum(w * x for x, _, w in rows)
    sy = sum(w * y for _, y, w in rows)
    sxx = sum(w * x * x for x, _, w in rows)
    sxy = sum(w * x * y for x, y, w in rows)
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det
    a = (sxx * sy - sx * sxy) / det
    t1 = a + b
    n_points = len(rows)
    dof = n_points - 2
    ss_res = sum(w * (y - a - b * x) ** 2 for x, y, w in rows)
    mean_y = sy / sw
    ss_tot = sum(w * (y - mean_y) ** 2 for _, y, w in rows)
    s = a / t1 if t1 != 0 else math.nan
    stderr = None
    t1_se = None
    if dof > 0 and t1 != 0:
        sigma2 = ss_res / dof
        var_a, var_b, cov_ab = sigma2 * sxx / det, sigma2 * sw / det, -sigma2 * sx / det
        var_s = (b * b * var_a - 2 * a * b * cov_ab + a * a * var_b) / t1**4
        stderr = math.sqrt(max(var_s, 0.0))
        t1_se = math.sqrt(max(var_a + var_b + 2 * cov_ab, 0.0))
    ci = _interval(s, stderr, dof, confidence)
    # A fitted time at or below zero (wildly superlinear data) would divide by zero.
    residuals = tuple((n, medians[n] / max(a + b / n, 1e-9 * medians[n]) - 1.0) for n in by_count)
    r_squared = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    base = min(by_count) if baseline is None else baseline
    return Fit(
        model="amdahl",
        serial_fraction=s,
        stderr=stderr,
        ci_low=ci[0],
        ci_high=ci[1],
        confidence=confidence,
        t1_seconds=t1,
        r_squared=r_squared,
        n_points=n_points,
        n_counts=len(by_count),
        dof=dof,
        residuals=residuals,
        method=(
            "weighted least squares of T(n) = A + B/n over every repetition (weights "
            "1/median(T(n))^2), s = A/(A+B), standard error by the delta method from the "
            "residual covariance" + ("" if t1_se is None else f"; T1 = {t1:.4g} ± {t1_se:.2g} s")
        ),
        baseline_workers=base,
        caveats=tuple(_fit_caveats("amdahl", s, ci, r_squared, residuals, len(by_count), stderr)),
    )


def fit_gustafson(
    workers: Sequence[int],
    times: Sequence[float],
    reference: Mapping[int, Sequence[float]] | None = None,
    *,
    confidence: float = 0.95,
    baseline: int | None = None,
) -> Fit:
    """Fit Gustafson's law ``S(n) = n' - s (n' - 1)`` (``n' = n / baseline``) to weak
    scaling: the work on ``n`` workers is ``n'`` times the baseline's.

    The scaled speed-up of a run is the time of its (scaled) work on the baseline count
    over its time on ``n`` workers. With ``reference`` (``{n: times of the work of count
    n, run on the baseline count}``) it is measured; without, it is estimated as
    ``n' * T(baseline) / T(n)``, which assumes the baseline would take ``n'`` times as
    long on ``n'`` times the work: a serial part that does not grow with the work makes
    that an overestimate, so the fitted ``s`` is then a lower bound (caveat
    ``estimated_reference``).

    ``n' - S = s (n' - 1)`` is a line through the origin: weighted least squares over
    every repetition (weights ``1/median(S)^2``), standard error from the residuals.

    Args:
        workers: the worker count of each run.
        times: the wall seconds of each run (the work scaled with the count).
        reference: the scaled work's times on the baseline count, per count; the
            baseline's own runs stand in for its reference when it is missing.
        confidence: of the interval for ``s``.
        baseline: the count the work is scaled from (default: the smallest).

    Returns:
        The fit, with caveats as for :func:`fit_amdahl` plus ``estimated_reference``.

    Raises:
        ConfigError: fewer than two distinct counts, non-positive times, a reference
            missing for some count, or lengths that differ.
    """
    by_count = _check(workers, times, "fit_gustafson")
    _check_confidence(confidence)
    base = min(by_count) if baseline is None else baseline
    if base not in by_count:
        raise ConfigError(
            f"fit_gustafson: the baseline count {base} has no timings; measure it too."
        )
    speedups = _scaled_speedups(by_count, reference, base)
    s_medians = {n: median(v) for n, v in speedups.items()}
    rows = [
        (n / base - 1.0, n / base - sp, 1.0 / s_medians[n] ** 2)
        for n, v in speedups.items()
        for sp in v
    ]
    sxx = sum(w * x * x for x, _, w in rows)
    sxy = sum(w * x * y for x, y, w in rows)
    if sxx <= 0:
        raise ConfigError("fit_gustafson needs a count above the baseline.")
    s = sxy / sxx
    n_points = len(rows)
    dof = n_points - 1
    ss_res = sum(w * (y - s * x) ** 2 for x, y, w in rows)
    stderr = math.sqrt(ss_res / dof / sxx) if dof > 0 else None
    ci = _interval(s, stderr, dof, confidence)
    r_squared = _gustafson_r_squared(speedups, s_medians, ss_res)
    residuals = tuple((n, s_medians[n] / gustafson_speedup(s, n, base) - 1.0) for n in by_count)
    caveats = _fit_caveats("gustafson", s, ci, r_squared, residuals, len(by_count), stderr)
    if reference is None:
        caveats.append(_ESTIMATED_REFERENCE)
    return Fit(
        model="gustafson",
        serial_fraction=s,
        stderr=stderr,
        ci_low=ci[0],
        ci_high=ci[1],
        confidence=confidence,
        t1_seconds=None,
        r_squared=r_squared,
        n_points=n_points,
        n_counts=len(by_count),
        dof=dof,
        residuals=residuals,
        method=(
            "weighted least squares of n' - S = s (n' - 1) through the origin over every "
            "repetition (weights 1/median(S)^2), standard error from the residuals; S "
            + ("measured against reference runs" if reference is not None else "estimated")
        ),
        reference="measured" if reference is not None else "estimated",
        baseline_workers=base,
        caveats=tuple(caveats),
    )


_ESTIMATED_REFERENCE = Caveat(
    "estimated_reference",
    "Scaled speed-ups are estimated as (n/baseline) x T(baseline) / T(n), without "
    "reference runs of the scaled work on the baseline count: a serial part "
    "that does not grow with the work makes them too high, so the serial "
    "fraction is a lower bound. Measure with reference runs to know it.",
)


def _scaled_speedups(
    by_count: dict[int, list[float]],
    reference: Mapping[int, Sequence[float]] | None,
    base: int,
) -> dict[int, list[float]]:
    """Each run's scaled speed-up: the median reference time of its count over its
    time, or, without a reference, ``n' * median(T(baseline)) / T(n)``."""
    if reference is None:
        base_median = median(by_count[base])
        return {n: [(n / base) * base_median / t for t in ts] for n, ts in by_count.items()}
    ref_medians: dict[int, float] = {}
    for n in by_count:
        given = reference.get(n) or (by_count[n] if n == base else None)
        if not given or any(not math.isfinite(t) or t <= 0 for t in given):
            raise ConfigError(
                f"fit_gustafson: reference times for {n} workers are missing or not "
                "positive; pass the scaled work's times on the baseline count for "
                "every count, or no reference at all."
            )
        ref_medians[n] = median(given)
    return {n: [ref_medians[n] / t for t in ts] for n, ts in by_count.items()}


def _gustafson_r_squared(
    speedups: dict[int, list[float]], s_medians: dict[int, float], ss_res: float
) -> float | None:
    """R² of the fit: the weighted residual sum of squares against the speed-ups' own
    spread about their weighted mean (``None`` when they do not spread)."""
    all_s = [(sp, 1.0 / s_medians[n] ** 2) for n, v in speedups.items() for sp in v]
    sw = sum(w for _, w in all_s)
    mean_sp = sum(w * sp for sp, w in all_s) / sw
    ss_tot = sum(w * (sp - mean_sp) ** 2 for sp, w in all_s)
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else None


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be between 0 and 1 (e.g. 0.95), got {confidence!r}.")


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` for a singular system."""
    n = len(rhs)
    m = [[*row[:], r] for row, r in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * c for a, c in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def per_worker_cost(
    workers: Sequence[int], times: Sequence[float]
) -> tuple[float, float, int] | None:
    """A cost that grows with the workers: ``C`` of ``T(n) = A + B/n + C n`` and its
    standard error (weighted least squares as in :func:`fit_amdahl`).

    Amdahl's law has no such term; a ``C`` clearly above zero (start-up of each worker,
    communication, contention) means larger counts will do worse than it predicts.

    Returns:
        ``(C, stderr, dof)``: seconds per worker, its standard error and the residual
        degrees of freedom; ``None`` with fewer than three counts
        or no residual degree of freedom.
    """
    by_count = _check(workers, times, "per_worker_cost")
    n_points = sum(len(ts) for ts in by_count.values())
    if len(by_count) < 3 or n_points <= 3:
        return None
    medians = {n: median(ts) for n, ts in by_count.items()}
    rows = [
        ([1.0, 1.0 / n, float(n)], t, 1.0 / medians[n] ** 2)
        for n, ts in by_count.items()
        for t in ts
    ]
    xtx = [[sum(w * x[i] * x[j] for x, _, w in rows) for j in range(3)] for i in range(3)]
    xty = [sum(w * x[i] * y for x, y, w in rows) for i in range(3)]
    beta = _solve(xtx, xty)
    # The third column of the inverse: (X'WX)^-1 e3, for the variance of C.
    inv_col = _solve(xtx, [0.0, 0.0, 1.0])
    if beta is None or inv_col is None:
        return None
    ss_res = sum(
        w * (y - sum(b * xi for b, xi in zip(beta, x, strict=True))) ** 2 for x, y, w in rows
    )
    sigma2 = ss_res / (n_points - 3)
    return beta[2], math.sqrt(max(sigma2 * inv_col[2], 0.0)), n_points - 3
