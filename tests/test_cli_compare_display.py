"""What `paralela compare` prints: each distinct warning of the trials once, on one line
with a count (scikit-learn's nine-line ConvergenceWarning was printed by every fold), and
a pruned candidate's score with the folds it ran, not a ``± 0.0000`` over one fold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from compare_helpers import write_wine_csv

from paralela.cli._compare import score_text
from paralela.comparing._results import CandidateRecord, CompareResult

# Logistic regression stopped after 3 or 4 iterations on unscaled data: every fold warns.
# Halving over 3 folds prunes most candidates after their first fold.
SPACE = """\
model:
  type: choice
  options:
    logreg: {max_iter: [3, 4]}
    knn: {n_neighbors: [1, 3, 5, 7, 9, 11]}
"""


def record(number: int, state: str, scores: list[float | None], **kw: object) -> CandidateRecord:
    done = [s for s in scores if s is not None]
    return CandidateRecord(
        number=number,
        family="knn",
        params={},
        fold_scores=scores,
        mean=sum(done) / len(done) if done else None,
        std=0.0 if done else None,
        fit_seconds=0.0,
        state=state,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_a_pruned_candidates_score_says_how_many_folds_it_ran() -> None:
    assert score_text(record(0, "COMPLETE", [0.9, 0.9, 0.9])) == "0.9000 ± 0.0000"
    assert score_text(record(1, "PRUNED", [0.9667, 0.9667, None, None, None])) == (
        "0.9667 (2/5 folds, pruned)"
    )
    assert score_text(record(2, "FAIL", [0.5, None, None])) == "0.5000 (1/3 folds, failed)"
    assert score_text(record(3, "FAIL", [None, None, None])) == "-"


def test_warnings_that_differ_in_their_numbers_are_one() -> None:
    def warned(number: int, message: str, count: int) -> CandidateRecord:
        w = [{"category": "ConvergenceWarning", "message": message, "count": count}]
        return record(number, "COMPLETE", [1.0], warnings=w)

    result = CompareResult(
        candidates=[
            warned(0, "failed after 3 iterations (max_iter=3).", 2),
            warned(1, "failed after 40 iterations (max_iter=40).", 3),
            record(2, "COMPLETE", [1.0], warnings=[
                {"category": "UserWarning", "message": "other", "count": 1}
            ]),
        ],
        best=None,
        best_estimator=None,
        run_dir=Path("run"),
        wall_seconds=0.0,
        scoring="score",
    )  # fmt: skip
    assert result.warnings() == [
        {
            "category": "ConvergenceWarning",
            "message": "failed after 3 iterations (max_iter=3).",
            "count": 5,
            "candidates": [0, 1],
        },
        {"category": "UserWarning", "message": "other", "count": 1, "candidates": [2]},
    ]


def compare(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "compare", "space.yaml", "--data", "wine.csv",
         "--target", "label", "--cv", "3", "--workers", "2", "--run-dir", "run",
         "--pruner", "halving", "--no-progress"],
        cwd=cwd, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
        timeout=110, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_compare_prints_each_warning_once_and_the_folds_a_pruned_candidate_ran(
    tmp_path: Path,
) -> None:
    write_wine_csv(tmp_path / "wine.csv")
    (tmp_path / "space.yaml").write_text(SPACE)
    done = compare(tmp_path)
    assert done.returncode == 0, done.stderr

    saved = json.loads((tmp_path / "run" / "compare.json").read_text())
    logreg = [c for c in saved["candidates"] if c["family"] == "logreg"]
    raised = sum(w["count"] for c in logreg for w in c["warnings"])
    assert raised >= 2  # each logreg candidate's folds warned, and compare.json says so
    lines = [line for line in done.stderr.splitlines() if line.startswith("Warning: ")]
    assert lines == [
        f"Warning: ConvergenceWarning ({raised} times, candidates #0, #1): lbfgs failed "
        "to converge " + lines[0].split("lbfgs failed to converge ", 1)[1]
    ]
    assert done.stderr.count("TOTAL NO. OF ITERATIONS REACHED LIMIT") == 1
    assert "_check_optimize_result" not in done.stderr  # no warning printed by a worker
    assert f"warnings are in {Path('run') / 'compare.json'}" in done.stderr

    pruned = [c for c in saved["candidates"] if c["state"] == "PRUNED"]
    assert pruned
    ran = sum(s is not None for s in pruned[0]["fold_scores"])
    assert f"({ran}/3 folds, pruned)" in done.stdout
    assert "± 0.0000" not in done.stdout.split("Top ")[0]  # the best of each family

    # Run again: every candidate is in the run directory, its warnings too.
    again = compare(tmp_path)
    assert again.returncode == 0, again.stderr
    assert [line for line in again.stderr.splitlines() if line.startswith("Warning: ")] == lines
