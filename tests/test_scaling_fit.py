"""The Amdahl and Gustafson fits, their uncertainty and caveats, and scaling.json.

Synthetic timings follow the laws exactly, then get multiplicative Gaussian noise from a
seeded generator, so every test is deterministic.
"""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest

from paralela.errors import ConfigError
from paralela.scaling import (
    ScalingError,
    ScalingResult,
    amdahl_speedup,
    analyse,
    fit_amdahl,
    fit_gustafson,
    gustafson_speedup,
    load_scaling,
)
from paralela.scaling._fit import per_worker_cost, t_quantile

COUNTS = (1, 2, 4, 8)


def amdahl_times(
    s: float,
    rng: random.Random,
    counts: tuple[int, ...] = COUNTS,
    repeats: int = 3,
    noise: float = 0.03,
    t1: float = 4.0,
) -> dict[int, list[float]]:
    return {
        n: [t1 * (s + (1 - s) / n) * (1 + rng.gauss(0, noise)) for _ in range(repeats)]
        for n in counts
    }


def flat(times: dict[int, list[float]]) -> tuple[list[int], list[float]]:
    return [n for n, ts in times.items() for _ in ts], [t for ts in times.values() for t in ts]


def weak_times(
    s: float, rng: random.Random, noise: float = 0.02, repeats: int = 3
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """A fixed serial part ``a`` and a parallel part ``p`` per worker: the weak run takes
    ``a + p`` at any count, the scaled work on one worker ``a + n p``."""
    a, p = s, 1 - s
    weak = {n: [(a + p) * (1 + rng.gauss(0, noise)) for _ in range(repeats)] for n in COUNTS}
    ref = {n: [(a + n * p) * (1 + rng.gauss(0, noise)) for _ in range(repeats)] for n in COUNTS}
    return weak, ref


def codes(result: ScalingResult) -> set[str]:
    return {c.code for c in result.caveats}


# -- Student's t ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dof", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423)],
)
def test_t_quantile_matches_the_tables(dof: int, expected: float) -> None:
    assert t_quantile(0.975, dof) == pytest.approx(expected, rel=2e-3)


# -- Amdahl -----------------------------------------------------------------------------


