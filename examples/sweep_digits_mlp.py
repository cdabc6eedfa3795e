"""Tune a small PyTorch MLP on scikit-learn's digits with a hyperparameter sweep.

The model, data and training loop live in ``paralela.demos._digits``: a two-layer
perceptron on 8x8 images of digits, with the learning rate ``lr``, the hidden width
``hidden`` and the batch size ``batch_size`` to tune, and the validation loss to
minimise. One trial of 8 epochs trains in about 0.15 s on one CPU thread, after about
3 s of start-up per process (importing torch and scikit-learn). The search space is
``sweep_space.yaml`` next to this file. Needs torch and scikit-learn.

The script runs in two ways:

1. One trial, as a command (what a command trial of ``paralela sweep`` runs)::

       python examples/sweep_digits_mlp.py --lr 0.01 --hidden 64 --batch-size 32 [--epochs 8]

   It trains once, reports the validation loss after every epoch with
   ``paralela.report(val_loss, step=epoch)`` (epochs counted from 0), and prints
   ``val_loss X`` at the end. Outside a sweep ``paralela.report`` only prints the value;
   on a version of paralela without it, the script prints ``epoch N val_loss X``
   instead. Bad parameters make it exit with status 2 and a message.

2. A whole sweep, driven from Python::

       python examples/sweep_digits_mlp.py --sweep [--trials 8] [--run-dir DIR]

   ``paralela.sweep`` runs the trials in parallel, each one ``train_trial(params)``, and
   the median pruner stops a trial whose loss after an epoch is worse than the median
   of the earlier trials at that epoch. The run directory
   (``paralela-runs/sweep_digits_mlp`` in the current directory by default) keeps the
   study, a log per trial, ``trials.csv`` and plots; running the command again goes on
   where it stopped, and ``--trials`` counts the earlier trials too. It prints how many
   trials completed or were pruned, and the best parameters with their loss.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paralela
from paralela.demos._digits import DEFAULT_PARAMS, train
from paralela.errors import ConfigError

SPACE = Path(__file__).resolve().with_name("sweep_space.yaml")


def train_trial(params: dict[str, Any]) -> float:
    """One trial of the sweep: train with ``params``, report every epoch's loss.

    ``paralela.report`` raises ``TrialPruned`` when the pruner stops the trial; it
    propagates, and the sweep records the trial as pruned.
    """
    return train(params, report=paralela.report)


def print_report(val_loss: float, epoch: int) -> None:
    print(f"epoch {epoch} val_loss {val_loss:.4f}", flush=True)


def epoch_reporter() -> Callable[[float, int], None]:
    """``paralela.report`` where this version of paralela has it, else a print."""
    report = getattr(paralela, "report", None)
    if report is None:
        return print_report

    def send(val_loss: float, epoch: int) -> None:
        report(val_loss, step=epoch)

    return send


def run_one(args: argparse.Namespace) -> None:
    params = {
        "lr": args.lr,
        "hidden": args.hidden,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
    }
    val_loss = train(params, report=epoch_reporter())
    print(f"val_loss {val_loss:.6f}")


def run_sweep(args: argparse.Namespace) -> None:
    result = paralela.sweep(
        train_trial,
        SPACE,
        n_trials=args.trials,
        direction="minimize",
        pruner="median",
        run_dir=args.run_dir,
    )
    states = Counter(trial.state for trial in result.trials)
    print(f"{len(result.trials)} trials in {result.run_dir}: {dict(sorted(states.items()))}")
    if result.best_trial is None:
        raise SystemExit("no trial completed; see the trial logs in the run directory")
    print(f"best parameters: {result.best_params}")
    print(f"best val_loss: {result.best_value:.6f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train an MLP on the digits once, or sweep its hyperparameters."
    )
    one = parser.add_argument_group("one trial")
    one.add_argument("--lr", type=float, default=DEFAULT_PARAMS["lr"])
    one.add_argument("--hidden", type=int, default=DEFAULT_PARAMS["hidden"])
    one.add_argument("--batch-size", type=int, default=DEFAULT_PARAMS["batch_size"])
    one.add_argument("--epochs", type=int, default=DEFAULT_PARAMS["epochs"])
    many = parser.add_argument_group("a sweep")
    many.add_argument("--sweep", action="store_true", help="run a sweep over sweep_space.yaml")
    many.add_argument("--trials", type=int, default=8, help="trials of the sweep (default 8)")
    many.add_argument(
        "--run-dir",
        type=Path,
        default=Path("paralela-runs") / "sweep_digits_mlp",
        help="where the sweep keeps its study (default paralela-runs/sweep_digits_mlp)",
    )
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.sweep:
            run_sweep(args)
        else:
            run_one(args)
    except ConfigError as exc:
        print(f"sweep_digits_mlp.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
