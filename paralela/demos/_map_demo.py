"""The data-parallel map demo: feature extraction over synthetic sensor recordings.

Preparing features is the step before training that most often runs on one core. Each
item is a seed; the worker synthesises a recording (three tones and noise, 4096 samples)
and extracts 36 features from it: mean, standard deviation, peak-to-peak, zero-crossing
rate and the power in 32 frequency bands (Goertzel filters). The work is pure Python and
CPU-bound, about 10 ms per item on the 2-core reference machine, so 400 items take about
4 s on one core, and the parallel run shows what the cores add.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import time
from dataclasses import dataclass

from paralela.backends import get_backend
from paralela.errors import ConfigError
from paralela.mapping import MapSummary
from paralela.mapping import map as pmap

__all__ = ["DEFAULT_ITEMS", "MapDemoResult", "extract_features", "run_map_demo"]

DEFAULT_ITEMS = 400
SAMPLES = 4096  # samples per recording
RATE = 256.0  # samples per second
BANDS = 32  # frequency bands, 2 Hz to about 118 Hz, 3.75 Hz apart
FEATURES = 4 + BANDS


def synthetic_recording(seed: int) -> list[float]:
    """A reproducible recording: three tones of random frequency and phase, plus noise."""
    rng = random.Random(seed)
    tones = [
        (rng.uniform(1.0, 100.0), rng.uniform(0.2, 1.0), rng.uniform(0.0, 2 * math.pi))
        for _ in range(3)
    ]
    two_pi = 2 * math.pi
    samples = []
    for n in range(SAMPLES):
        t = n / RATE
        value = rng.gauss(0.0, 0.3)
        for freq, amplitude, phase in tones:
            value += amplitude * math.sin(two_pi * freq * t + phase)
        samples.append(value)
    return samples


def band_power(samples: list[float], freq: float) -> float:
    """Power of ``samples`` at ``freq`` Hz (the Goertzel algorithm: one DFT bin)."""
    coeff = 2 * math.cos(2 * math.pi * freq / RATE)
    s1 = s2 = 0.0
    for value in samples:
        s1, s2 = value + coeff * s1 - s2, s1
    return (s1 * s1 + s2 * s2 - coeff * s1 * s2) / len(samples)


def extract_features(seed: int) -> tuple[float, ...]:
    """The feature vector of recording ``seed`` (:data:`FEATURES` floats)."""
    x = synthetic_recording(seed)
    n = len(x)
    mean = sum(x) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / n)
    crossings = sum(1 for a, b in itertools.pairwise(x) if (a < 0) != (b < 0)) / (n - 1)
    bands = [band_power(x, 2.0 + i * 3.75) for i in range(BANDS)]
    return (mean, std, max(x) - min(x), crossings, *bands)


@dataclass(frozen=True)
class MapDemoResult:
    """What :func:`run_map_demo` measured.

    Attributes:
        items: recordings processed.
        features: features per recording.
        workers: worker processes of the parallel run.
        serial_seconds: wall time of the serial run (``backend="sequential"``).
        parallel_seconds: wall time of the parallel run, worker start-up included.
        results_equal: whether both runs gave the same feature vectors.
        summary: the parallel run's :class:`~paralela.MapSummary`.
    """

    items: int
    features: int
    workers: int
    serial_seconds: float
    parallel_seconds: float
    results_equal: bool
    summary: MapSummary

    @property
    def speedup(self) -> float:
        return self.serial_seconds / self.parallel_seconds if self.parallel_seconds else 0.0

    @property
    def ideal_speedup(self) -> float:
        """What perfect scaling would give: one item per worker at best."""
        return float(max(1, min(self.workers, self.items)))

    @property
    def busy_fraction(self) -> float:
        """Mean share of the parallel wall time the workers spent extracting features."""
        return self.summary.busy_fraction


def run_map_demo(
    items: int = DEFAULT_ITEMS,
    workers: int | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> MapDemoResult:
    """Extract features from ``items`` recordings serially, then with :func:`paralela.map`.

    Args:
        items: how many recordings (at least 1).
        workers: worker processes for the parallel run; ``None``: every usable CPU.
        run_dir: the parallel run's run directory (its chunks and ``summary.json``,
            for ``paralela report``); give a fresh one, or it resumes. ``None``: none.

    Raises:
        ConfigError: ``items`` or ``workers`` below 1.
    """
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise ConfigError(f"items must be a positive integer, got {items!r}.")
    seeds = list(range(items))

    t0 = time.perf_counter()
    serial = pmap(extract_features, seeds, backend="sequential", progress=False)
    serial_seconds = time.perf_counter() - t0

    backend = get_backend("processes", workers)  # the pool paralela.map uses (shared)
    t0 = time.perf_counter()
    parallel = pmap(extract_features, seeds, backend=backend, progress=False, run_dir=run_dir)
    parallel_seconds = time.perf_counter() - t0

    return MapDemoResult(
        items=items,
        features=FEATURES,
        workers=backend.effective_workers(),
        serial_seconds=serial_seconds,
        parallel_seconds=parallel_seconds,
        results_equal=list(serial) == list(parallel),
        summary=parallel.summary,
    )
