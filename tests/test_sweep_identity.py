"""Sweeps never merge silently: the default study and directory come from the objective
and the space; continuing a study made for another one is refused unless it is named.

Every Optuna example names its function ``objective``: these tests do the same.
Real Optuna on a real SQLite database in each test's directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna
import pytest

import paralela
from paralela.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

SPACE_X = {"x": {"type": "float", "low": -2.0, "high": 3.0}}
SPACE_Y = {"y": {"type": "int", "low": 1, "high": 50}}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default run directories: paralela-runs/ here
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def objective(params: dict[str, Any]) -> float:
    return float(params["x"] - 1.0) ** 2


class Other:
    @staticmethod
    def objective(params: dict[str, Any]) -> float:  # a second function named objective
        return -float(params["y"])


def run(fn: Any, space: dict[str, Any], n: int = 2, **kwargs: Any) -> paralela.SweepResult:
    return paralela.sweep(fn, space, n_trials=n, workers=1, progress=False, **kwargs)


def test_two_unrelated_sweeps_of_functions_named_objective_get_their_own_study() -> None:
    first = run(objective, SPACE_X, n=3)
    second = run(Other.objective, SPACE_Y, n=2)
    assert first.study_name != second.study_name
    assert first.study_name.startswith("objective-")
    assert second.study_name.startswith("objective-")
    assert first.run_dir != second.run_dir
    assert len(second.trials) == 2  # its own trials, not the first sweep's
    assert second.best_params is not None
    assert set(second.best_params) == {"y"}
    assert sorted(os.listdir("paralela-runs")) == sorted([first.study_name, second.study_name])


def test_the_same_function_on_another_space_is_another_sweep() -> None:
    narrow = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    assert run(objective, SPACE_X).study_name != run(objective, narrow).study_name


def test_the_same_sweep_run_again_continues_its_study() -> None:
    first = run(objective, SPACE_X, n=2)
    again = run(objective, SPACE_X, n=4)
    assert again.study_name == first.study_name
    assert again.run_dir == first.run_dir
    assert len(again.trials) == 4


def test_a_run_dir_holding_another_sweep_is_refused_naming_both(tmp_path: Path) -> None:
    run_dir = tmp_path / "shared"
    first = run(objective, SPACE_X, run_dir=run_dir)
    with pytest.raises(ConfigError) as info:
        run(Other.objective, SPACE_Y, run_dir=run_dir)
    message = str(info.value)
    assert f"already holds the sweep {first.study_name!r}" in message
    assert "objective test_sweep_identity:objective" in message
    assert "objective test_sweep_identity:Other.objective" in message
    assert '"x"' in message
    assert '"y"' in message
    assert "--study" in message
    # Nothing was added to the database.
    studies = optuna.get_all_study_names(f"sqlite:///{run_dir / 'study.db'}")
    assert studies == [first.study_name]


def test_a_named_study_continues_with_another_space_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "named"
    run(objective, SPACE_X, n=2, run_dir=run_dir, study_name="mine")
    wider = {"x": {"type": "float", "low": -5.0, "high": 5.0}}
    again = run(objective, wider, n=4, run_dir=run_dir, study_name="mine")
    assert again.study_name == "mine"
    assert len(again.trials) == 4
    assert any("continuing study 'mine', which was made for space" in n for n in again.notes)
    assert "continuing study 'mine'" in capsys.readouterr().err


def test_a_study_made_for_another_objective_is_refused_unless_named(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    first = run(objective, SPACE_X, storage=storage, run_dir=tmp_path / "a")
    study = optuna.load_study(study_name=first.study_name, storage=storage)
    study.set_user_attr("paralela:objective", "somewhere.else:objective")
    with pytest.raises(ConfigError, match=r"was made for objective somewhere.else:objective"):
        run(objective, SPACE_X, storage=storage, run_dir=tmp_path / "a")
    named = run(objective, SPACE_X, n=3, storage=storage, study_name=first.study_name)
    assert len(named.trials) == 3
