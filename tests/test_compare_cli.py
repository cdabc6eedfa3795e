"""`paralela compare`: the real command in a subprocess on a small CSV (wine), and Typer's
CliRunner in-process for the bad inputs that stop before any worker starts."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from compare_helpers import write_wine_csv
from typer.testing import CliRunner

from paralela.cli import app

SPACE = """\
model:
  type: choice
  options:
    tree:   {max_depth: [2, 4]}
    forest: {n_estimators: [10, 20], max_depth: [3, null]}
    knn:
"""

FAILING = """\
from sklearn.tree import DecisionTreeClassifier


class Broken(DecisionTreeClassifier):
    def fit(self, X, y, sample_weight=None, check_input=True):
        raise ValueError("broken on purpose")
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    write_wine_csv(tmp_path / "wine.csv")
    (tmp_path / "space.yaml").write_text(SPACE)
    return tmp_path


def paralela(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m paralela ARGS` in ``cwd``, as a user would from a shell."""
    return subprocess.run(
        [sys.executable, "-m", "paralela", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=110,
    )


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_compare_prints_the_leaderboards_and_writes_the_results(workdir: Path) -> None:
    args = ("compare", "space.yaml", "--data", "wine.csv", "--target", "label")
    proc = paralela(workdir, *args, "--cv", "3", "--workers", "2", "--run-dir", "run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Best of each family (classification, score, 3 folds)" in out
    for family in ("tree", "forest", "knn"):
        assert family in out
    assert "Top 7 of 7" in out
    assert "7 candidates (7 complete, 0 pruned, 0 failed)" in out
    run = workdir / "run"
    record = json.loads((run / "compare.json").read_text())
    assert record["cv"] == 3
    assert len(record["candidates"]) == 7
    best = json.loads((run / "best.json").read_text())
    assert f"Best: #{best['number']} {best['family']}" in out
    assert str(Path("run") / "best.pkl") in out
    model = pickle.loads((run / "best.pkl").read_bytes())
    assert model.random_state == 0  # seeded: the folds' scores are reproducible
    assert (run / "leaderboard.csv").read_text().count("\n") == 8

    # the report of that run directory
    report = paralela(workdir, "report", "run")
    assert report.returncode == 0, report.stderr
    html = (run / "report.html").read_text()
    assert "Best of each family" in html
    assert "Score distribution per family" in html
    assert (run / "report-compare-scores.png").read_bytes().startswith(b"\x89PNG")

    # --json prints compare.json; running again resumes: nothing is fitted again
    again = paralela(workdir, *args, "--cv", "3", "--run-dir", "run", "--json", "--no-refit")
    assert again.returncode == 0, again.stderr
    assert [c["mean"] for c in json.loads(again.stdout)["candidates"]] == [
        c["mean"] for c in record["candidates"]
    ]


def test_every_candidate_failing_exits_1_with_the_error(workdir: Path) -> None:
    (workdir / "mymodels.py").write_text(FAILING)
    (workdir / "broken.yaml").write_text(
        textwrap.dedent(
            """\
            params:
              model: {type: choice, options: {broken: {max_depth: [2, 3]}}}
            estimators: {broken: "mymodels:Broken"}
            """
        )
    )
    proc = paralela(
        workdir, "compare", "broken.yaml", "--data", "wine.csv", "--target", "label",
        "--cv", "2", "--workers", "1", "--run-dir", "run", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "every candidate failed (2 of 2)" in proc.stderr
    assert 'The first, #0 broken {"max_depth": 2}: ValueError: broken on purpose' in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (workdir / "run" / "compare.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--target", "labl"), "no column 'labl'. Did you mean 'label'?"),
        (("--target", "label", "--pruner", "hyper"), "unknown --pruner 'hyper'"),
        (("--target", "label", "--task", "ranking"), "unknown --task 'ranking'"),
        (("--target", "label", "--space-typo"), "No such option"),
    ],
)
def test_bad_options_exit_2(
    workdir: Path, monkeypatch: Any, args: tuple[str, ...], message: str
) -> None:
    monkeypatch.chdir(workdir)
    result = invoke("compare", "space.yaml", "--data", "wine.csv", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            SPACE.replace("knn:", "knm:"),
            "Family 'knm': unknown estimator alias 'knm'. Did you mean 'knn'?",
        ),
        (
            SPACE.replace("max_depth: [2, 4]", "depth: [2, 4]"),
            "has no parameter 'depth'. Did you mean 'max_depth'?",
        ),
        ("C: [1, 2]\n", "exactly one top-level choice"),
    ],
)
def test_bad_spaces_exit_2(workdir: Path, monkeypatch: Any, space: str, message: str) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "bad.yaml").write_text(space)
    result = invoke("compare", "bad.yaml", "--data", "wine.csv", "--target", "label")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_bad_data_exits_2(workdir: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "text.csv").write_text("a,color,label\n1,red,0\n")
    result = invoke("compare", "space.yaml", "--data", "text.csv", "--target", "label")
    assert result.exit_code == 2
    assert "line 2, column 'color': 'red' is text" in result.output
    result = invoke("compare", "space.yaml", "--data", "missing.csv", "--target", "label")
    assert result.exit_code == 2
    assert "Data file not found" in result.output
    (workdir / "labels.csv").write_text("a,label\n1,cat\n2,dog\n")
    result = invoke(
        "compare", "space.yaml", "--data", "labels.csv", "--target", "label", "--task", "regression"
    )
    assert result.exit_code == 2
    assert "--task regression needs a numeric target" in result.output


def test_a_target_with_one_class_or_a_missing_one_exits_2(workdir: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "one.csv").write_text("a,label\n1,cat\n2,cat\n3,cat\n4,cat\n")
    result = invoke("compare", "space.yaml", "--data", "one.csv", "--target", "label", "-d", "r")
    assert result.exit_code == 2, result.output
    assert "y has one class ('cat') in all 4 rows" in result.output
    assert not (workdir / "r").exists()  # no fit, no best.pkl
    (workdir / "gaps.csv").write_text("a,label\n1,cat\n2,\n3,dog\n4,NaN\n")
    result = invoke("compare", "space.yaml", "--data", "gaps.csv", "--target", "label")
    assert result.exit_code == 2, result.output
    assert "lines 3 and 5: the target 'label' is missing (empty, 'NaN')" in result.output


def test_a_classifier_alias_on_a_regression_target_exits_2(workdir: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "logreg.yaml").write_text("model: {type: choice, options: {logreg: }}\n")
    (workdir / "prices.csv").write_text("a,price\n1,1.5\n2,2.5\n3,0.25\n")
    result = invoke("compare", "logreg.yaml", "--data", "prices.csv", "--target", "price")
    assert result.exit_code == 2
    assert "'logreg' is a classifier, but the target asks for regression" in result.output


def test_continuous_parameters_need_a_budget(workdir: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(workdir)
    example = Path(__file__).resolve().parents[1] / "examples" / "compare_space.yaml"
    result = invoke("compare", str(example), "--data", "wine.csv", "--target", "label")
    assert result.exit_code == 2
    assert "give --n-trials or --time-budget" in result.output
