"""Shared by the compare tests: a small real data set written as a CSV file."""

from __future__ import annotations

import csv
from pathlib import Path

from sklearn.datasets import load_wine


def write_wine_csv(path: Path, target: str = "label") -> Path:
    """sklearn's wine data (178 rows, 13 features, 3 classes) as ``path``; the class is
    the last column, named ``target``."""
    wine = load_wine()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*wine.feature_names, target])
        for row, label in zip(wine.data, wine.target, strict=True):
            writer.writerow([*(repr(float(v)) for v in row), int(label)])
    return path
