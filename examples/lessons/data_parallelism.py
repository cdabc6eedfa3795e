"""Lesson 1: data parallelism and task bunching (docs/lessons/data-parallelism.md).

Data parallelism runs the same function on many items at once, one item per worker. It
pays when an item's work outweighs what it costs to send the item to a worker and its
result back. This script measures both sides:

1. work that is worth sending: a pure-Python function of a few milliseconds per item, as
   a plain loop and on the ``processes`` backend (the speed-up you get from the cores);
2. work that is not: 20,000 tiny items sent one per task (``chunksize=1``) against
   paralela's ``chunksize="auto"``, which bunches items into chunks of about 50 ms.

Run it:  python examples/lessons/data_parallelism.py           (about a minute)
         python examples/lessons/data_parallelism.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

import paralela


def busy(n: int) -> float:
    """Pure-Python work: ``n`` square roots (1,000,000 take about 0.1 s on one core)."""
    total = 0.0
    for i in range(n):
        total += math.sqrt(i)
    return total


def square(x: int) -> int:
    """Tiny work: far less than it costs to send the item to another process."""
    return x * x


def cpu_seconds() -> float:
    """CPU time (user + system) used so far by this process and its worker processes."""
    me = psutil.Process()
    total = float(sum(me.cpu_times()[:2]))
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += float(sum(child.cpu_times()[:2]))
    return total


def race(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any, float]]:
    """Each run's best wall time of ``repeat``, its value, and the cores it kept busy
    (CPU seconds per wall second: on a shared machine, what it really got). The runs
    take turns (a, b, a, b...), so that a burst of other work does not fall on one of
    them only."""
    best: dict[str, tuple[float, Any, float]] = {}
    for _ in range(repeat):
        for name, run in runs.items():
            cpu, start = cpu_seconds(), time.perf_counter()
            value = run()
            seconds = time.perf_counter() - start
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, value, (cpu_seconds() - cpu) / seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    workers = min(2, os.cpu_count() or 1)
    heavy_items = [1_000_000] * (8 if args.quick else 24)
    tiny_items = list(range(2_000 if args.quick else 20_000))
    repeat = 1 if args.quick else 3  # best of three: a shared machine is noisy

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} before the run\n")
    # Start the pool once, so that the figures below are the work, not the start-up.
    start = time.perf_counter()
    paralela.map(square, range(workers), workers=workers)
    startup = time.perf_counter() - start

    print(f"1. work worth sending: {len(heavy_items)} items of pure-Python work")
    heavy = race(
        {
            "loop": lambda: [busy(n) for n in heavy_items],
            "map": functools.partial(paralela.map, busy, heavy_items, workers=workers),
        },
        repeat,
    )
    (serial_s, expected, serial_cores), (par_s, got, par_cores) = heavy["loop"], heavy["map"]
    assert list(got) == expected
    speedup = serial_s / par_s
    print(f"   {'run':<34} {'seconds':>8} {'speed-up':>9} {'cores used':>11}")
    print(f"   {'plain loop':<34} {serial_s:>8.2f} {1.0:>8.2f}x {serial_cores:>11.2f}")
    print(
        f"   {f'paralela.map, {workers} processes':<34} {par_s:>8.2f} {speedup:>8.2f}x "
        f"{par_cores:>11.2f}"
    )
    print("   (cores used: CPU seconds per wall second, this process and its workers)")
    print()

    print(f"2. tiny work: {len(tiny_items):,} items of x * x")
    tiny = race(
        {
            "plain loop": lambda: [square(x) for x in tiny_items],
            "paralela.map, chunksize=1": functools.partial(
                paralela.map, square, tiny_items, workers=workers, chunksize=1
            ),
            'paralela.map, chunksize="auto"': functools.partial(
                paralela.map, square, tiny_items, workers=workers, chunksize="auto"
            ),
        },
        repeat,
    )
    rows = []
    for label, (seconds, got, _) in tiny.items():
        assert list(got) == list(map(square, tiny_items))
        rows.append((label, seconds, getattr(getattr(got, "summary", None), "chunks", 0)))
    print(f"   {'run':<34} {'seconds':>8} {'chunks':>7} {'items/s':>11}")
    for label, seconds, chunks in rows:
        rate = len(tiny_items) / seconds
        print(f"   {label:<34} {seconds:>8.3f} {chunks or '-':>7} {rate:>11,.0f}")
    one, auto = rows[1][1], rows[2][1]
    print()
    print(f"(pool start-up, done once before the runs above: {startup:.2f} s)")
    print(
        f"RESULT: {len(heavy_items)} pure-Python items: speed-up {speedup:.2f}x on {workers} "
        f"processes; "
        f"{len(tiny_items):,} tiny items: chunksize=1 {one:.2f} s vs auto {auto:.3f} s "
        f"({one / auto:.0f}x faster bunched)"
    )
    print(
        "Conclusion: split work across processes when an item costs milliseconds; for tiny "
        "items, bunch them into chunks (chunksize='auto') or the sending costs more than "
        "the work."
    )


if __name__ == "__main__":
    main()
