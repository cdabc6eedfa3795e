"""The compare step of ``paralela demo``: four model families on the digits data set,
cross-validated on every slot at once, the winner checked against scikit-learn.

Each (candidate, fold) pair is a task; the best candidate's fold scores are then
computed again serially with ``cross_val_score`` on the same folds, and must agree to
1e-9 (the demo fails otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.comparing import CandidateRecord

__all__ = ["DEFAULT_FOLDS", "CompareDemoResult", "demo_families", "run_compare_demo"]

DEFAULT_FOLDS = 5


def demo_families() -> dict[str, Any]:
    """The families and grids of the demo: 10 candidates (scikit-learn estimators)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.svm import SVC

    return {
        "logreg": (LogisticRegression(max_iter=1000), {"C": [0.01, 0.1, 1.0]}),
        "knn": (KNeighborsClassifier(), {"n_neighbors": [1, 3, 5]}),
        "forest": (
            RandomForestClassifier(n_estimators=50, random_state=0),
            {"max_depth": [8, None]},
        ),
        "svm": (SVC(gamma="scale"), {"C": [1.0, 10.0]}),
    }


@dataclass(frozen=True)
class CompareDemoResult:
    candidates: int
    complete: int
    pruned: int
    failed: int
    folds: int
    slots: int
    wall_seconds: float
    best_by_family: dict[str, CandidateRecord]  # a pruned one says how many folds it ran
    best_family: str | None
    best_params: dict[str, Any] | None
    best_mean: float | None
    serial_scores: list[float]  # the best candidate's folds, by cross_val_score
    paralela_scores: list[float]
    run_dir: Path

    @property
    def scores_equal(self) -> bool:
        return len(self.serial_scores) == len(self.paralela_scores) and all(
            abs(a - b) <= 1e-9
            for a, b in zip(self.serial_scores, self.paralela_scores, strict=False)
        )


def run_compare_demo(
    folds: int = DEFAULT_FOLDS, workers: int | None = None, *, run_dir: Path
) -> CompareDemoResult:
    """Compare the demo's families on digits with ``folds``-fold cross-validation."""
    from paralela.demos._sweep_demo import require_extras

    # scikit-learn's models and folds, the space's classes; no torch, unlike the sweep
    require_extras((("sklearn", "examples"), ("optuna", "sweep")), "The compare demo")
    from sklearn.base import clone
    from sklearn.datasets import load_digits
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    import paralela

    X, y = load_digits(return_X_y=True)
    X = X / 16.0  # pixels in [0, 1]: the linear models converge
    cv = StratifiedKFold(folds)
    t0 = time.perf_counter()
    result = paralela.compare(
        demo_families(), X, y, cv=cv, workers=workers, refit=True, run_dir=run_dir, progress=False
    )
    wall = time.perf_counter() - t0
    best = result.best
    serial: list[float] = []
    if best is not None:
        estimator, _ = demo_families()[best.family]
        model = clone(estimator).set_params(**best.params)
        serial = [float(s) for s in cross_val_score(model, X, y, cv=cv)]
    states = [c.state for c in result.candidates]
    return CompareDemoResult(
        candidates=len(states),
        complete=states.count("COMPLETE"),
        pruned=states.count("PRUNED"),
        failed=states.count("FAIL"),
        folds=folds,
        slots=result.slots,
        wall_seconds=wall,
        best_by_family=dict(result.families()),
        best_family=None if best is None else best.family,
        best_params=None if best is None else dict(best.params),
        best_mean=None if best is None else best.mean,
        serial_scores=serial,
        paralela_scores=[] if best is None else [float(s or 0.0) for s in best.fold_scores],
        run_dir=Path(run_dir),
    )
