"""Lesson 4: early stopping (pruning) in a sweep (docs/lessons/early-stopping.md).

Most trials of a hyperparameter search are bad, and most of them look bad early: after
a few epochs their loss is already far above what the good trials reached at the same
epoch. A *pruner* compares each trial's intermediate value (``paralela.report(loss,
step=epoch)``) with the other trials' at the same step and stops the hopeless ones, so
their slot takes the next trial at once.

This script runs the same sweep twice, with the same seed and so the same trials in the
same order: without a pruner, and with the median pruner (a trial is stopped when its
loss is worse than the median of the earlier trials' losses at the same epoch). Each
trial trains a small linear model by gradient descent on a fixed regression problem
(numpy), one epoch per step, with a learning rate and a weight decay from the space.
It prints trials completed and pruned, epochs run, wall time, and the best trial of
each sweep.

Run it:  python examples/lessons/early_stopping.py           (about a minute)
         python examples/lessons/early_stopping.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import paralela

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 0.5, "log": True},
    "decay": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
}


def objective(params: dict[str, Any]) -> float:
    """Train a linear model by full-batch gradient descent; report the loss each epoch."""
    epochs = int(os.environ["LESSON_EPOCHS"])
    rng = np.random.default_rng(0)  # the same problem in every trial
    x = rng.normal(size=(4000, 100))
    true_w = rng.normal(size=100)
    y = x @ true_w + rng.normal(scale=0.5, size=4000)
    w = np.zeros(100)
    loss = float("inf")
    for epoch in range(epochs):
        for _ in range(10):  # ten gradient steps make an epoch
            grad = x.T @ (x @ w - y) / len(y) + params["decay"] * w
            w -= params["lr"] * grad
        loss = float(np.mean((x @ w - y) ** 2))
        if not np.isfinite(loss):
            loss = 1e6  # a diverged run: report a large loss, do not stop the sweep
        paralela.report(loss, step=epoch)  # raises TrialPruned when the pruner says stop
    return loss


def run(pruner: str, n_trials: int, root: Path) -> tuple[float, Any]:
    start = time.perf_counter()
    result = paralela.sweep(
        objective,
        SPACE,
        n_trials=n_trials,
        sampler="random",
        seed=1,
        pruner=pruner,
        workers=2,
        run_dir=root / pruner,
        plots=False,
        progress=False,
    )
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and epochs (CI)")
    args = parser.parse_args()
    n_trials = 12 if args.quick else 40
    epochs = 10 if args.quick else 30
    os.environ["LESSON_EPOCHS"] = str(epochs)  # trial workers inherit the environment
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{n_trials} trials of up to {epochs} epochs, 2 at a time, random sampler, seed 1\n")

    root = Path(tempfile.mkdtemp(prefix="paralela-lesson-pruning-"))
    try:
        rows = []
        for pruner in ("none", "median"):
            seconds, result = run(pruner, n_trials, root)
            states = [t.state for t in result.trials]
            epochs_run = sum(len(t.intermediate) for t in result.trials)
            rows.append(
                (
                    pruner,
                    states.count("COMPLETE"),
                    states.count("PRUNED"),
                    epochs_run,
                    seconds,
                    result.best_value,
                    result.best_trial.number,
                )
            )
        header = (
            f"{'pruner':<8} {'complete':>8} {'pruned':>7} {'epochs run':>11} {'wall s':>7} "
            f"{'best loss':>10} {'best trial':>10}"
        )
        print(header)
        print("-" * len(header))
        for pruner, done, pruned, epochs_run, seconds, best, number in rows:
            print(
                f"{pruner:<8} {done:>8} {pruned:>7} {epochs_run:>11} {seconds:>7.2f} "
                f"{best:>10.4f} {number:>10}"
            )
        none, median = rows
        same = none[6] == median[6] and abs(none[5] - median[5]) < 1e-9
        print()
        print(
            f"RESULT: the median pruner stopped {median[2]} of {n_trials} trials, ran "
            f"{median[3]} of {none[3]} epochs ({median[3] / none[3]:.0%}) in {median[4]:.1f} s "
            f"vs {none[4]:.1f} s; best trial "
            f"{'the same' if same else 'DIFFERENT'} (#{median[6]}, loss {median[5]:.4f})"
        )
        print(
            "Conclusion: pruning stops the trials that are already behind, so the same "
            "search costs fewer epochs and finds the same best trial (when the best trial "
            "does not start slowly: a pruner bets that early losses rank trials well)."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
