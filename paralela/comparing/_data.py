"""A CSV table as the arrays a comparison fits: ``X`` (float64), ``y`` and the names.

::

    data.csv ──bytes──> UTF-8 text (else: the byte offset and line of the first bad byte)
             ──csv────> header + rows (a row of another length: its line)
             ──target─> y: numbers (int64 when every value is whole) or the text labels
                        (a missing one, empty or NA/NaN: refused, naming the lines)
             ──rest───> X: float64, empty cells and NA/NaN/null as NaN; text: its column and line

The task follows the target (:func:`is_classification`): text or true/false labels, or
whole numbers with at most :data:`MAX_CLASSES` distinct values, are classes; anything else
is a regression target. Missing feature values stay NaN: HistGradientBoosting (alias
``gbm``) handles them, other estimators refuse them when fitting (impute first, e.g. a
``SimpleImputer`` in a pipeline). Text features are refused: encode them as numbers first.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from paralela.errors import ConfigError, did_you_mean

__all__ = ["MAX_CLASSES", "MISSING", "is_classification", "load_table"]

# A target of whole numbers with at most this many distinct values is a class label (a
# digit, a rating, a category code); more values read as a count or a measure.
MAX_CLASSES = 20
MISSING = frozenset({"", "na", "n/a", "nan", "null", "none"})  # lower-cased cells read as NaN
SHOWN_LINES = 5  # lines named when several rows have no target


def _text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"Data file not found: {str(path)!r} (relative paths start at {os.getcwd()}). "
            "Check the path."
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; give the CSV file in it.") from None
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8 text: byte {exc.start} (line {line}) is "
            f"0x{raw[exc.start]:02x} ({exc.reason}). Save the file as UTF-8, e.g. "
            f"iconv -f latin1 -t utf-8 {path.name} > utf8-{path.name}."
        ) from None


def _rows(text: str, path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(text), strict=True)
    rows: list[tuple[int, list[str]]] = []
    header: list[str] | None = None
    start = 1  # the line the row being read starts on
    try:
        for row in reader:
            line, start = start, reader.line_num + 1
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line
            if header is None:
                header = [cell.strip() for cell in row]
            else:
                rows.append((line, row))
    except csv.Error as exc:
        raise ConfigError(
            f'{path}, line {start}: {exc}; quote a value holding a comma as "a,b".'
        ) from None
    if header is None:
        raise ConfigError(
            f"{path} is empty; its first line must name the columns (one of them the "
            "target) and each following line hold one example."
        )
    return header, rows


def _column(header: list[str], target: str, path: Path) -> int:
    for column, name in enumerate(header):
        if not name:
            raise ConfigError(f"{path}, line 1: column {column + 1} has no name; name it.")
        if header.index(name) != column:
            raise ConfigError(f"{path}, line 1: column {name!r} appears twice; rename one.")
    if target in header:
        return header.index(target)
    hint = did_you_mean(target, header)
    raise ConfigError(
        f"{path} has no column {target!r}.{hint} Its columns are: {', '.join(header)}. "
        "Pass the name of the column to predict as --target (target=)."
    )


def _number(cell: str) -> float | None:
    """The cell as a float (NaN when missing), or None when it is text."""
    text = cell.strip()
    if text.lower() in MISSING:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def load_table(
    path: str | os.PathLike[str], target: str
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[str]]:
    """Read a CSV file with a header line into ``(X, y, feature_names)``.

    ``X`` holds every column but ``target``, as float64, with empty cells (and ``NA``,
    ``N/A``, ``NaN``, ``null``, ``None``) as NaN. ``y`` is int64 when every target value
    is a whole number, float64 for other numbers, and the labels as strings when any is
    text. ``feature_names`` are the header's names of ``X``'s columns, in order.

    Raises:
        ConfigError: the file is missing, not UTF-8 (names the byte offset and line), has
            no such target column (lists the columns), a row of the wrong length, a
            missing or infinite target, a text or infinite feature value (names the
            column and the line), or no row.
    """
    path = Path(path)
    header, rows = _rows(_text(path), path)
    t = _column(header, target, path)
    if not rows:
        raise ConfigError(f"{path} has a header but no rows; add one example per line.")
    if len(header) < 2:
        raise ConfigError(f"{path} has only the target column {target!r}; add the feature columns.")
    width = len(header)
    for line, row in rows:
        if len(row) != width:
            raise ConfigError(
                f"{path}, line {line}: has {len(row)} values but the header names {width} "
                "columns; fix that row (a value with a comma needs quotes)."
            )
    features = [c for c in range(width) if c != t]
    X = np.empty((len(rows), len(features)), dtype=np.float64)
    for j, c in enumerate(features):
        try:  # every cell a number: one pass of float() (which skips spaces)
            X[:, j] = [float(row[c]) for _, row in rows]
        except ValueError:  # missing values, or text: cell by cell
            for i, (_, row) in enumerate(rows):
                value = _number(row[c])
                X[i, j] = math.inf if value is None else value
        bad = np.flatnonzero(np.isinf(X[:, j]))
        if bad.size:
            line, row = rows[int(bad[0])]
            what = "text" if _number(row[c]) is None else "an infinite value"
            raise ConfigError(
                f"{path}, line {line}, column {header[c]!r}: {row[c].strip()!r} is "
                f"{what}; features must be numbers (empty cells are missing values). "
                f"Encode {header[c]!r} as numbers (one column per category, or a code "
                "per category), or drop the column."
            )
    return (
        X,
        _target([(line, row[t]) for line, row in rows], target, path),
        [header[c] for c in features],
    )


def _target(cells: list[tuple[int, str]], name: str, path: Path) -> np.ndarray[Any, Any]:
    missing = [(line, cell.strip()) for line, cell in cells if cell.strip().lower() in MISSING]
    if missing:
        raise ConfigError(_missing_target(missing, name, path))
    values: list[float] = []
    for line, cell in cells:
        value = _number(cell)
        if value is None:  # a text label: every value is a label
            return np.array([cell.strip() for _, cell in cells], dtype=str)
        if not math.isfinite(value):
            raise ConfigError(
                f"{path}, line {line}: the target {name!r} is {cell.strip()!r}; give a "
                "finite number or a label (drop the rows without one)."
            )
        values.append(value)
    y = np.array(values, dtype=np.float64)
    if np.all(y == np.round(y)) and np.all(np.abs(y) < 2**53):
        return y.astype(np.int64)
    return y


def _missing_target(missing: list[tuple[int, str]], name: str, path: Path) -> str:
    """Every row whose target is missing (an empty cell, NA, NaN...): the first
    :data:`SHOWN_LINES` lines, and how many more."""
    lines = [str(line) for line, _ in missing[:SHOWN_LINES]]
    if len(missing) > SHOWN_LINES:
        lines.append(f"{len(missing) - SHOWN_LINES} more")
    where = lines[0] if len(lines) == 1 else f"{', '.join(lines[:-1])} and {lines[-1]}"
    spelt = list(dict.fromkeys("empty" if not cell else repr(cell) for _, cell in missing))
    if len(missing) == 1:
        what = "empty" if not missing[0][1] else f"{spelt[0]}, a missing value"
        head = f"{path}, line {where}: the target {name!r} is {what}"
    else:
        head = f"{path}, lines {where}: the target {name!r} is missing ({', '.join(spelt)})"
    return (
        f"{head}; every row needs a class or a value to learn from: drop those rows, or "
        "fill them in (NA, N/A, NaN, null and None read as missing: rename a class spelt so)."
    )


def is_classification(y: np.ndarray[Any, Any]) -> bool:
    """Whether ``y`` holds classes: text or booleans, or whole numbers with at most
    :data:`MAX_CLASSES` distinct values. Other numbers are a regression target."""
    y = np.asarray(y)
    if y.dtype.kind in "USOb":
        return True
    if y.dtype.kind in "iu":
        return len(np.unique(y)) <= MAX_CLASSES
    if y.dtype.kind == "f":
        finite = y[np.isfinite(y)]
        whole = bool(np.all(finite == np.round(finite)))
        return whole and len(np.unique(finite)) <= MAX_CLASSES
    return False
