"""Work functions shared by the benchmarks.

They live in a module of their own, importable by name, so that every engine's
workers (fork, spawn/loky, Dask nannies, Ray workers, paralela) can unpickle them
by reference. The benchmark children put ``bench/`` on ``PYTHONPATH``, which the
workers inherit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# Iterations of `burn`'s loop; about 54 ns each on the 2-core reference VM, so
# ~4.9 ms a call (the anchors' B measured 4.63 ms/item for their ~5 ms loop).
BURN_LOOPS = 90_000


def inc(x: int) -> int:
    """Workload (a): a trivial item."""
    return x + 1


def burn(x: int) -> int:
    """Workload (b): pure-Python CPU work of ~5 ms, holding the GIL throughout."""
    s = x
    for i in range(BURN_LOOPS):
        s = (s * 31 + i) % 1_000_003
    return s


def asum(a: Any) -> float:
    """Workload (c): reduce one 1 MiB float64 array to its sum."""
    return float(a.sum())


def noop(x: Any) -> Any:
    """Workload (d): a no-op task for start-up round trips."""
    return x


def apply_batch(fn: Callable[[Any], Any], xs: Sequence[Any]) -> list[Any]:
    """Apply ``fn`` to a batch of items: one task per batch for Ray and Dask."""
    return [fn(x) for x in xs]
