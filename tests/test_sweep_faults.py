"""Sweeps that survive real training: a diverged (NaN or infinite) loss fails its trial
with the reason, and the sweep goes on; function and command trials, with and without a
pruner, and on resume. Real worker and trial processes, real Optuna on SQLite.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sweep_helpers
from helpers import default_sigint
from optuna.trial import TrialState
from sweep_helpers import command, write_script

import paralela
from paralela.cli._errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED
from paralela.errors import ConfigError

pytestmark = pytest.mark.timeout(90)

SPACE = {"x": {"type": "float", "low": -2.0, "high": 3.0}}
# x > 0 diverges: half the space, so every sweep below has both kinds of trial.
DIVERGES_FROM = 0.0


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def diverging(params: dict[str, Any]) -> float:
    x = params["x"]
    return math.nan if x > DIVERGES_FROM else x * x


def diverging_to_inf(params: dict[str, Any]) -> float:
    x = params["x"]
    return -math.inf if x > DIVERGES_FROM else x * x


def reporting_nan(params: dict[str, Any]) -> float:
    x = params["x"]
    for step in range(4):
        paralela.report(math.nan if x > DIVERGES_FROM and step == 2 else x * x, step)
    return x * x


REPORTING_NAN = """\
x = paralela.current_params()["x"]
for step in range(4):
    paralela.report(float("nan") if x > 0 and step == 2 else x * x, step)
