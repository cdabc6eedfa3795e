"""Optuna objectives run unchanged: ``objective(trial)`` with ``trial.suggest_*``,
``report``/``should_prune``, ``raise optuna.TrialPruned()`` and ``set_user_attr``, in
the sweep's pinned workers, with its storage, resume and outputs.

Two objectives of Optuna's own examples (``tests/optuna_examples``, as published) run
as they are: the scikit-learn one through ``paralela.sweep``, the PyTorch one through
``paralela sweep --function``. The killed-driver resume of such objectives is in
``test_sweep_resume.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sweep_helpers
from optuna.trial import TrialState
from sweep_helpers import seed_study

import paralela
from paralela.errors import ConfigError
from paralela.sweeping._objective import takes_trial

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).parent / "optuna_examples"
STAND_INS = EXAMPLES / "stand_ins"


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same CPU slots on every machine: hide real GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _study(result: paralela.SweepResult) -> optuna.Study:
    return optuna.load_study(study_name=result.study_name, storage=result.storage)


# -- Optuna's examples, unchanged ------------------------------------------------------


def test_optunas_sklearn_example_runs_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))  # the workers import it by name too
    import sklearn_simple

    result = paralela.sweep(
        sklearn_simple.objective,
        n_trials=10,
        direction="maximize",
        workers=2,
        seed=0,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 10
    for trial in result.trials:
        # its conditional space: each classifier's own parameter, never the other's
        expected = {
            "classifier",
            "svc_c" if trial.params["classifier"] == "SVC" else "rf_max_depth",
        }
        assert set(trial.params) == expected
        assert trial.values is not None
        assert 0.0 <= trial.values[0] <= 1.0
    assert {t.params["classifier"] for t in result.trials} == {"SVC", "RandomForest"}
    best = _study(result).best_trial
    assert best.value is not None
    assert best.value > 0.9
    assert (tmp_path / "run" / "trials.csv").read_text().count("\n") == 11


def test_optunas_pytorch_example_runs_unchanged_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(STAND_INS), "CUDA_VISIBLE_DEVICES": ""}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "paralela",
            "sweep",
            "--function",
            f"{EXAMPLES / 'pytorch_simple.py'}:objective",
            "--trials",
            "6",
            "--direction",
            "maximize",  # its pruner: Optuna's default, as published
            "--seed",
            "0",
            "--run-dir",
            str(run_dir),
            "--no-progress",
            "--no-plots",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    exported = json.loads((run_dir / "trials.json").read_text())
    trials = exported["trials"]
    assert len(trials) == 6
    assert {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    for trial in trials:
        params = trial["params"]
        # define_model's own loop: as many layers' parameters as n_layers says
        layers = params["n_layers"]
        assert {f"n_units_l{i}" for i in range(layers)} <= set(params)
        assert f"n_units_l{layers}" not in params
        assert params["optimizer"] in ("Adam", "RMSprop", "SGD")
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    assert complete
    for trial in complete:  # trial.report(accuracy, epoch) for each of its 10 epochs
        assert len(trial["intermediate"]) == 10
        assert trial["values"][0] == pytest.approx(trial["intermediate"]["9"])
    assert max(t["values"][0] for t in complete) > 0.5  # it learnt something
    assert "Best parameters:" in done.stdout


# -- the trial's API in a worker -------------------------------------------------------


def reports_and_prunes(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -10.0, 10.0)
    trial.set_user_attr("pid", os.getpid())
    for step in range(4):
        trial.report((x - 2.0) ** 2 + step, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return (x - 2.0) ** 2


def test_report_should_prune_and_user_attrs_reach_the_study(tmp_path: Path) -> None:
    result = paralela.sweep(
        reports_and_prunes,
        n_trials=16,
        pruner="median",
        workers=2,
        seed=1,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    study = _study(result)
    states = {t.state for t in study.trials}
    assert TrialState.PRUNED in states
    assert TrialState.COMPLETE in states
    assert TrialState.FAIL not in states
    parent = os.getpid()
    for trial in study.trials:
        assert trial.user_attrs["pid"] != parent  # it ran in a worker
        assert trial.intermediate_values  # reported from the worker
        if trial.state == TrialState.COMPLETE:
            assert len(trial.intermediate_values) == 4
    records = {r.number: r for r in result.trials}
    for trial in study.trials:
        assert records[trial.number].params == trial.params


def samples_with_space(trial: optuna.Trial) -> float:
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)  # in the space: its value
    depth = trial.suggest_int("depth", 1, 4)  # not in the space: sampled here
    return lr * depth


def test_with_a_space_suggest_returns_the_spaces_values(tmp_path: Path) -> None:
    result = paralela.sweep(
        samples_with_space,
        {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}, "epochs": 3},
        n_trials=6,
        workers=2,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 6
    for trial in result.trials:
        assert 1e-4 <= trial.params["lr"] <= 1e-1
        assert 1 <= trial.params["depth"] <= 4
        assert trial.params["epochs"] == 3  # the space's fixed values, as for params
        assert trial.values == [pytest.approx(trial.params["lr"] * trial.params["depth"])]


def test_a_seeded_sweep_on_one_worker_draws_the_same_parameters(tmp_path: Path) -> None:
    def run(name: str) -> list[dict[str, Any]]:
        result = paralela.sweep(
            reports_and_prunes,
            n_trials=14,  # past TPE's 10 random start-up trials
            workers=1,
            seed=7,
            run_dir=tmp_path / name,
            progress=False,
            plots=False,
        )
        return [t.params for t in result.trials]

    first = run("a")
    assert first == run("b")
    assert len({p["x"] for p in first}) == len(first)


def test_two_workers_never_draw_the_same_parameters(tmp_path: Path) -> None:
    """Every worker unpickles the sampler's state: each must draw its own numbers."""
    result = paralela.sweep(
        reports_and_prunes,
        n_trials=12,
        workers=2,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    xs = [t.params["x"] for t in result.trials]
    assert len(set(xs)) == len(xs) == 12


def test_running_again_continues_the_study(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {
        "workers": 2,
        "run_dir": tmp_path / "run",
        "progress": False,
        "plots": False,
    }
    first = paralela.sweep(reports_and_prunes, n_trials=4, **kwargs)
    second = paralela.sweep(reports_and_prunes, n_trials=9, **kwargs)
    assert second.study_name == first.study_name
    assert len(second.trials) == 9
    kept = {t.number: t.params for t in first.trials}
    assert {t.number: t.params for t in second.trials if t.number in kept} == kept


def dict_objective_prunes_the_optuna_way(params: dict[str, Any]) -> float:
    if params["x"] > 0.5:
        raise optuna.TrialPruned()
    return params["x"]


def test_optuna_trial_pruned_from_a_params_objective_is_pruned_not_failed(
    tmp_path: Path,
) -> None:
    result = paralela.sweep(
        dict_objective_prunes_the_optuna_way,
        {"x": {"type": "grid", "values": [0.25, 0.75]}},
        sampler="grid",
        workers=2,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    states = {t.params["x"]: t.state for t in result.trials}
    assert states == {0.25: "COMPLETE", 0.75: "PRUNED"}


# -- the default pruner: Optuna's own ---------------------------------------------------


def _seeded_study(run_dir: Path) -> str:
    """Five good finished trials (Optuna's MedianPruner() starts pruning after five)."""
    seed_study(run_dir, "seeded", n=5)
    return f"sqlite:///{run_dir.resolve() / 'study.db'}"


@pytest.mark.slow
def test_an_optuna_objective_gets_optunas_default_pruner(tmp_path: Path) -> None:
    """As with ``optuna.create_study()``: MedianPruner(), pruning from the first step."""
    reference = optuna.load_study(study_name="seeded", storage=_seeded_study(tmp_path / "o"))
    reference.optimize(sweep_helpers.worse_than_seeded, n_trials=2)
    _seeded_study(tmp_path / "run")
    result = paralela.sweep(
        sweep_helpers.worse_than_seeded,
        n_trials=7,
        workers=1,
        run_dir=tmp_path / "run",
        study_name="seeded",
        progress=False,
        plots=False,
    )
    ran, expected = result.trials[5:], reference.trials[5:]
    assert [t.state for t in ran] == [t.state.name for t in expected] == ["PRUNED"] * 2
    steps = [sorted(t.intermediate) for t in ran]
    assert steps == [sorted(t.intermediate_values) for t in expected] == [[0], [0]]


def test_pruner_none_turns_the_default_pruner_off(tmp_path: Path) -> None:
    _seeded_study(tmp_path / "run")
    result = paralela.sweep(
        sweep_helpers.worse_than_seeded,
        n_trials=6,
        pruner="none",
        run_dir=tmp_path / "run",
        study_name="seeded",
        progress=False,
        plots=False,
    )
    assert result.trials[5].state == "COMPLETE"


@pytest.mark.slow
def test_the_command_line_gives_an_optuna_objective_optunas_default_pruner(
    tmp_path: Path,
) -> None:
    _seeded_study(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", "--function",
         "sweep_helpers:worse_than_seeded", "--trials", "6", "--study", "seeded",
         "--run-dir", "run", "--no-progress", "--no-plots"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    trials = json.loads((tmp_path / "run" / "trials.json").read_text())["trials"]
    assert trials[5]["state"] == "PRUNED"


def suggests_nothing_returns_none(trial: optuna.Trial) -> None:
    trial.suggest_float("x", 0.0, 1.0)


def test_an_optuna_objective_returning_none_fails_with_the_reason(tmp_path: Path) -> None:
    result = paralela.sweep(
        suggests_nothing_returns_none,
        n_trials=2,
        workers=2,
        max_failures=5,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    assert [t.state for t in result.trials] == ["FAIL", "FAIL"]
    assert all("returned None" in (t.error or "") for t in result.trials)


# -- which objective takes a trial -----------------------------------------------------


def by_name(trial):  # type: ignore[no-untyped-def]
    return 0.0


def by_annotation(t: optuna.trial.Trial) -> float:
    return 0.0


def by_text_annotation(t: "optuna.Trial") -> float:  # noqa: UP037 (the text is the point)
    return 0.0


def takes_params(params: dict[str, Any]) -> float:
    return 0.0


def test_what_takes_a_trial_is_read_from_the_signature() -> None:
    assert takes_trial(by_name, space_given=True)
    assert takes_trial(by_annotation, space_given=True)
    assert takes_trial(by_text_annotation, space_given=True)
    assert not takes_trial(takes_params, space_given=True)
    assert takes_trial(takes_params, space_given=False)  # no space: it can only be a trial
    with pytest.raises(ConfigError, match="takes no argument"):
        takes_trial(lambda: 0.0, space_given=True)


def test_define_by_run_can_be_said_explicitly(tmp_path: Path) -> None:
    def objective(t: Any) -> float:  # neither name nor annotation says it
        return float(t.suggest_int("k", 0, 3))

    result = paralela.sweep(
        objective,
        {"k": {"type": "int", "low": 0, "high": 3}},
        define_by_run=True,
        n_trials=3,
        workers=2,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    assert all(t.state == "COMPLETE" for t in result.trials)


@pytest.mark.parametrize(
    ("objective", "space", "options", "message"),
    [
        (["python", "-c", "pass"], None, {}, "A command objective needs a space"),
        (takes_params, None, {"define_by_run": False}, "needs a space to sample"),
        (by_name, None, {"sampler": "grid"}, "sampler 'grid' enumerates a space"),
        (by_name, None, {"backend": "slurm"}, "backend='processes'"),
    ],
)
def test_impossible_combinations_say_what_to_do(
    tmp_path: Path, objective: Any, space: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        paralela.sweep(objective, space, n_trials=1, run_dir=tmp_path / "run", **options)


def test_the_command_line_needs_a_space_for_a_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", "--trials", "1", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--space" in done.stderr