@pytest.mark.parametrize("s", [0.0, 0.01, 0.1, 0.3, 0.7])
def test_exact_timings_give_the_serial_fraction_exactly(s: float) -> None:
    workers, times = flat(amdahl_times(s, random.Random(0), noise=0.0))
    fit = fit_amdahl(workers, times)
    assert fit.serial_fraction == pytest.approx(s, abs=1e-9)
    assert fit.t1_seconds == pytest.approx(4.0)
    assert fit.stderr == pytest.approx(0.0, abs=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert all(abs(r) < 1e-9 for _, r in fit.residuals)
    assert fit.caveats == ()


@pytest.mark.parametrize(("s", "seed"), [(0.02, 1), (0.1, 2), (0.25, 3), (0.5, 4)])
def test_noisy_timings_recover_the_serial_fraction_within_its_uncertainty(
    s: float, seed: int
) -> None:
    workers, times = flat(amdahl_times(s, random.Random(seed), repeats=5))
    fit = fit_amdahl(workers, times)
    assert fit.stderr is not None
    assert fit.ci_low is not None
    assert fit.ci_high is not None
    # 4 standard errors: fails by chance once in ~16,000 seeds.
    assert abs(fit.serial_fraction - s) < 4 * fit.stderr
    assert 0 < fit.stderr < 0.05
    assert fit.ci_low < fit.serial_fraction < fit.ci_high
    half = t_quantile(0.975, fit.dof) * fit.stderr
    assert fit.ci_high - fit.serial_fraction == pytest.approx(half)
    assert fit.dof == len(times) - 2
    assert fit.r_squared is not None
    assert fit.r_squared > 0.95


def test_the_confidence_interval_covers_the_true_value_95_percent_of_the_time() -> None:
    rng = random.Random(12345)
    trials, covered = 400, 0
    for _ in range(trials):
        s = rng.choice([0.0, 0.03, 0.1, 0.3, 0.6])
        fit = fit_amdahl(*flat(amdahl_times(s, rng)))
        assert fit.ci_low is not None
        assert fit.ci_high is not None
        covered += fit.ci_low <= s <= fit.ci_high
    # Binomial(400, 0.95): mean 380, sd 4.4; [0.91, 0.99] is > 4 sd either side.
    assert 0.91 <= covered / trials <= 0.99


def test_more_repetitions_shrink_the_uncertainty() -> None:
    few = fit_amdahl(*flat(amdahl_times(0.1, random.Random(7), repeats=2)))
    many = fit_amdahl(*flat(amdahl_times(0.1, random.Random(7), repeats=20)))
    assert few.stderr is not None
    assert many.stderr is not None
    assert many.stderr < few.stderr


def test_no_run_on_one_worker_is_needed() -> None:
    times = amdahl_times(0.15, random.Random(8), counts=(2, 4, 8, 16), noise=0.0)
    fit = fit_amdahl(*flat(times))
    assert fit.serial_fraction == pytest.approx(0.15)
    assert fit.baseline_workers == 2
    # Speed-ups are relative to 2 workers: 1 there, Amdahl's ratio elsewhere.
    assert fit.speedup(2) == pytest.approx(1.0)
    assert fit.speedup(16) == pytest.approx(times[2][0] / times[16][0])


def test_predictions_come_with_a_band_that_holds_them() -> None:
    result = analyse(amdahl_times(0.05, random.Random(9)))
    fit = result.fit
    assert fit is not None
    assert [p.workers for p in result.predictions] == [16, 32, 128, 512]
    for p in result.predictions:
        assert p.amdahl_low <= p.amdahl <= p.amdahl_high
        assert p.gustafson_low <= p.gustafson <= p.gustafson_high
        assert p.amdahl == pytest.approx(amdahl_speedup(fit.serial_fraction, p.workers))
    ceiling = fit.max_speedup
    assert ceiling is not None
    assert result.predictions[-1].amdahl < ceiling
    assert ceiling == pytest.approx(1 / fit.serial_fraction)


def test_bad_input_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="two worker counts"):
        fit_amdahl([4, 4, 4], [1.0, 1.1, 0.9])
    with pytest.raises(ConfigError, match="same length"):
        fit_amdahl([1, 2], [1.0])
    with pytest.raises(ConfigError, match="positive seconds"):
        fit_amdahl([1, 2], [1.0, -0.5])
    with pytest.raises(ConfigError, match="positive integers"):
        fit_amdahl([0, 2], [1.0, 0.5])
    with pytest.raises(ConfigError, match="confidence"):
        fit_amdahl([1, 2], [1.0, 0.5], confidence=95)


# -- caveats ----------------------------------------------------------------------------


def test_two_counts_are_too_few_and_one_run_each_has_no_uncertainty() -> None:
    fit = fit_amdahl([1, 2], [1.0, 0.6])
    assert fit.serial_fraction == pytest.approx(0.2)
    assert fit.stderr is None
    assert fit.ci_low is None
    assert [c.code for c in fit.caveats] == ["too_few_points", "too_few_points"]


def test_superlinear_speedup_is_flagged_and_out_of_model() -> None:
    result = analyse({1: [4.0, 4.1, 3.9], 2: [1.6, 1.62, 1.58], 4: [0.8, 0.79, 0.81]})
    assert {"superlinear", "out_of_model"} <= codes(result)
    assert result.fit is not None
    assert result.fit.serial_fraction < 0
    # Predictions clamp s to [0, 1]: never beyond linear.
    assert all(p.amdahl <= p.workers + 1e-9 for p in result.predictions)


def test_slower_with_more_workers_is_not_monotonic() -> None:
    result = analyse({1: [1.0, 1.0], 2: [0.6, 0.61], 4: [0.7, 0.71], 8: [0.9, 0.91]})
    assert "not_monotonic" in codes(result)
    message = next(c.message for c in result.caveats if c.code == "not_monotonic")
    assert "4 workers took longer than 2 workers" in message
    assert "poor_fit" in codes(result)


