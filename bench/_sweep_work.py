"""Objectives for the sweep benchmark (``bench_sweep.py``), and a command-trial script.

Two objectives, as in the peers' anchor figures for sweeps (measured on 2 cores):

- ``sleep``: ``time.sleep(seconds)``;
- ``cpu``: a pure-Python LCG loop that runs until *its own thread* has used ``seconds``
  of CPU (``time.thread_time``). Every trial costs the same CPU; two such trials sharing
  one GIL need about twice the wall time each.

Both return ``value(params)``, a smooth function of ``x`` in [-10, 10], ``lr`` in
[1e-5, 1] (log scale) and ``layers`` in {1..4} whose optimum is 0.01 (x=3, lr=1e-3,
layers=2). Random search over 200 points lands around 0.1-0.5; TPE gets close to 0.01.

The trial length and the stamps file come from the environment (``SWEEP_TRIAL_S``,
``SWEEP_STAMPS``), which the benchmark's child sets and every engine's workers inherit
(thread, forked or spawned process, Ray worker, paralela worker). Each call appends one
line ``t0 t1 value pid`` (``time.time()`` at the start and end of the objective) to the
stamps file with ``O_APPEND``, so concurrent writers never interleave; the benchmark
reads it for the mean trial time, the peak concurrency and the time to the first trial.

Run as a script it is a command trial (each trial a fresh Python process)::

    python bench/_sweep_work.py --objective sleep --seconds 0.5 --stamps FILE \\
        --x {x} --lr {lr} --layers {layers}

It computes the value, then hands it to ``paralela.report(value)`` and prints nothing
else (if ``paralela.report`` does not exist yet it prints the value instead).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

DEFAULT_SECONDS = 0.5
ENV_SECONDS = "SWEEP_TRIAL_S"
ENV_STAMPS = "SWEEP_STAMPS"

# The search space, in paralela's file format; the peers' spaces are built from it.
SPACE: dict[str, dict[str, Any]] = {
    "x": {"type": "float", "low": -10.0, "high": 10.0},
    "lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
    "layers": {"type": "int", "low": 1, "high": 4},
}
OPTIMUM = 0.01

# LCG steps between two looks at the thread's CPU clock (~0.1 ms of work, so a trial
# overshoots its CPU budget by at most that much).
_CPU_CHUNK = 2_000


def value(params: dict[str, Any]) -> float:
    """Smooth bowl with its minimum, 0.01, at x=3, lr=1e-3, layers=2."""
    x = float(params["x"])
    lr = float(params["lr"])
    layers = int(params["layers"])
    return OPTIMUM + (x - 3.0) ** 2 + (math.log10(lr) + 3.0) ** 2 + (layers - 2) ** 2


def trial_seconds() -> float:
    return float(os.environ.get(ENV_SECONDS, DEFAULT_SECONDS))


def burn_cpu(seconds: float, seed: int = 12345) -> int:
    """Pure-Python loop until this thread has used ``seconds`` of CPU (holds the GIL)."""
    deadline = time.thread_time() + seconds
    s = seed
    while time.thread_time() < deadline:
        for _ in range(_CPU_CHUNK):
            s = (s * 1_103_515_245 + 12_345) & 0x7FFFFFFF
    return s


def _stamp(t0: float, t1: float, v: float, stamps: str | None) -> None:
    path = stamps if stamps is not None else os.environ.get(ENV_STAMPS)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{t0:.6f} {t1:.6f} {v:.9g} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def sleep_objective(params: dict[str, Any]) -> float:
    """``time.sleep(SWEEP_TRIAL_S)``, then the value."""
    t0 = time.time()
    time.sleep(trial_seconds())
    v = value(params)
    _stamp(t0, time.time(), v, None)
    return v


def cpu_objective(params: dict[str, Any]) -> float:
    """``SWEEP_TRIAL_S`` of this thread's CPU in a pure-Python loop, then the value."""
    t0 = time.time()
    burn_cpu(trial_seconds())
    v = value(params)
    _stamp(t0, time.time(), v, None)
    return v


OBJECTIVES: dict[str, Callable[[dict[str, Any]], float]] = {
    "sleep": sleep_objective,
    "cpu": cpu_objective,
}


# Steps of the reporting objective: each reports its value and asks the pruner.
REPORT_STEPS = 100


def reporting_objective(trial: Any) -> float:
    """A define-by-run (Optuna-style) objective that only reports: ``REPORT_STEPS``
    times ``trial.report(value, step)`` then ``trial.should_prune()``, no other work, so
    its time is the cost of reporting. Every trial reports the same curve (1 / (step+1)),
    so a median pruner never prunes and every trial makes every report; the result is
    ``value(params)``."""
    params = {
        "x": trial.suggest_float("x", -10.0, 10.0),
        "lr": trial.suggest_float("lr", 1e-5, 1.0, log=True),
        "layers": trial.suggest_int("layers", 1, 4),
    }
    for step in range(REPORT_STEPS):
        trial.report(1.0 / (step + 1), step)
        if trial.should_prune():
            import optuna

            raise optuna.TrialPruned()
    return value(params)


def ray_trainable(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: ``config["objective"]`` names the objective."""
    from ray import tune

    v = OBJECTIVES[config["objective"]](config)
    tune.report({"value": v})


def _command_trial(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="one command trial of the sweep benchmark")
    ap.add_argument("--objective", choices=sorted(OBJECTIVES), required=True)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--stamps", default=None)
    ap.add_argument("--x", type=float, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--layers", type=int, required=True)
    args = ap.parse_args(argv)
    import paralela  # as a user's training script would (cheap: lazy imports)

    seconds = args.seconds if args.seconds is not None else trial_seconds()
    params = {"x": args.x, "lr": args.lr, "layers": args.layers}
    t0 = time.time()
    if args.objective == "sleep":
        time.sleep(seconds)
    else:
        burn_cpu(seconds)
    v = value(params)
    _stamp(t0, time.time(), v, args.stamps)
    report = getattr(paralela, "report", None)
    if callable(report):
        report(v)
    else:
        print(v)
    return 0


if __name__ == "__main__":
    raise SystemExit(_command_trial())