"""

FINAL_INF = """\
x = paralela.current_params()["x"]
paralela.report(float("inf") if x > 0 else x * x)
"""


def strict_json(path: Path) -> Any:
    """JSON as every other reader sees it: NaN and Infinity are not JSON."""

    def refuse(token: str) -> None:
        raise AssertionError(f"{path.name} holds {token}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def check_outcome(result: paralela.SweepResult, n_trials: int, step: int | None) -> None:
    """Every trial ended; the diverged ones failed with the reason, the rest completed."""
    assert len(result.trials) == n_trials
    for trial in result.trials:
        if trial.params["x"] > DIVERGES_FROM:
            assert trial.state == "FAIL", trial
            assert trial.error is not None
            where = f"reported at step {step}" if step is not None else "objective's value"
            assert where in trial.error
            assert "nan" in trial.error or "inf" in trial.error
        else:
            assert trial.state in ("COMPLETE", "PRUNED"), trial
    assert any(t.state == "FAIL" for t in result.trials)
    assert any(t.state == "COMPLETE" for t in result.trials)
    assert result.best_params["x"] <= DIVERGES_FROM
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    listed = strict_json(result.run_dir / "trials.json")["trials"]
    assert len(listed) == n_trials
    assert (result.run_dir / "trials.csv").read_text().count("\n") == n_trials + 1


@pytest.mark.parametrize("objective", [diverging, diverging_to_inf])
@pytest.mark.parametrize("pruner", [None, "median"])
def test_a_function_returning_nan_or_inf_fails_its_trial_only(
    tmp_path: Path, objective: Any, pruner: str | None
) -> None:
    result = paralela.sweep(
        objective,
        SPACE,
        n_trials=8,
        workers=2,
        pruner=pruner,
        seed=3,
        run_dir=tmp_path / "run",
        progress=False,
    )
    check_outcome(result, 8, step=None)


@pytest.mark.parametrize("pruner", [None, "median"])
def test_a_function_reporting_nan_stops_and_fails_its_trial(
    tmp_path: Path, pruner: str | None
) -> None:
    result = paralela.sweep(
        reporting_nan,
        SPACE,
        n_trials=8,
        workers=2,
        pruner=pruner,
        seed=3,
        run_dir=tmp_path / "run",
        progress=False,
    )
    check_outcome(result, 8, step=2)
    for trial in result.trials:
        if trial.state == "FAIL":
            assert sorted(trial.intermediate) == [0, 1]  # the NaN was not recorded


@pytest.mark.parametrize(
    ("body", "step"), [(REPORTING_NAN, 2), (FINAL_INF, 0)], ids=["nan-at-step-2", "final-inf"]
)
@pytest.mark.parametrize("pruner", [None, "median"])
def test_a_command_reporting_nan_or_inf_fails_its_trial_only(
    tmp_path: Path, body: str, step: int | None, pruner: str | None
) -> None:
    script = write_script(tmp_path, "train.py", body)
    result = paralela.sweep(
        command(script),
        SPACE,
        n_trials=6,
        workers=2,
        pruner=pruner,
        seed=3,
        run_dir=tmp_path / "run",
        progress=False,
    )
    check_outcome(result, 6, step=step)


def test_a_resumed_sweep_keeps_its_diverged_trials_failed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = paralela.sweep(
        diverging, SPACE, n_trials=5, workers=2, seed=3, run_dir=run_dir, progress=False
    )
    again = paralela.sweep(
        diverging, SPACE, n_trials=9, workers=2, seed=3, run_dir=run_dir, progress=False
    )
    assert first.study_name == again.study_name
    study = optuna.load_study(study_name=again.study_name, storage=again.storage)
    states = [t.state for t in study.trials]
    assert len(states) == 9
    assert TrialState.RUNNING not in states
    for trial in study.trials:
        assert (trial.state == TrialState.FAIL) == (trial.params["x"] > DIVERGES_FROM)
    assert len(strict_json(run_dir / "trials.json")["trials"]) == 9


# -- failures on the console: all failed is exit 1 with the first one's error ---------


def sweep_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "space.yaml").write_text("x: {type: float, low: -2.0, high: 3.0}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    return subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml", *args],
        cwd=tmp_path,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=80,
    )


def test_a_sweep_whose_every_trial_fails_exits_1_with_the_first_error(tmp_path: Path) -> None:
    done = sweep_cli(tmp_path, "--trials", "4", "--", sys.executable, "nosuch.py", "--x", "{x}")
    assert done.returncode == EXIT_FAILED, done.stderr
    assert "every trial failed (4 of 4)" in done.stderr
    assert "trial #0" in done.stderr
    assert "exit code 2" in done.stderr
    assert "nosuch.py" in done.stderr
    assert "No such file or directory" in done.stderr  # the tail of the trial's log
    assert "trial-00000.log" in done.stderr
    assert "Traceback" not in done.stderr
    (run_dir,) = (tmp_path / "paralela-runs").glob("nosuch-*")
    listed = strict_json(run_dir / "trials.json")["trials"]
    assert [t["state"] for t in listed] == ["FAIL"] * 4


def test_some_failed_trials_are_named_and_the_sweep_succeeds(tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", FINAL_INF)
    done = sweep_cli(tmp_path, "--trials", "6", "--seed", "3", "--", *command(script))
    assert done.returncode == 0, done.stderr
    assert re.search(r"6 trials \(\d+ complete, \d+ fail\)", done.stdout), done.stdout
    assert "trials failed; the first, trial #" in done.stderr
    assert "is inf (a diverged loss?)" in done.stderr


# -- Ctrl-C ---------------------------------------------------------------------------


def test_an_objective_raising_keyboard_interrupt_is_a_failed_trial(tmp_path: Path) -> None:
    result = paralela.sweep(
        sweep_helpers.interrupts,
        SPACE,
        n_trials=6,
        workers=2,
        seed=3,
        run_dir=tmp_path / "run",
        progress=False,
    )
    assert len(result.trials) == 6
    for trial in result.trials:
        if trial.params["x"] > 0:
            assert trial.state == "FAIL"
            assert trial.error is not None
            assert "KeyboardInterrupt: the objective gave up" in trial.error
        else:
            assert trial.state == "COMPLETE"


SLOW_TRIAL = """\
import time
x = paralela.current_params()["x"]
time.sleep(30)
paralela.report(x * x)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_says_how_to_resume_and_keeps_the_trials(tmp_path: Path, sig: int) -> None:
    script = write_script(tmp_path, "train.py", SLOW_TRIAL)
    (tmp_path / "space.yaml").write_text("x: {type: float, low: -2.0, high: 3.0}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    argv = [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml"]
    argv += ["--trials", "4", "--run-dir", "run", "--", *command(script)]
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    logs = tmp_path / "run" / "trials"
    deadline = time.monotonic() + 30
    while not (logs.is_dir() and len(list(logs.glob("trial-*.log"))) >= 2):
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.1)
    time.sleep(0.5)  # both trials are inside their sleep
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    expected = EXIT_TERMINATED if sig == signal.SIGTERM else EXIT_INTERRUPTED
    assert proc.returncode == expected, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1, err
    assert "run the same command again" in lines[0]
    assert "trials.csv" in lines[0]
    listed = strict_json(tmp_path / "run" / "trials.json")["trials"]
    assert listed, "trials.json lists no trial"
    assert (tmp_path / "run" / "trials.csv").exists()