def test_a_cost_per_worker_is_found_and_reported() -> None:
    rng = random.Random(10)
    times = {
        n: [(4 * (0.05 + 0.95 / n) + 0.05 * n) * (1 + rng.gauss(0, 0.01)) for _ in range(3)]
        for n in (1, 2, 4, 8, 16)
    }
    cost = per_worker_cost(*flat(times))
    assert cost is not None
    assert cost[0] == pytest.approx(0.05, rel=0.2)
    result = analyse(times)
    assert "growing_overhead" in codes(result)
    assert "ms per worker" in next(
        c.message for c in result.caveats if c.code == "growing_overhead"
    )


def test_timings_that_follow_amdahl_raise_no_alarm() -> None:
    result = analyse(amdahl_times(0.1, random.Random(11), noise=0.01))
    assert codes(result) == set()


def test_noisy_repetitions_and_a_wide_interval_are_flagged() -> None:
    result = analyse(amdahl_times(0.1, random.Random(12), noise=0.25))
    assert {"noisy", "uncertain"} <= codes(result)


def test_counts_above_the_cpus_are_flagged_and_left_out_of_the_fit() -> None:
    # CPU-bound work on 2 CPUs: no gain past 2 workers.
    times = {1: [4.0, 4.02], 2: [2.1, 2.11], 4: [2.1, 2.12], 8: [2.15, 2.13]}
    result = analyse(times, usable_cpus=2)
    message = next(c.message for c in result.caveats if c.code == "oversubscribed")
    assert message.startswith("This machine has 2 usable CPUs; counts above 2 (4, 8)")
    assert [p.in_fit for p in result.points] == [True, True, False, False]
    assert [p.oversubscribed for p in result.points] == [False, False, True, True]
    assert result.fit is not None
    assert result.fit.n_counts == 2
    fitted_all = analyse(times, usable_cpus=2, oversubscribe=True)
    assert all(p.in_fit for p in fitted_all.points)
    assert "fitted as asked" in fitted_all.caveats[0].message
    # Fitting the oversubscribed points turns the CPU limit into a "serial fraction".
    assert fitted_all.fit is not None
    assert fitted_all.fit.serial_fraction > 0.3


# -- Gustafson --------------------------------------------------------------------------


@pytest.mark.parametrize(("s", "seed"), [(0.05, 20), (0.2, 21), (0.5, 22)])
def test_weak_scaling_with_reference_runs_recovers_gustafsons_fraction(s: float, seed: int) -> None:
    weak, ref = weak_times(s, random.Random(seed))
    fit = fit_gustafson(*flat(weak), ref)
    assert fit.model == "gustafson"
    assert fit.reference == "measured"
    assert fit.stderr is not None
    assert abs(fit.serial_fraction - s) < 4 * fit.stderr
    assert fit.speedup(8) == pytest.approx(gustafson_speedup(fit.serial_fraction, 8))
    assert not any(c.code == "estimated_reference" for c in fit.caveats)


def test_weak_scaling_exact_data_fits_exactly() -> None:
    weak, ref = weak_times(0.25, random.Random(0), noise=0.0)
    fit = fit_gustafson(*flat(weak), ref)
    assert fit.serial_fraction == pytest.approx(0.25)
    assert fit.stderr == pytest.approx(0.0, abs=1e-9)
    # S(n) = n - s (n - 1)
    assert fit.speedup(8) == pytest.approx(8 - 0.25 * 7)


def test_weak_scaling_without_reference_is_a_flagged_lower_bound() -> None:
    weak, ref = weak_times(0.3, random.Random(23))
    estimated = fit_gustafson(*flat(weak))
    measured = fit_gustafson(*flat(weak), ref)
    assert estimated.reference == "estimated"
    assert "estimated_reference" in {c.code for c in estimated.caveats}
    assert estimated.serial_fraction < measured.serial_fraction


