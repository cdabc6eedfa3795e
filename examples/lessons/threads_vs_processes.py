"""Lesson 2: threads vs processes and the GIL (docs/lessons/threads-vs-processes.md).

CPython runs Python bytecode in one thread at a time (the global interpreter lock, GIL).
Threads therefore speed up work that waits (I/O, sleeps) or that runs in C code which
releases the GIL (hashlib on large buffers, most of numpy), but not pure-Python
computation; processes speed up all of it, at the price of starting interpreters and
copying every argument and result between them. This script runs the same workloads on
``paralela.map``'s ``sequential``, ``threads`` and ``processes`` backends:

- pure Python (the GIL is held): square roots in a loop;
- hashlib on buffers made in the worker (the GIL is released);
- hashlib on buffers the caller holds (processes must copy each one to a worker);
- waiting (``time.sleep``, as a download or a disk read would);
- a short job on a fresh process pool (start-up included) against threads.

Run it:  python examples/lessons/threads_vs_processes.py           (about a minute)
         python examples/lessons/threads_vs_processes.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

import paralela
from paralela.backends import ProcessBackend

MIB = 1 << 20


def pure_python(n: int) -> float:
    """Holds the GIL all along: ``n`` square roots in a Python loop."""
    total = 0.0
    for i in range(n):
        total += math.sqrt(i)
    return total


def hash_new_buffer(size: int) -> str:
    """Makes a buffer of ``size`` bytes here and hashes it (hashlib releases the GIL)."""
    return hashlib.sha256(bytes(size)).hexdigest()


def hash_buffer(data: bytes) -> str:
    """Hashes a buffer it was given: a thread gets a reference, a process a copy."""
    return hashlib.sha256(data).hexdigest()


def wait(seconds: float) -> float:
    """Waits, as I/O does: the GIL is released while it sleeps."""
    time.sleep(seconds)
    return seconds


def best_time(run: Callable[[], Any], repeat: int) -> float:
    """The best wall time of ``repeat`` runs (a shared machine is noisy)."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_seconds() -> float:
    """CPU time (user + system) used so far by this process and its worker processes."""
    me = psutil.Process()
    total = float(sum(me.cpu_times()[:2]))
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += float(sum(child.cpu_times()[:2]))
    return total


def timed_run(run: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds of one run, and the cores it kept busy on average (CPU time / wall).

    Cores used is the steadier figure on a shared machine: threads running pure Python
    never pass 1.0, whatever else runs, because only one holds the GIL at a time.
    """
    cpu, start = cpu_seconds(), time.perf_counter()
    run()
    wall = time.perf_counter() - start
    return wall, (cpu_seconds() - cpu) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    quick = args.quick
    workers = 2
    repeat = 1 if quick else 3
    n = 8 if quick else 24
    buffers = [bytes([i]) * (16 * MIB) for i in range(n)]
    workloads: list[tuple[str, Callable[[Any], Any], list[Any]]] = [
        ("pure Python (GIL held)", pure_python, [1_000_000] * n),
        ("hashlib, buffer made in worker", hash_new_buffer, [16 * MIB] * n),
        ("hashlib, buffer from the caller", hash_buffer, buffers),
        ("waiting 50 ms (like I/O)", wait, [0.05] * n),
    ]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{n} items per workload, {workers} workers, best of {repeat}\n")
    # Start both pools once: the rows below compare the work, not the start-up.
    for backend in ("threads", "processes"):
        paralela.map(wait, [0.0] * workers, workers=workers, backend=backend)

    header = (
        f"{'workload':<33} {'loop s':>7} {'cores':>6} {'threads':>8} {'cores':>6} "
        f"{'processes':>10} {'cores':>6}"
    )
    print(header)
    print("-" * len(header))
    speedups: dict[str, tuple[float, float]] = {}
    for label, fn, items in workloads:
        # Repeats take turns (loop, threads, processes, loop, ...), so that a burst of
        # other work on a shared machine does not fall on one backend's runs only.
        best = dict.fromkeys(("sequential", "threads", "processes"), (math.inf, 0.0))
        for _ in range(repeat):
            for backend in best:
                run = functools.partial(paralela.map, fn, items, workers=workers, backend=backend)
                best[backend] = min(best[backend], timed_run(run))
        loop, l_cores = best["sequential"]
        (t_wall, t_cores), (p_wall, p_cores) = best["threads"], best["processes"]
        t, p = loop / t_wall, loop / p_wall
        speedups[label] = (t, p)
        print(
            f"{label:<33} {loop:>7.2f} {l_cores:>6.2f} {t:>7.2f}x {t_cores:>6.2f} {p:>9.2f}x "
            f"{p_cores:>6.2f}"
        )
    print("(speed-up over the plain loop, above 1x is faster; cores: CPU seconds per second)")
    print()

    # The caveat: a short job on a pool started for it. Threads start in microseconds; a
    # process pool starts interpreters, imports paralela and the function's modules, and
    # pickles every item and result.
    short = [1 * MIB] * (20 if quick else 40)
    fresh_loop = best_time(lambda: [hash_new_buffer(s) for s in short], repeat)
    fresh_threads = best_time(
        lambda: paralela.map(hash_new_buffer, short, workers=workers, backend="threads"), repeat
    )

    def on_fresh_pool() -> None:
        pool = ProcessBackend(workers)
        try:
            paralela.map(hash_new_buffer, short, backend=pool)
        finally:
            pool.shutdown(wait=True)

    fresh_processes = best_time(on_fresh_pool, repeat)
    print(f"short job: {len(short)} hashes of 1 MiB (the plain loop takes {fresh_loop:.3f} s)")
    print(f"  {'threads (already started)':<40} {fresh_threads:>7.3f} s")
    print(f"  {'a fresh process pool, start-up included':<40} {fresh_processes:>7.3f} s")
    print()
    gil_t, gil_p = speedups["pure Python (GIL held)"]
    io_t, io_p = speedups["waiting 50 ms (like I/O)"]
    print(
        f"RESULT: pure Python threads {gil_t:.2f}x vs processes {gil_p:.2f}x; waiting "
        f"threads {io_t:.2f}x vs processes {io_p:.2f}x; short job threads "
        f"{fresh_threads:.3f} s vs fresh process pool {fresh_processes:.3f} s"
    )
    print(
        "Conclusion: threads for waiting and GIL-releasing C code, processes for pure "
        "Python; a process pool pays for itself only when the work outlasts its start-up "
        "and the copying of data."
    )


if __name__ == "__main__":
    main()
