"""Running a sweep again continues it: after a driver killed with SIGKILL mid-sweep
(a real separate Python process, real trial processes, real SQLite), and after a run
that simply ended. Finished trials are kept and never run again; interrupted ones are
re-run exactly once; the budget counts every run's trials.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import sweep_helpers
from optuna.trial import TrialState
from sweep_helpers import RECORD_VARIABLE, RESUME_TRIAL, TESTS_DIR, notes, pid_gone, write_script

import paralela
from paralela.errors import ConfigError

pytestmark = pytest.mark.timeout(90)

N_TRIALS = 8
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

DRIVER = f"""\
import sys
from pathlib import Path

sys.path.insert(0, {str(TESTS_DIR)!r})
import paralela
import sweep_helpers

kind, run_dir = sys.argv[1], Path(sys.argv[2])
space = {{"x": {{"type": "float", "low": 0.0, "high": 1.0}}}}
if kind == "function":
    objective = sweep_helpers.slow_by_phase
elif kind == "optuna":  # objective(trial): samples x itself, in its worker
    objective, space = sweep_helpers.slow_by_phase_trial, None
else:
    objective = sweep_helpers.command(run_dir.parent / "resume_trial.py")
paralela.sweep(
    objective,
    space,
    n_trials={N_TRIALS},
    workers=2,
    run_dir=run_dir,
    study_name="resume",
)
"""


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same CPU slots on every machine: hide real GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def start_driver(tmp_path: Path, kind: str, phase: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        RECORD_VARIABLE: str(tmp_path / "notes.jsonl"),
        "SWEEP_TEST_PHASE": phase,
        "CUDA_VISIBLE_DEVICES": "",
    }
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), kind, str(tmp_path / "run")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def complete_in_database(database: Path) -> int:
    """Trials the killed driver has told Optuna about (read with plain sqlite3)."""
    if not database.exists():
        return 0
    with sqlite3.connect(database, timeout=5) as db:
        try:
            (count,) = db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
        except sqlite3.OperationalError:  # the tables are not there yet
            return 0
    return int(count)


def load(run_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name="resume", storage=f"sqlite:///{run_dir / 'study.db'}")


def key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


@pytest.mark.parametrize("kind", ["command", "function", "optuna"])
def test_a_killed_driver_resumes_finished_trials_kept_interrupted_ones_rerun_once(
    kind: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    write_script(tmp_path, "resume_trial.py", RESUME_TRIAL)
    record, run_dir = tmp_path / "notes.jsonl", tmp_path / "run"

    # -- first run: two trials end at once, the next ones last a minute; kill the driver
    first = start_driver(tmp_path, kind, "first")
    try:
        poll(
            lambda: len(notes(record, "end")) >= 2 and len(notes(record, "start")) >= 4,
            timeout=30,
            what="two finished trials and two running ones",
        )
        poll(lambda: complete_in_database(run_dir / "study.db") >= 2, timeout=10)
        # command trials: the two slow trial processes; function trials: the workers
        pids = {n["pid"] for n in notes(record, "start")}
        if kind == "command":
            pids -= {n["pid"] for n in notes(record, "end")}
        first.kill()  # SIGKILL: the driver cleans up nothing
        assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.stdout is not None
    first.stdout.close()
    # Its trial processes (command) or worker processes (function) do not linger.
    assert len(pids) == 2
    poll(
        lambda: all(pid_gone(pid) for pid in pids),
        timeout=15,
        what="the killed driver's trials to stop",
    )
    started_first = notes(record, "start")
    ended_first = notes(record, "end")
    assert len(ended_first) == 2

    before = load(run_dir)
    finished = {t.number: t for t in before.get_trials(states=(TrialState.COMPLETE,))}
    left_running = before.get_trials(states=(TrialState.RUNNING,))
    # The two slow trials, and maybe trials asked ahead but not started. A trial the
    # driver was killed while asking for has no parameters yet: it cannot have run.
    interrupted = {t.number: t for t in left_running if t.params}
    assert len(finished) == 2
    assert {key(t.params) for t in finished.values()} == {key(n["params"]) for n in ended_first}
    assert len(interrupted) >= 2
    assert {key(n["params"]) for n in started_first} <= {
        key(t.params) for t in [*finished.values(), *interrupted.values()]
    }

    # -- second run: the same sweep again
    second = start_driver(tmp_path, kind, "second")
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out

    after = load(run_dir)
    by_number = {t.number: t for t in after.trials}
    # finished trials are kept as they were
    for number, trial in finished.items():
        kept = by_number[number]
        assert kept.state == TrialState.COMPLETE
        assert (kept.params, kept.values) == (trial.params, trial.values)
    # each interrupted trial is marked, and re-run exactly once with its parameters
    reruns = {
        t.user_attrs["paralela:rerun_of"]: t
        for t in after.trials
        if "paralela:rerun_of" in t.user_attrs
    }
    assert set(reruns) == set(interrupted)
    for number, trial in interrupted.items():
        assert by_number[number].state == TrialState.FAIL
        assert by_number[number].system_attrs["paralela:interrupted"] is True
        assert reruns[number].state == TrialState.COMPLETE
        assert reruns[number].params == trial.params
    # what really ran: nothing finished ran twice, each interrupted trial once more
    starts = Counter(key(n["params"]) for n in notes(record, "start"))
    second_starts = Counter(
        key(n["params"]) for n in notes(record, "start") if n["phase"] == "second"
    )
    for trial in finished.values():
        assert starts[key(trial.params)] == 1
    for trial in interrupted.values():
        assert second_starts[key(trial.params)] == 1
    slow = {key(n["params"]) for n in started_first} - {key(n["params"]) for n in ended_first}
    assert len(slow) == 2
    assert all(starts[k] == 2 for k in slow)  # killed once, then run to the end once
    assert sum(second_starts.values()) == N_TRIALS - len(finished)
    # the budget: every counted trial (not interrupted, not unused) adds up to n_trials
    counted = [
        t
        for t in after.trials
        if t.state.is_finished()
        and "paralela:interrupted" not in t.system_attrs
        and "paralela:unused" not in t.system_attrs
    ]
    assert len(counted) == N_TRIALS
    assert all(t.state == TrialState.COMPLETE for t in counted)
    assert after.get_trials(states=(TrialState.RUNNING, TrialState.WAITING)) == []
    # trials.json tells the story
    exported = json.loads((run_dir / "trials.json").read_text())
    states = {t["number"]: (t["state"], t["error"]) for t in exported["trials"]}
    for t in left_running:
        assert states[t.number] == ("FAIL", "interrupted: its driver died; queued again")
    assert any(
        note.startswith("re-running trials interrupted when a driver died: ")
        for note in exported["notes"]
    )
    assert sum(1 for state, _ in states.values() if state == "COMPLETE") == N_TRIALS


# -- running again after a run that ended ---------------------------------------------


def test_running_again_counts_earlier_trials_against_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    run_dir = tmp_path / "run"
    first = paralela.sweep(sweep_helpers.quadratic, SPACE, n_trials=3, run_dir=run_dir)
    assert len(notes(record)) == 3
    second = paralela.sweep(sweep_helpers.quadratic, SPACE, n_trials=5, run_dir=run_dir)
    assert len(notes(record)) == 5  # two more, not five
    third = paralela.sweep(sweep_helpers.quadratic, SPACE, n_trials=5, run_dir=run_dir)
    assert len(notes(record)) == 5  # the budget is spent: nothing runs

    assert [t.number for t in second.trials] == [0, 1, 2, 3, 4]
    assert [t.params for t in second.trials[:3]] == [t.params for t in first.trials]
    assert [(t.number, t.params, t.value) for t in third.trials] == [
        (t.number, t.params, t.value) for t in second.trials
    ]
    assert third.best_params == second.best_params


def test_a_csv_sweep_continues_with_the_rows_it_did_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    space = tmp_path / "rows.csv"
    space.write_text("x\n0.25\n0.5\n0.75\n1.0\n")
    run_dir = tmp_path / "run"
    paralela.sweep(sweep_helpers.quadratic, space, n_trials=2, workers=1, run_dir=run_dir)
    result = paralela.sweep(sweep_helpers.quadratic, space, workers=1, run_dir=run_dir)

    assert [t.params["x"] for t in result.trials] == [0.25, 0.5, 0.75, 1.0]
    ran = [n["params"]["x"] for n in notes(record)]
    assert ran == [0.25, 0.5, 0.75, 1.0]  # each row once, in order, over the two runs


def test_continuing_with_another_direction_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    run_dir = tmp_path / "run"
    paralela.sweep(sweep_helpers.quadratic, SPACE, n_trials=2, run_dir=run_dir)
    with pytest.raises(ConfigError) as info:
        paralela.sweep(
            sweep_helpers.quadratic, SPACE, n_trials=4, direction="maximize", run_dir=run_dir
        )
    message = str(info.value)
    assert "was started with direction(s) minimize, not maximize" in message
    assert "Use the same direction(s) as before, or another run_dir / study name" in message
    assert len(notes(record)) == 2  # no trial ran the second time