def test_weak_analysis_reports_scaled_speedups_and_the_amdahl_view() -> None:
    weak, ref = weak_times(0.2, random.Random(24), noise=0.0)
    result = analyse(weak, weak=True, reference=ref)
    assert result.mode == "weak"
    assert [p.scale for p in result.points] == [1, 2, 4, 8]
    assert result.points[-1].speedup == pytest.approx(8 - 0.2 * 7)
    assert result.points[-1].reference_times == tuple(ref[8])
    prediction = result.predictions[0]
    assert prediction.workers == 16
    assert prediction.gustafson == pytest.approx(16 - 0.2 * 15)
    assert prediction.amdahl == pytest.approx(amdahl_speedup(0.2, 16))
    headers, rows = result.table_rows()
    assert "scaled speed-up" in headers
    assert "Gustafson fit" in headers
    assert rows[-1][:2] == ["8", "8"]


def test_gustafson_refuses_a_missing_reference() -> None:
    weak, ref = weak_times(0.2, random.Random(25))
    del ref[4]
    with pytest.raises(ConfigError, match="reference times for 4 workers"):
        fit_gustafson(*flat(weak), ref)


# -- scaling.json -----------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    result = analyse(
        amdahl_times(0.1, random.Random(30)), usable_cpus=4, machine={"usable_cpus": 4}
    )
    written = result.save(tmp_path / "run")
    assert [p.name for p in written] == ["scaling.json", "scaling.png"]
    assert png_size(tmp_path / "run" / "scaling.png") == (1000, 420)
    assert (tmp_path / "run" / "scaling.png").stat().st_size > 20_000  # curves drawn
    data = json.loads((tmp_path / "run" / "scaling.json").read_text())
    assert data["format"] == 1
    assert data["kind"] == "scaling"
    assert data["mode"] == "strong"
    assert data["fit"]["model"] == "amdahl"
    assert set(data["points"][0]) >= {"workers", "times", "median", "speedup", "efficiency"}
    loaded = load_scaling(tmp_path / "run")
    assert loaded.to_dict() == result.to_dict()
    assert loaded.run_dir == tmp_path / "run"
    assert load_scaling(tmp_path / "run" / "scaling.json").table() == result.table()


def test_table_shows_counts_fit_predictions_and_warnings() -> None:
    result = analyse({1: [4.0, 4.1], 2: [2.2, 2.1], 4: [2.2, 2.3]}, usable_cpus=2)
    text = result.table()
    lines = text.splitlines()
    assert lines[0].split() == ["workers", "median", "s", "speed-up", "efficiency", "Amdahl",
                                "fit", "spread", "note"]  # fmt: skip
    assert lines[3].endswith("over CPUs, not fitted")
    assert "Serial fraction s = " in text
    assert "Predicted speed-up: 8: " in text  # 2, 4, 16 and 64 times the largest count
    assert ", 256: " in text
    assert "Warning: This machine has 2 usable CPUs" in text


def test_load_scaling_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ScalingError, match=r"No scaling\.json"):
        load_scaling(tmp_path)
    (tmp_path / "scaling.json").write_text('{"kind": "map"}')
    with pytest.raises(ScalingError, match="not a paralela scaling result"):
        load_scaling(tmp_path)
    (tmp_path / "scaling.json").write_text('{"kind": "scaling", "format": 99}')
    with pytest.raises(ScalingError, match="Upgrade paralela"):
        load_scaling(tmp_path)
    (tmp_path / "scaling.json").write_text('{"kind": "scaling", "format": 1}')
    with pytest.raises(ScalingError, match="malformed"):
        load_scaling(tmp_path)
    (tmp_path / "scaling.json").write_text("not json")
    with pytest.raises(ScalingError, match="Cannot read"):
        load_scaling(tmp_path)


def test_laws_at_the_baseline_and_beyond() -> None:
    assert amdahl_speedup(0.0, 8) == 8
    assert amdahl_speedup(1.0, 8) == 1
    assert amdahl_speedup(0.1, 4, baseline=2) == pytest.approx(
        amdahl_speedup(0.1, 4) / amdahl_speedup(0.1, 2)
    )
    assert gustafson_speedup(0.1, 8) == pytest.approx(8 - 0.7)
    assert math.isclose(gustafson_speedup(-0.5, 8), 8)  # clamped to the model
