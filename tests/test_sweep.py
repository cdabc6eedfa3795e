"""``paralela.sweep`` over Python functions: real worker processes pinned to their slot,
real Optuna on a real SQLite (or journal) database; no part of the scheduler is faked.

GPUs: the machine's real ones are hidden (``CUDA_VISIBLE_DEVICES=""``) so that every test
sees the same CPU slots; the GPU tests show three GPUs through a fake ``nvidia-smi``
(NVML hidden), which is how paralela finds GPUs where NVML is missing.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
import socket
import time
from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest
import sweep_helpers
from sweep_helpers import (
    PNG_MAGIC,
    RECORD_VARIABLE,
    SLEEP_VARIABLE,
    devices_overlap,
    intervals_by_device,
    most_at_once,
    notes,
    seed_study,
    show_three_gpus,
)

import paralela
from paralela.errors import ConfigError
from paralela.sweeping import SweepError, SweepResult
from paralela.sweeping._driver import HANDOVER_SECONDS, _handed_over

pytestmark = pytest.mark.timeout(60)

SPACE = {"x": {"type": "float", "low": -2.0, "high": 3.0}}


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same CPU slots on every machine: hide real GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file trials note what they saw in (see ``sweep_helpers.note``)."""
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(path))
    return path


@pytest.fixture
def three_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """Three GPUs, seen through a fake nvidia-smi; returns their UUIDs."""
    return show_three_gpus(monkeypatch, tmp_path / "gpus")


# -- 1. one trial per GPU slot ------------------------------------------------------