# -- per-trial timeout ----------------------------------------------------------------

# A command that hangs for x > 0, with a child of its own (a data loader worker) that
# must go with it: its pid is written to <x>.child.
HANGING_TRIAL = """\
import subprocess, time
x = paralela.current_params()["x"]
if x > 0:
    child = subprocess.Popen(["sleep", "600"])
    note("child", pid=child.pid)
    time.sleep(600)
paralela.report(x * x)
"""


def test_a_hanging_command_trial_is_stopped_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "notes.jsonl"
    monkeypatch.setenv(sweep_helpers.RECORD_VARIABLE, str(record))
    script = write_script(tmp_path, "train.py", HANGING_TRIAL)
    started = time.monotonic()
    result = paralela.sweep(
        command(script),
        SPACE,
        n_trials=6,
        workers=2,
        seed=3,
        trial_timeout=2.0,
        grace_period=1.0,
        run_dir=tmp_path / "run",
        progress=False,
    )
    assert time.monotonic() - started < 60
    hung = [t for t in result.trials if t.params["x"] > 0]
    assert hung
    assert {t.state for t in hung} == {"FAIL"}
    assert all(t.error is not None and "timed out after 2 s" in t.error for t in hung)
    assert all(t.duration is not None and 2.0 <= t.duration < 10 for t in hung)
    assert {t.state for t in result.trials if t.params["x"] <= 0} == {"COMPLETE"}
    children = sweep_helpers.notes(record, "child")
    assert len(children) == len(hung)
    for child in children:  # the trial's process group went, its children too
        assert sweep_helpers.pid_gone(child["pid"])


def test_a_hanging_function_trial_is_stopped_and_its_worker_replaced(tmp_path: Path) -> None:
    started = time.monotonic()
    result = paralela.sweep(
        sweep_helpers.hangs_above_zero,
        SPACE,
        n_trials=6,
        workers=2,
        seed=3,
        trial_timeout=2.0,
        run_dir=tmp_path / "run",
        progress=False,
    )
    assert time.monotonic() - started < 60
    hung = [t for t in result.trials if t.params["x"] > 0]
    assert hung
    assert all(t.state == "FAIL" and "timed out after 2 s" in (t.error or "") for t in hung)
    assert {t.state for t in result.trials if t.params["x"] <= 0} == {"COMPLETE"}
    assert len(result.trials) == 6  # the sweep went on with fresh workers


@pytest.mark.parametrize("value", [0, -1.0, "10", True])
def test_a_bad_trial_timeout_is_refused(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match="trial_timeout must be"):
        paralela.sweep(diverging, SPACE, n_trials=1, trial_timeout=value, run_dir=tmp_path)


def test_the_trial_timeout_is_each_slurm_jobs_time_limit() -> None:
    from paralela.sweeping._api import _with_time_limit

    assert _with_time_limit(None, 90)["timeout_min"] == 2
    assert _with_time_limit({"slurm_partition": "gpu"}, 30) == {
        "slurm_partition": "gpu",
        "timeout_min": 1,
    }
    with pytest.raises(ConfigError, match="give one"):
        _with_time_limit({"timeout_min": 5}, 600)


def test_trial_timeout_on_the_command_line(tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", SLOW_TRIAL)
    done = sweep_cli(
        tmp_path, "--trials", "4", "--seed", "3", "--trial-timeout", "1.5", "--",
        *command(script),
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr  # every trial hung: none completed
    assert "every trial failed (4 of 4)" in done.stderr
    assert "timed out after 1.5 s" in done.stderr
