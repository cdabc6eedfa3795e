"""A comparison whose run directory fills up: one paragraph naming the path and the
cause, what finished kept; with room again, the same call finishes without refitting
a logged (candidate, fold) pair. A real small tmpfs (CI runs as root).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compare_engine_helpers import FITS_VARIABLE, CountingKNN, fits
from disk_helpers import fill
from sklearn.datasets import load_wine

import paralela
from paralela.comparing import CandidateRecord
from paralela.errors import RunStoreError

pytestmark = pytest.mark.timeout(120)

KS = [1, 3, 5, 7, 9, 11]
FOLDS = 3


def _families() -> dict[str, Any]:
    return {"knn": (CountingKNN(), {"n_neighbors": KS})}


def _logged_folds(run_dir: Path) -> int:
    lines = (run_dir / "folds.jsonl").read_text().splitlines()
    return sum(json.loads(line)["kind"] == "fold" for line in lines if line.strip())


def test_a_disk_that_fills_mid_run_says_where_and_a_rerun_finishes(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    first_fits, second_fits = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    monkeypatch.setenv(FITS_VARIABLE, str(first_fits))  # outside the small disk
    X, y = load_wine(return_X_y=True)
    run_dir = small_disk / "run"
    ended: list[CandidateRecord] = []

    def fill_after_two(record: CandidateRecord) -> None:
        ended.append(record)
        if len(ended) == 2:
            fill(small_disk / "ballast")

    with pytest.raises(RunStoreError) as info:
        paralela.compare(
            _families(), X, y, cv=FOLDS, workers=2, refit=False, run_dir=run_dir,
            progress=fill_after_two,
        )  # fmt: skip
    message = str(info.value)
    assert f"cannot write its run directory {run_dir}" in message
    assert "No space left on device" in message
    assert "running the same comparison again continues it" in message
    logged = _logged_folds(run_dir)
    assert logged >= 2 * FOLDS  # the two candidates that ended are kept

    (small_disk / "ballast").unlink()
    monkeypatch.setenv(FITS_VARIABLE, str(second_fits))
    resumed = paralela.compare(
        _families(), X, y, cv=FOLDS, workers=2, refit=False, run_dir=run_dir, progress=False
    )
    # nothing logged is fitted again; every pair is logged once in the end
    assert len(fits(second_fits)) == len(KS) * FOLDS - logged
    assert _logged_folds(run_dir) == len(KS) * FOLDS
    monkeypatch.delenv(FITS_VARIABLE)
    clean = paralela.compare(
        _families(), X, y, cv=FOLDS, workers=2, refit=False, run_dir=tmp_path / "clean",
        progress=False,
    )  # fmt: skip
    assert [(c.params, c.fold_scores) for c in resumed.candidates] == [
        (c.params, c.fold_scores) for c in clean.candidates
    ]
    assert resumed.best is not None
    assert clean.best is not None
    assert resumed.best.params == clean.best.params
