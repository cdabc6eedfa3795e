"""The grid that ``bench_compare.py`` searches, defined once for every engine.

Five model families on scikit-learn's digits (1,797 images of 8x8 pixels, 10 classes,
pixels scaled to [0, 1]), each with its own grid; 5-fold ``StratifiedKFold`` without
shuffling (what ``GridSearchCV(cv=5)`` does for a classifier) and accuracy. Every
estimator that draws random numbers has a fixed ``random_state``, so two engines that fit
the same candidate on the same fold get the same score.

``families(quick)`` returns ``{name: (estimator, grid)}``: the form ``paralela.compare``
and ``GridSearchCV`` both take. The ``--quick`` grid is small and cheap (a smoke run).
The MLlib equivalents are in ``bench_compare.py``'s Spark child.
"""

from __future__ import annotations

import json
from typing import Any

SEED = 0
FOLDS = 5

# The full grid: 5 + 9 + 6 + 8 + 6 = 34 candidates, 170 fits; one exhaustive
# GridSearchCV(n_jobs=2) pass takes about 60-90 s on an idle 2-core VM.
FULL: dict[str, dict[str, list[Any]]] = {
    "logreg": {"C": [0.01, 0.1, 1.0, 10.0, 100.0]},
    "forest": {"n_estimators": [100, 300, 500], "max_depth": [None, 10, 20]},
    "gbm": {"learning_rate": [0.05, 0.1, 0.2], "max_iter": [100, 200]},
    "svm": {"C": [0.1, 1.0, 10.0, 100.0], "kernel": ["rbf", "poly"]},
    "mlp": {"hidden_layer_sizes": [64, 128, 256], "alpha": [1e-4, 1e-2]},
}
# --quick: 2 candidates a family, cheap settings.
QUICK: dict[str, dict[str, list[Any]]] = {
    "logreg": {"C": [0.1, 10.0]},
    "forest": {"n_estimators": [20], "max_depth": [None, 10]},
    "gbm": {"learning_rate": [0.1], "max_iter": [10, 20]},
    "svm": {"C": [1.0, 10.0]},
    "mlp": {"hidden_layer_sizes": [32], "alpha": [1e-4, 1e-2]},
}


def estimators(quick: bool) -> dict[str, Any]:
    """A fresh, unfitted base estimator per family (the grid's values are set on it)."""
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import SVC

    return {
        "logreg": LogisticRegression(max_iter=5000),
        "forest": RandomForestClassifier(random_state=SEED),
        "gbm": HistGradientBoostingClassifier(random_state=SEED),
        "svm": SVC(),
        "mlp": MLPClassifier(max_iter=60 if quick else 300, random_state=SEED),
    }


def grids(quick: bool) -> dict[str, dict[str, list[Any]]]:
    return QUICK if quick else FULL


def families(quick: bool) -> dict[str, tuple[Any, dict[str, list[Any]]]]:
    """``{name: (estimator, grid)}``, the families in a fixed order."""
    est = estimators(quick)
    return {name: (est[name], grid) for name, grid in grids(quick).items()}


def n_candidates(quick: bool) -> int:
    total = 0
    for grid in grids(quick).values():
        n = 1
        for values in grid.values():
            n *= len(values)
        total += n
    return total


def family_of(estimator: Any) -> str:
    """The family name of an estimator instance (the Pipeline peer's ``model`` step)."""
    names = {type(e).__name__: name for name, e in estimators(True).items()}
    return names[type(estimator).__name__]


def data() -> tuple[Any, Any]:
    """Digits, pixels scaled to [0, 1] (a fixed scaling: nothing is fitted before the CV)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def cv() -> Any:
    from sklearn.model_selection import StratifiedKFold

    return StratifiedKFold(n_splits=FOLDS)


def plain(value: Any) -> Any:
    """``value`` as JSON-able Python: tuples and numpy scalars become lists and numbers."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def key(family: str, params: dict[str, Any]) -> str:
    """One candidate as a canonical string: family and its params, sorted, JSON."""
    return family + " " + json.dumps(plain(params), sort_keys=True)
