"""The sweep step of ``paralela demo``: tune a small PyTorch MLP on the digits data set.

One trial per slot (a GPU each where there are GPUs, a share of the CPUs otherwise),
the median pruner stopping hopeless trials after an epoch or two, everything in a fresh
run directory so that the demo always shows a whole sweep.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEMO_SPACE", "SweepDemoResult", "digits_trial", "run_sweep_demo"]

DEFAULT_TRIALS = 12
DEMO_SPACE: dict[str, Any] = {
    "lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True},
    "hidden": {"type": "int", "low": 16, "high": 128, "step": 16},
    "batch_size": {"type": "categorical", "choices": [16, 32, 64]},
    "epochs": 6,
}


def digits_trial(params: dict[str, Any]) -> float:
    """One trial: train, report each epoch's validation loss, return the last one."""
    import paralela
    from paralela.demos._digits import train

    return train(params, report=paralela.report)


def require_extras(needs: tuple[tuple[str, str], ...], purpose: str) -> None:
    """Fail before a step starts when a module it needs (``(module, extra)`` pairs) is
    missing, naming the extra that installs it."""
    import importlib.util

    from paralela.errors import MissingExtraError

    for module, extra in needs:
        if importlib.util.find_spec(module) is None:
            name = "scikit-learn" if module == "sklearn" else module
            raise MissingExtraError(name, extra, purpose)


@dataclass(frozen=True)
class SweepDemoResult:
    trials: int
    complete: int
    pruned: int
    failed: int
    slots: int
    wall_seconds: float
    busy_fraction: float
    best_value: float | None
    best_params: dict[str, Any] | None
    run_dir: Path


def run_sweep_demo(
    trials: int = DEFAULT_TRIALS, workers: int | None = None, run_dir: Path | None = None
) -> SweepDemoResult:
    """Run the demo sweep; ``run_dir`` defaults to a fresh temporary directory.

    Raises:
        MissingExtraError: torch, scikit-learn or optuna is not installed.
    """
    import paralela

    require_extras(
        (("torch", "torch"), ("sklearn", "examples"), ("optuna", "sweep")), "The sweep demo"
    )
    directory = run_dir or Path(tempfile.mkdtemp(prefix="paralela-demo-sweep-"))
    result = paralela.sweep(
        digits_trial,
        DEMO_SPACE,
        n_trials=trials,
        pruner="median",
        workers=workers,
        run_dir=directory,
        study_name="demo-digits-mlp",
        seed=0,
        progress=False,
    )
    states = [t.state for t in result.trials]
    return SweepDemoResult(
        trials=len(states),
        complete=states.count("COMPLETE"),
        pruned=states.count("PRUNED"),
        failed=states.count("FAIL"),
        slots=result.slots,
        wall_seconds=result.wall_seconds,
        busy_fraction=result.busy_fraction,
        best_value=result.best_value,
        best_params=result.best_params,
        run_dir=directory,
    )
