"""A comparison's CSV table: X, y and names, the task, and every bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from compare_helpers import write_wine_csv
from sklearn.datasets import load_wine

from paralela.comparing._data import MAX_CLASSES, is_classification, load_table
from paralela.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_wine_round_trips(tmp_path: Path) -> None:
    wine = load_wine()
    path = write_wine_csv(tmp_path / "wine.csv")
    X, y, names = load_table(path, "label")
    assert X.dtype == np.float64
    assert np.array_equal(X, wine.data)
    assert y.dtype == np.int64
    assert np.array_equal(y, wine.target)
    assert names == list(wine.feature_names)
    assert is_classification(y)


def test_target_in_any_column_and_missing_values(tmp_path: Path) -> None:
    path = write(tmp_path, "a,y,b\n1,0.5,\n2,1.5,NA\n, 2.25 ,3e2\n\n4,3,nan\n")
    X, y, names = load_table(path, "y")
    assert names == ["a", "b"]
    assert y.dtype == np.float64
    assert y.tolist() == [0.5, 1.5, 2.25, 3.0]
    assert X[0, 0] == 1.0
    assert math.isnan(X[0, 1])
    assert math.isnan(X[1, 1])
    assert math.isnan(X[2, 0])
    assert X[2, 1] == 300.0
    assert not is_classification(y)


def test_text_labels_are_kept_as_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "x,species\n1,setosa\n2, virginica\n3,1\n")
    _, y, _ = load_table(path, "species")
    assert y.tolist() == ["setosa", "virginica", "1"]
    assert is_classification(y)


def test_the_task_rule() -> None:
    assert is_classification(np.array([0, 1, 1, 0]))
    assert is_classification(np.array([True, False]))
    assert is_classification(np.array([1.0, 2.0, 3.0]))
    assert is_classification(np.arange(MAX_CLASSES))
    assert not is_classification(np.arange(MAX_CLASSES + 1))  # a count, not classes
    assert not is_classification(np.array([0.5, 1.0]))


def test_a_utf8_bom_and_quoted_values(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(b'\xef\xbb\xbf"a",label\n"1.5",yes\n2,no\n')
    X, y, names = load_table(path, "label")
    assert names == ["a"]
    assert X[:, 0].tolist() == [1.5, 2.0]
    assert y.tolist() == ["yes", "no"]


def test_unknown_target_lists_the_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "alcohol,labe\n1,0\n")
    with pytest.raises(
        ConfigError,
        match=r"no column 'label'\. Did you mean 'labe'\? Its columns are: alcohol, labe",
    ):
        load_table(path, "label")


def test_a_text_feature_names_the_column_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a,color,label\n1,2,0\n\n3,red,1\n4,blue,0\n")
    with pytest.raises(ConfigError, match=r"line 4, column 'color': 'red' is text.*Encode 'color'"):
        load_table(path, "label")


def test_an_infinite_feature(tmp_path: Path) -> None:
    path = write(tmp_path, "a,label\ninf,0\n")
    with pytest.raises(ConfigError, match=r"line 2, column 'a': 'inf' is an infinite value"):
        load_table(path, "label")


def test_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("a,label\n1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=r"not UTF-8 text: byte 13 \(line 2\) is 0xe9.*Save the file as UTF-8"
    ):
        load_table(path, "label")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"is empty; its first line must name the columns"),
        ("a,label\n", r"has a header but no rows"),
        ("label\n1\n", r"has only the target column 'label'"),
        ("a,label\n1,2,3\n", r"line 2: has 3 values but the header names 2 columns"),
        ("a,a,label\n1,2,3\n", r"column 'a' appears twice"),
        ("a,,label\n1,2,3\n", r"column 2 has no name"),
        ("a,label\n1,\n", r"line 2: the target 'label' is empty"),
        ("a,label\n1,NA\n", r"line 2: the target 'label' is 'NA', a missing value"),
        ("a,label\n1,inf\n", r"line 2: the target 'label' is 'inf'; give a finite number"),
        ('a,label\n"1,0\n', r"line 2: .*quote"),
    ],
)
def test_bad_tables(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_table(write(tmp_path, text), "label")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # text labels: an empty or NaN cell after the first label was the class ''
        (
            "x,label\n1,cat\n2,\n3,dog\n4, NaN \n5,cat\n",
            r"lines 3 and 5: the target 'label' is missing \(empty, 'NaN'\)",
        ),
        # numbers: every missing cell is named, not only the first
        (
            "x,label\n1,0\n2,1\n3,\n4,1\n5,\n6,nan\n7,\n8,\n9,\n10,0\n",
            r"lines 4, 6, 7, 8, 9 and 1 more: the target 'label' is missing",
        ),
    ],
)
def test_a_missing_target_is_refused_naming_its_lines(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_table(write(tmp_path, text), "label")
    assert "drop those rows" in str(caught.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Data file not found: .*nope\.csv"):
        load_table(tmp_path / "nope.csv", "label")
    with pytest.raises(ConfigError, match=r"is a directory"):
        load_table(tmp_path, "label")
