"""Lesson 5: Amdahl's and Gustafson's laws (docs/lessons/amdahl-gustafson.md).

Every program has a part that runs on one worker whatever you do (reading the
configuration, a final merge): its *serial fraction* ``s``. Amdahl's law says what that
costs for a fixed amount of work on ``n`` workers, ``S(n) = 1 / (s + (1 - s) / n)``,
which can never pass ``1 / s``. Gustafson's law says what happens when the work grows
with the workers (a bigger grid, more data): the scaled speed-up ``S(n) = n - s (n - 1)``
keeps growing.

This script builds a job whose serial fraction is known (a serial step, then many
independent items on a pool of threads; the items wait rather than compute, as work on
GPUs or remote machines does, so eight workers fit on two cores), measures it with
``paralela.measure`` at 1, 2, 4 and 8 workers, fits both laws and prints the fitted
serial fraction against the one built in, and the predicted speed-ups against the
measured ones. A last part measures CPU-bound work on processes at 1 and 2 workers,
where the "serial fraction" also holds everything the machine adds (start-up, sending
items, other programs on the cores).

Run it:  python examples/lessons/amdahl_gustafson.py           (about a minute)
         python examples/lessons/amdahl_gustafson.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import math
import os
import time

import paralela

# The job: SERIAL seconds on one worker, then ITEMS items of ITEM seconds each.
SERIAL = 0.08
ITEMS = 16
ITEM = 0.02
BUILT_IN = SERIAL / (SERIAL + ITEMS * ITEM)  # the serial fraction on one worker: 0.2


def wait(seconds: float) -> None:
    """One item: it waits (a GPU kernel, a remote call), leaving the CPU free."""
    time.sleep(seconds)


def job(workers: int, scale: float = 1.0) -> None:
    """The serial step, then ``scale`` times ITEMS items on ``workers`` threads."""
    time.sleep(SERIAL)  # reading a configuration, a final merge: one worker only
    items = [ITEM] * round(ITEMS * scale)
    paralela.map(wait, items, workers=workers, backend="threads", chunksize=1)


def burn(n: int) -> float:
    """CPU-bound pure Python: ``n`` square roots."""
    return sum(math.sqrt(i) for i in range(n))


def cpu_job(workers: int) -> None:
    paralela.map(burn, [300_000] * 16, workers=workers, backend="processes")


def amdahl(s: float, n: int) -> float:
    return 1.0 / (s + (1.0 - s) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer counts and repeats (CI)")
    args = parser.parse_args()
    counts = [1, 2, 4] if args.quick else [1, 2, 4, 8]
    repeats = 1 if args.quick else 3
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(
        f"the job: {SERIAL} s serial, then {ITEMS} items of {ITEM} s; built-in s = {BUILT_IN:.2f}"
    )
    print()

    strong = paralela.measure(job, counts, repeats=repeats, oversubscribe=True, plot=False)
    assert strong.fit is not None
    s = strong.fit.serial_fraction
    print("Amdahl (strong scaling: the same job on more workers)")
    print(f"  {'workers':>7} {'median s':>9} {'measured':>9} {'fitted law':>11} {'built-in':>9}")
    for p in strong.points:
        law = amdahl(s, p.workers)
        print(
            f"  {p.workers:>7} {p.median:>9.3f} {p.speedup:>8.2f}x {law:>10.2f}x "
            f"{amdahl(BUILT_IN, p.workers):>8.2f}x"
        )
    low, high = strong.fit.ci_low, strong.fit.ci_high
    interval = f" ({low:.3f} to {high:.3f})" if low is not None and high is not None else ""
    print(f"  fitted s = {s:.3f}{interval}; no number of workers beats {1 / s:.1f}x")
    for prediction in strong.predictions:
        print(f"  predicted at {prediction.workers:>3} workers: {prediction.amdahl:.2f}x")
    print()

    weak = paralela.measure(job, counts, weak=True, repeats=repeats, oversubscribe=True, plot=False)
    assert weak.fit is not None
    g = weak.fit.serial_fraction
    print("Gustafson (weak scaling: the job grows with the workers)")
    print(f"  {'workers':>7} {'median s':>9} {'scaled speed-up':>16} {'n - s(n-1)':>11}")
    for p in weak.points:
        print(
            f"  {p.workers:>7} {p.median:>9.3f} {p.speedup:>15.2f}x "
            f"{p.workers - g * (p.workers - 1):>10.2f}x"
        )
    print(f"  fitted s = {g:.3f}; the scaled speed-up keeps growing with the workers")
    print()

    cpu = paralela.measure(cpu_job, [1, 2], repeats=repeats, oversubscribe=True, plot=False)
    print("CPU-bound work on processes (what your program meets on this machine)")
    for p in cpu.points:
        print(f"  {p.workers} worker(s): {p.median:.3f} s, speed-up {p.speedup:.2f}x")
    if cpu.fit is not None:
        print(
            f"  fitted s = {cpu.fit.serial_fraction:.3f}: start-up, sending items and "
            "other programs on the cores count as serial work"
        )
    print()
    top = strong.points[-1]
    print(
        f"RESULT: built-in serial fraction {BUILT_IN:.2f}, fitted {s:.3f} (Amdahl) and "
        f"{g:.3f} (Gustafson); at {top.workers} workers measured {top.speedup:.2f}x vs "
        f"predicted {amdahl(s, top.workers):.2f}x; ceiling 1/s = {1 / s:.1f}x"
    )
    print(
        "Conclusion: measure a few worker counts, fit s, and you know the most that more "
        "workers can give a fixed job (1/s), and how far a growing job can go."
    )


if __name__ == "__main__":
    main()