def test_function_trials_get_one_gpu_each_and_never_share_one(
    three_gpus: tuple[str, ...], record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.3")
    result = paralela.sweep(
        sweep_helpers.timed, SPACE, n_trials=9, gpus="0,1,2", run_dir=tmp_path / "run"
    )

    assert result.slots == 3
    ran = notes(record, "ran")
    assert len(ran) == 9
    by_device = intervals_by_device(ran)
    assert set(by_device) == set(three_gpus)  # each trial saw exactly one GPU, by UUID
    for device, intervals in by_device.items():
        assert most_at_once(intervals) == 1, f"two trials at once on {device}"
    assert devices_overlap(by_device), "the three GPUs never ran trials at the same time"
    # What the sweep recorded agrees with what the trials saw.
    seen = {json.dumps(n["params"], sort_keys=True): n["devices"] for n in ran}
    for trial in result.trials:
        assert trial.state == "COMPLETE"
        assert trial.devices == seen[json.dumps(trial.params, sort_keys=True)]
        assert trial.host == socket.gethostname()  # recorded for timelines per host


def test_trials_per_gpu_packs_two_trials_on_each_gpu(
    three_gpus: tuple[str, ...], record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.4")
    result = paralela.sweep(
        sweep_helpers.timed,
        SPACE,
        n_trials=12,
        gpus="0,1,2",
        trials_per_gpu=2,
        run_dir=tmp_path / "run",
    )

    assert result.slots == 6
    by_device = intervals_by_device(notes(record, "ran"))
    assert set(by_device) == set(three_gpus)
    assert sum(len(i) for i in by_device.values()) == 12
    packed = [most_at_once(intervals) for intervals in by_device.values()]
    assert max(packed) == 2, f"at most two trials per GPU, and two did share: {packed}"


# -- 2. pruning: report() raises TrialPruned ----------------------------------------


def test_report_raises_trial_pruned_and_the_trial_is_recorded_pruned(
    record: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    seed_study(run_dir, "pruned")  # four good trials for the median to compare with
    result = paralela.sweep(
        sweep_helpers.bad_after_first,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=6,
        workers=1,
        pruner="median",
        run_dir=run_dir,
        study_name="pruned",
    )

    states = [t.state for t in result.trials]
    assert states == ["COMPLETE"] * 4 + ["PRUNED", "COMPLETE"]
    pruned = result.trials[4]
    assert pruned.values == [100.0]  # as in Optuna: a pruned trial's last reported value
    assert pruned.error is None
    assert 1 <= max(pruned.intermediate) < 10  # stopped at once, after the warm-up step
    assert set(pruned.intermediate.values()) == {100.0}
    assert notes(record, "bad-not-pruned") == []
    assert len(notes(record, "good")) == 1


# -- 5. errors: clear, before any trial where possible, never a hang ----------------


def test_an_objective_that_raises_fails_with_its_traceback(record: Path, tmp_path: Path) -> None:
    result = paralela.sweep(sweep_helpers.raises, SPACE, n_trials=3, run_dir=tmp_path / "run")

    assert len(notes(record, "ran")) == 3  # the sweep went on after each failure
    assert [t.state for t in result.trials] == ["FAIL"] * 3
    for trial in result.trials:
        assert trial.error is not None
        assert "Traceback (most recent call last)" in trial.error
        assert "in raises" in trial.error
        assert f"ValueError: objective broke on x={trial.params['x']}" in trial.error
        assert trial.log_path is not None
        assert "ValueError: objective broke" in Path(trial.log_path).read_text()
    assert result.best_trial is None
    assert result.best_params is None
    stored = json.loads((tmp_path / "run" / "trials.json").read_text())
    assert all("ValueError" in t["error"] for t in stored["trials"])


def test_an_objective_that_returns_nothing_fails_and_says_why(record: Path, tmp_path: Path) -> None:
    result = paralela.sweep(sweep_helpers.returns_none, SPACE, n_trials=2, run_dir=tmp_path / "r")

    assert [t.state for t in result.trials] == ["FAIL", "FAIL"]
    for trial in result.trials:
        assert trial.error is not None
        assert "returned None and reported nothing" in trial.error
        assert "paralela.report(value)" in trial.error


def test_max_failures_stops_a_broken_sweep_quickly(record: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SweepError, match=r"[34] trials failed, more than max_failures=2") as info:
        paralela.sweep(
            sweep_helpers.raises,
            SPACE,
            n_trials=200,
            workers=2,
            max_failures=2,
            run_dir=tmp_path / "run",
        )
    assert time.monotonic() - started < 20
    assert "ValueError: objective broke" in str(info.value)  # the last error, to act on
    ran = len(notes(record, "ran"))
    assert 3 <= ran <= 4  # stopped at the third failure; one more may have been running


def test_timeout_stops_starting_new_trials(
    record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.2")
    timeout = 1.5
    result = paralela.sweep(
        sweep_helpers.timed, SPACE, timeout=timeout, workers=2, run_dir=tmp_path / "run"
    )

    ran = notes(record, "ran")
    assert 2 <= len(ran) < 30
    assert len(result.trials) == len(ran)
    assert all(t.state == "COMPLETE" for t in result.trials)
    starts = [float(n["start"]) for n in ran]
    # nothing started after the time budget (give or take the dispatch to a worker)
    assert max(starts) - min(starts) <= timeout + 0.25
    assert result.wall_seconds < timeout + 5  # running trials finished, then it returned


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "Give a trial budget (n_trials=, --trials) or a time budget"),
        ({"n_trials": 0}, "n_trials must be a positive whole number (an int), got 0"),
        ({"n_trials": 2.5}, "n_trials must be a positive whole number (an int), got 2.5"),
        ({"n_trials": 3.0}, "n_trials must be a positive whole number (an int), got 3.0"),
        ({"n_trials": True}, "n_trials must be a positive whole number (an int), got True"),
        ({"timeout": -1.0}, "timeout must be a positive number of seconds, got -1.0"),
        ({"n_trials": 2, "sampler": "bayes"}, "Unknown sampler 'bayes'; valid samplers are: "),
        ({"n_trials": 2, "pruner": "early"}, "Unknown pruner 'early'; valid pruners are: "),
        ({"n_trials": 2, "direction": "down"}, "direction must be 'minimize' or 'maximize'"),
        ({"n_trials": 2, "max_failures": -1}, "max_failures must be 0 or more"),
        ({"n_trials": 2, "storage": "study.db"}, "is not a database URL"),
    ],
)
def test_bad_arguments_are_config_errors_before_any_trial(
    kwargs: dict[str, object], message: str, record: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as info:
        paralela.sweep(sweep_helpers.quadratic, SPACE, run_dir=tmp_path / "run", **kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)
    if "sampler" in kwargs:
        assert "tpe, random, grid, cmaes, gp, nsga2, nsga3, qmc" in str(info.value)
    if "pruner" in kwargs:
        assert "none, median, percentile, halving, hyperband" in str(info.value)
    assert notes(record) == []


def test_a_bad_space_file_names_the_file_and_the_line(record: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 0, high: 1}\nlr: {type: float, low: 1e-3}\n")
    with pytest.raises(ConfigError) as info:
        paralela.sweep(sweep_helpers.quadratic, space, n_trials=2, run_dir=tmp_path / "run")
    assert f"{space}, line 2, parameter 'lr'" in str(info.value)
    assert "needs 'high'" in str(info.value)
    assert notes(record) == []
    assert not (tmp_path / "run").exists()


def test_grid_sampler_on_a_csv_is_refused(tmp_path: Path) -> None:
    space = tmp_path / "configs.csv"
    space.write_text("x\n0.5\n")
    with pytest.raises(ConfigError, match="Leave the sampler out to run exactly its rows"):
        paralela.sweep(sweep_helpers.quadratic, space, sampler="grid", run_dir=tmp_path / "r")


# -- 4. a CSV space: exactly its rows, in order ----------------------------------------


def test_a_csv_space_runs_exactly_its_rows_in_order(record: Path, tmp_path: Path) -> None:
    rows = [(0.5, "a"), (2.0, "b"), (-1.0, "c"), (1.0, "a"), (0.5, "c")]
    space = tmp_path / "configs.csv"
    space.write_text("x,tag\n" + "".join(f"{x},{tag}\n" for x, tag in rows))
    result = paralela.sweep(sweep_helpers.quadratic, space, workers=2, run_dir=tmp_path / "run")

    assert [t.number for t in result.trials] == list(range(len(rows)))
    assert [(t.params["x"], t.params["tag"]) for t in result.trials] == rows
    assert [t.value for t in result.trials] == [(x - 1.0) ** 2 for x, _ in rows]
    assert sorted((n["params"]["x"], n["params"]["tag"]) for n in notes(record)) == sorted(rows)
    assert result.best_params == {"x": 1.0, "tag": "a"}
    assert result.best_value == 0.0


def test_grid_sampler_runs_every_point_once(record: Path, tmp_path: Path) -> None:
    space = {"x": {"type": "grid", "values": [0.0, 1.0, 2.0]}, "k": [1, 2], "unit": "cm"}
    result = paralela.sweep(sweep_helpers.quadratic, space, sampler="grid", run_dir=tmp_path / "r")

    points = sorted((t.params["x"], t.params["k"]) for t in result.trials)
    assert points == sorted(itertools.product([0.0, 1.0, 2.0], [1, 2]))
    assert all(t.params["unit"] == "cm" for t in result.trials)  # fixed values are passed
    assert len(notes(record, "ran")) == 6


# -- 6. outputs ----------------------------------------------------------------------


def test_result_exports_logs_and_plots(record: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    space = {**SPACE, "epochs": 3}
    result = paralela.sweep(
        sweep_helpers.quadratic, space, n_trials=6, workers=2, seed=1, run_dir=run_dir
    )

    assert isinstance(result, SweepResult)
    assert len(result.trials) == 6
    assert [t.number for t in result.trials] == list(range(6))
    values = {t.number: (float(t.params["x"]) - 1.0) ** 2 for t in result.trials}
    assert all(t.state == "COMPLETE" and t.value == values[t.number] for t in result.trials)
    assert all(t.params["epochs"] == 3 for t in result.trials)
    # best and leaderboard
    best = min(values, key=values.__getitem__)
    assert result.best_trial is not None
    assert result.best_trial.number == best
    assert result.best_value == values[best]
    assert result.best_params == result.trials[best].params
    board = result.leaderboard(3)
    assert [t.value for t in board] == sorted(values.values())[:3]
    assert len(result.leaderboard()) == 6
    # current_params() inside each trial gave the trial's parameters
    for n in notes(record, "ran"):
        assert n["current"] == n["params"]
        assert n["params"]["epochs"] == 3
    # trials.csv and trials.json: every trial
    with open(run_dir / "trials.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["number"]) for r in table] == list(range(6))
    assert [float(r["value"]) for r in table] == [values[i] for i in range(6)]
    assert {r["state"] for r in table} == {"COMPLETE"}
    assert [float(r["x"]) for r in table] == [t.params["x"] for t in result.trials]
    stored = json.loads((run_dir / "trials.json").read_text())
    assert [t["number"] for t in stored["trials"]] == list(range(6))
    assert stored["best"]["number"] == best
    assert stored["directions"] == ["minimize"]
    # one log per trial, holding what the trial printed
    logs = sorted((run_dir / "trials").glob("*.log"))
    assert len(logs) == 6
    for trial in result.trials:
        assert trial.log_path is not None
        text = Path(trial.log_path).read_text()
        assert f"function trial output: x={trial.params['x']!r}" in text
    # plots
    for name in ("optimization_history", "param_importances"):
        png = run_dir / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name
    assert "plot not drawn: intermediate_values: no trial reported intermediate values" in (
        result.notes
    )


def test_the_last_report_is_the_value_and_reports_are_intermediate_values(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    result = paralela.sweep(sweep_helpers.reporting, SPACE, n_trials=3, run_dir=run_dir)

    for trial in result.trials:
        x = float(trial.params["x"])
        assert trial.state == "COMPLETE"
        assert trial.intermediate == {0: 1.0 + x, 1: 0.5 + x, 2: 1.0 / 3 + x}
        assert trial.value == pytest.approx(1.0 / 3 + x)
    assert (run_dir / "plots" / "intermediate_values.png").read_bytes()[:8] == PNG_MAGIC


def test_several_objectives(tmp_path: Path) -> None:
    result = paralela.sweep(
        sweep_helpers.two_objectives,
        SPACE,
        n_trials=4,
        direction=["minimize", "maximize"],
        run_dir=tmp_path / "run",
    )

    for trial in result.trials:
        x = float(trial.params["x"])
        assert trial.values == [x * x, math.sin(x)]
    assert result.best_value == min(float(t.params["x"]) ** 2 for t in result.trials)
    stored = json.loads((tmp_path / "run" / "trials.json").read_text())
    assert stored["directions"] == ["minimize", "maximize"]
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    front = result.pareto_front()
    assert sorted(t.number for t in front) == sorted(t.number for t in study.best_trials)
    assert [t.values for t in front] == sorted(t.values for t in front)  # x^2 rising


def test_report_outside_a_sweep_prints_and_records_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PARALELA_REPORT_FD", raising=False)
    monkeypatch.delenv("PARALELA_TRIAL_PARAMS", raising=False)
    paralela.report(0.25, step=3)
    paralela.report(0.5)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "paralela.report: 0.25 (step 3) (not inside a sweep: not recorded)",
        "paralela.report: 0.5 (not inside a sweep: not recorded)",
    ]
    with pytest.raises(RuntimeError, match="only available inside a paralela sweep trial"):
        paralela.current_params()
    with pytest.raises(ValueError, match="could not convert"):
        paralela.report("loss")  # type: ignore[arg-type]


# -- 7. storage ------------------------------------------------------------------------


def test_the_default_storage_is_sqlite_in_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = paralela.sweep(sweep_helpers.quadratic, SPACE, n_trials=3, run_dir=run_dir)

    database = run_dir.resolve() / "study.db"
    assert result.storage == f"sqlite:///{database}"
    assert database.is_file()
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    # named after the function, and a hash of the objective and space
    assert re.fullmatch(r"quadratic-[0-9a-f]{8}", result.study_name)
    assert [t.value for t in study.trials] == [t.value for t in result.trials]
    assert [t.params for t in study.trials] == [t.params for t in result.trials]


def test_journal_storage(tmp_path: Path) -> None:
    journal = tmp_path / "elsewhere" / "sweep.journal"
    journal.parent.mkdir()
    result = paralela.sweep(
        sweep_helpers.reporting,
        SPACE,
        n_trials=3,
        workers=2,
        storage=f"journal:{journal}",
        run_dir=tmp_path / "run",
    )

    assert result.storage == f"journal:{journal}"
    assert [t.state for t in result.trials] == ["COMPLETE"] * 3
    assert not (tmp_path / "run" / "study.db").exists()
    from paralela.studies import open_storage

    study = optuna.load_study(study_name=result.study_name, storage=open_storage(result.storage))
    assert [t.value for t in study.trials] == [t.value for t in result.trials]
    # the workers wrote the intermediate values to the journal themselves
    assert all(len(t.intermediate_values) == 3 for t in study.trials)


def test_plots_can_be_left_out(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = paralela.sweep(
        sweep_helpers.quadratic, SPACE, n_trials=3, workers=2, run_dir=run_dir, plots=False
    )
    assert len(result.trials) == 3
    assert (run_dir / "trials.csv").exists()
    assert not (run_dir / "plots").exists()
    assert not any(note.startswith("plot not drawn") for note in result.notes)


# -- what a trial loads: its start-up is slot time -------------------------------------


def test_function_trials_that_report_nothing_never_load_optuna(
    record: Path, tmp_path: Path
) -> None:
    result = paralela.sweep(
        sweep_helpers.modules_loaded, SPACE, n_trials=4, workers=2, run_dir=tmp_path / "run"
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 4
    seen = notes(record, "modules")
    assert len(seen) == 4
    assert not any(n["optuna"] or n["sqlalchemy"] for n in seen)


def test_report_in_a_command_trial_loads_nothing_heavy(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    code = """if True:
        import sys
        before = set(sys.modules)
        import paralela
        for value in (0.25, float("inf"), float("-inf"), float("nan")):
            paralela.report(value)
        paralela.report(2.0, step=7)
        print(" ".join(sorted(set(sys.modules) - before)))
    """
    read_end, write_end = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PARALELA_REPORT_FD": str(write_end)},
            pass_fds=(write_end,),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        os.close(write_end)
    with os.fdopen(read_end) as reports:
        lines = [json.loads(line) for line in reports]
    loaded = set(done.stdout.split())
    assert "paralela.sweeping._report" in loaded
    assert not loaded & {"json", "dataclasses", "threading", "optuna", "paralela.errors"}
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 7]
    values = [line["value"] for line in lines]
    assert values[:3] == [0.25, math.inf, -math.inf]
    assert math.isnan(values[3])
    assert values[4] == 2.0


def test_the_sampler_waits_for_submitted_trials_to_be_sent_but_never_long() -> None:
    # The driver resumes the sampler once the backend has taken the function trials it
    # just submitted (their futures run or are done); a backend that does not take one
    # (all workers busy, broken) holds the sampler back HANDOVER_SECONDS at most.
    taken: Future[None] = Future()
    assert taken.set_running_or_notify_cancel()
    finished: Future[None] = Future()
    finished.set_result(None)
    start = time.monotonic()
    _handed_over([taken, finished])
    _handed_over([])
    assert time.monotonic() - start < HANDOVER_SECONDS

    waiting: Future[None] = Future()
    start = time.monotonic()
    _handed_over([taken, waiting])
    assert HANDOVER_SECONDS <= time.monotonic() - start < 1.0
