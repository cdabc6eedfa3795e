"""Shared by the compare engine tests: estimators that note their fits or misbehave.

Worker processes import this module (it is on the driver's ``sys.path``), so it
imports nothing heavy at module level beyond scikit-learn's base classes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.neighbors import KNeighborsClassifier

FITS_VARIABLE = "COMPARE_TEST_FITS"  # a file: one JSON line per fit


class CountingKNN(KNeighborsClassifier):  # type: ignore[misc]
    """A k-nearest-neighbours classifier that notes each fit (which parameters, which
    training rows) in ``$COMPARE_TEST_FITS`` and takes ``delay`` seconds more."""

    def __init__(self, n_neighbors: int = 5, delay: float = 0.0) -> None:
        super().__init__(n_neighbors=n_neighbors)
        self.delay = delay

    def fit(self, X: Any, y: Any) -> CountingKNN:
        path = os.environ.get(FITS_VARIABLE)
        if path:
            line = json.dumps({"k": self.n_neighbors, "rows": float(np.asarray(X).sum())})
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode() + b"\n")
            finally:
                os.close(fd)
        if self.delay:
            time.sleep(self.delay)
        super().fit(X, y)
        return self


def fits(path: Any) -> list[tuple[int, float]]:
    """The fits noted in ``path``: (n_neighbors, sum of the training rows) each."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [(d["k"], d["rows"]) for d in map(json.loads, text.splitlines())]


class Exploding(ClassifierMixin, BaseEstimator):  # type: ignore[misc]
    """Fails to fit when ``explode`` is true; else predicts the most frequent class."""

    def __init__(self, explode: bool = False) -> None:
        self.explode = explode

    def fit(self, X: Any, y: Any) -> Exploding:
        if self.explode:
            raise ValueError("boom: this candidate cannot be fitted")
        values, counts = np.unique(y, return_counts=True)
        self.classes_ = values
        self.majority_ = values[np.argmax(counts)]
        return self

    def predict(self, X: Any) -> Any:
        return np.full(len(X), self.majority_)


class NoFit:
    """Has predict but no fit: not an estimator."""

    def predict(self, X: Any) -> Any:
        return np.zeros(len(X))


def make_no_fit(params: dict[str, Any]) -> NoFit:
    return NoFit()


class Crashing(ClassifierMixin, BaseEstimator):  # type: ignore[misc]
    """Kills its worker process while fitting: always, or with a ``marker`` path only in
    the one fit that creates that file (``O_EXCL``: one fit wins, however many run at
    once); otherwise predicts the most frequent class."""

    def __init__(self, marker: str = "") -> None:
        self.marker = marker

    def fit(self, X: Any, y: Any) -> Crashing:
        crash = True
        if self.marker:
            try:
                os.close(os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                crash = False
        if crash:
            os._exit(3)
        values, counts = np.unique(y, return_counts=True)
        self.classes_ = values
        self.majority_ = values[np.argmax(counts)]
        return self

    def predict(self, X: Any) -> Any:
        return np.full(len(X), self.majority_)
