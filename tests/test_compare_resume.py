"""paralela.compare resumes from its run directory: after SIGKILL of the driver or
Ctrl-C, a rerun fits only the (candidate, fold) pairs that had not finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from compare_engine_helpers import FITS_VARIABLE, CountingKNN, fits
from conftest import wait_until
from helpers import default_sigint
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, check_cv
from sklearn.neighbors import KNeighborsClassifier

import paralela
from paralela.comparing._store import FoldLog

TESTS_DIR = Path(__file__).resolve().parent
KS = [1, 3, 5, 7]

DRIVER = textwrap.dedent(
    """
    import sys
    from sklearn.datasets import load_digits
    from compare_engine_helpers import CountingKNN
    import paralela

    X, y = load_digits(return_X_y=True)
    families = {"knn": (CountingKNN(delay=float(sys.argv[2])), {"n_neighbors": KS})}
    sampled = dict(sampler="random", n_trials=len(KS), seed=0) if sys.argv[3] == "sampled" else {}
    paralela.compare(
        families, X, y, cv=3, run_dir=sys.argv[1], workers=2, progress=False, **sampled
    )
    """
).replace("KS", repr(KS))


def _fold_lines(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "folds.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == "fold"]


def _start_driver(tmp_path: Path, run_dir: Path, delay: float, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        FITS_VARIABLE: str(tmp_path / "fits.jsonl"),
    }
    return subprocess.Popen(
        [sys.executable, str(script), str(run_dir), str(delay), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def _interrupted_then_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: signal.Signals, mode: str = "grid"
) -> tuple[Any, set[tuple[int, int]], str]:
    run_dir = tmp_path / "run"
    driver = _start_driver(tmp_path, run_dir, delay=0.25, mode=mode)
    try:
        wait_until(
            lambda: (run_dir / "folds.jsonl").exists() and len(_fold_lines(run_dir)) >= 3,
            timeout=60,
            what="three folds to finish",
        )
        driver.send_signal(how)
        _, stderr = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode != 0
    finished = {(e["params"]["n_neighbors"], e["fold"]) for e in _fold_lines(run_dir)}
    assert 3 <= len(finished) < len(KS) * 3, "the run was not stopped midway"

    monkeypatch.setenv(FITS_VARIABLE, str(tmp_path / "fits.jsonl"))
    X, y = load_digits(return_X_y=True)
    families = {"knn": (CountingKNN(), {"n_neighbors": KS})}
    sampled: dict[str, Any] = (
        {"sampler": "random", "n_trials": len(KS), "seed": 0} if mode == "sampled" else {}
    )
    result = paralela.compare(
        families, X, y, cv=3, run_dir=run_dir, workers=2, refit=False, **sampled
    )
    return result, finished, stderr


def _check_resumed(tmp_path: Path, result: Any, finished: set[tuple[int, int]]) -> None:
    X, y = load_digits(return_X_y=True)
    folds = list(check_cv(3, y, classifier=True).split(X, y))
    rows = {fold: float(X[train].sum()) for fold, (train, _) in enumerate(folds)}
    fitted = Counter(fits(tmp_path / "fits.jsonl"))
    for k in KS:
        for fold in range(3):
            times = fitted[(k, rows[fold])]
            if (k, fold) in finished:
                assert times == 1, f"k={k} fold {fold} finished before the kill but was refitted"
            else:  # perhaps started by the killed run, surely fitted by the rerun
                assert 1 <= times <= 2
    # Nothing recorded twice, and the result is GridSearchCV's.
    lines = _fold_lines(tmp_path / "run")
    assert len(lines) == len({(e["key"], e["fold"]) for e in lines}) == len(KS) * 3
    log = FoldLog(tmp_path / "run")
    assert all(c.state == "COMPLETE" for c in log.candidates.values())
    log.close()
    search = GridSearchCV(KNeighborsClassifier(), {"n_neighbors": KS}, cv=3).fit(X, y)
    by_params = sorted(result.candidates, key=lambda c: c.params["n_neighbors"])
    assert [c.params for c in by_params] == search.cv_results_["params"]
    assert {c.state for c in result.candidates} == {"COMPLETE"}
    for index, c in enumerate(by_params):
        for fold, score in enumerate(c.fold_scores):
            expected = search.cv_results_[f"split{fold}_test_score"][index]
            assert score == pytest.approx(expected, abs=1e-12)
    assert result.best is not None
    assert result.best.mean == pytest.approx(search.best_score_, abs=1e-12)


@pytest.mark.parametrize("mode", ["grid", "sampled"])
def test_a_killed_driver_resumes_without_refitting_finished_folds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    result, finished, _ = _interrupted_then_resumed(tmp_path, monkeypatch, signal.SIGKILL, mode)
    _check_resumed(tmp_path, result, finished)


def test_ctrl_c_keeps_what_finished_and_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, finished, stderr = _interrupted_then_resumed(tmp_path, monkeypatch, signal.SIGINT)
    assert "KeyboardInterrupt" in stderr
    assert "The comparison was interrupted" in stderr
    assert "run_dir=" in stderr
    _check_resumed(tmp_path, result, finished)


def test_a_line_cut_short_by_a_crash_is_dropped(tmp_path: Path) -> None:
    whole = {
        "kind": "fold",
        "key": '["knn",{"n_neighbors":1}]',
        "number": 0,
        "family": "knn",
        "params": {"n_neighbors": 1},
        "fold": 0,
        "score": 0.5,
        "error": None,
    }
    path = tmp_path / "folds.jsonl"
    path.write_text(json.dumps(whole) + "\n" + json.dumps({**whole, "fold": 1})[:40])
    log = FoldLog(tmp_path)
    assert list(log.candidates[whole["key"]].folds) == [0]
    log.append({**whole, "fold": 2})
    log.close()
    assert [json.loads(line)["fold"] for line in path.read_text().splitlines()] == [0, 2]


@pytest.mark.parametrize("how", [{}, {"halving": True}, {"pruner": "median"}])
def test_a_finished_comparison_run_again_fits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: dict[str, Any]
) -> None:
    monkeypatch.setenv(FITS_VARIABLE, str(tmp_path / "fits.jsonl"))
    X, y = load_digits(return_X_y=True)
    families = {"knn": (CountingKNN(), {"n_neighbors": [1, 3, 5, 7, 9, 11, 13]})}
    first = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r", refit=False, **how)
    fitted = len(fits(tmp_path / "fits.jsonl"))
    log_size = (tmp_path / "r" / "folds.jsonl").stat().st_size
    again = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r", refit=False, **how)
    assert len(fits(tmp_path / "fits.jsonl")) == fitted
    assert (tmp_path / "r" / "folds.jsonl").stat().st_size == log_size  # nothing logged twice
    assert [(c.number, c.fold_scores, c.state) for c in again.candidates] == [
        (c.number, c.fold_scores, c.state) for c in first.candidates
    ]
    assert again.best == first.best
