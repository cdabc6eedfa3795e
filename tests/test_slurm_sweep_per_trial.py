"""One Slurm job per trial (``sweep(..., backend="slurm")``, ``--slurm-mode per-trial``).

The unit tests drive the job watcher with a fake state reader; the real tests submit to
the local cluster: values, one job per trial, at most ``workers`` at once, pruning that
cancels the job, a failed job recorded with its state and log, and a driver killed by
SIGKILL whose jobs are cancelled and whose sweep continues on the next run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import pytest
from sweep_helpers import RECORD_VARIABLE, SLEEP_VARIABLE, TIMED_TRIAL, most_at_once, notes
from sweep_helpers import write_script as write_trial

import paralela
from paralela.backends.slurm import JobState
from paralela.cli._errors import EXIT_FAILED
from paralela.errors import ConfigError
from paralela.sweeping._report import ENV_REPORT_FILE, report
from paralela.sweeping._slurm_trials import (
    TRIAL_OPTIONS,
    SlurmTrial,
    SlurmTrials,
    function_command,
    importable_name,
    returncode_of,
)
from paralela.sweeping._trials import Reaper, TrialSpec

PYTHON = sys.executable
SLURM_TEST_TIMEOUT = 300
SPACE = "x:\n  type: float\n  low: -2.0\n  high: 3.0\n"


def spec(tmp_path: Path, number: int = 0) -> TrialSpec:
    return TrialSpec(number, number, {"x": 1.0}, str(tmp_path / f"trial-{number:05d}.log"))


# -- pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (JobState("1", "COMPLETED", "0:0"), 0),
        (JobState("1", "FAILED", "3:0"), 3),
        (JobState("1", "CANCELLED", "0:15"), -15),
        (JobState("1", "TIMEOUT", ""), 1),
        (JobState("1", "VANISHED", "", "paralela"), 1),
    ],
)
def test_a_job_state_becomes_the_trial_command_exit_code(state: JobState, code: int) -> None:
    assert returncode_of(state) == code


def test_report_appends_whole_lines_to_the_report_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trial.reports"
    monkeypatch.setenv(ENV_REPORT_FILE, str(path))
    report(0.5)
    report(0.25, step=7)
    report(float("nan"))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 7, 8]
    assert json.loads(lines[1])["value"] == 0.25
    assert lines[2] == '{"value": NaN, "step": 8}'


def test_new_reports_reads_only_complete_new_lines(tmp_path: Path) -> None:
    reports = tmp_path / "t.reports"
    trial = SlurmTrial(spec(tmp_path), "7", reports)
    assert trial.new_reports() == []  # no file yet
    reports.write_bytes(b'{"value": 1.5, "step": 0}\n{"value": 2.')
    assert trial.new_reports() == [(1.5, 0)]
    with open(reports, "ab") as fh:
        fh.write(b'5, "step": 1}\nnot json\n')
    assert trial.new_reports() == [(2.5, 1)]
    assert trial.new_reports() == []


class ScriptedReader:
    """A state reader that answers what the test scripted, one answer per query."""

    def __init__(self, answers: list[dict[str, JobState]]) -> None:
        self.answers = answers
        self.asked: list[list[str]] = []

    def query(self, job_ids: list[str]) -> dict[str, JobState]:
        self.asked.append(list(job_ids))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def watch_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers: list[dict[str, JobState]]
) -> tuple[SlurmTrial, list[tuple[Any, ...]]]:
    """Follow one (not submitted) trial with a scripted reader until its exit event."""
    monkeypatch.setattr("paralela.backends.slurm.require_slurm", lambda _: None)
    watcher = SlurmTrials({}, reader=ScriptedReader(answers))  # type: ignore[arg-type]
    trial = SlurmTrial(spec(tmp_path), "7", tmp_path / "t.reports")
    events: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
    (tmp_path / "t.reports").write_text('{"value": 4.0, "step": 0}\n')
    watcher.follow(trial, events)
    seen: list[tuple[Any, ...]] = []
    try:
        while not seen or seen[-1][0] != "exit":
            seen.append(events.get(timeout=20))
    except Empty:
        pytest.fail(f"no exit event; saw {seen}")
    finally:
        watcher.close()
    return trial, seen


def test_a_timed_out_job_ends_its_trial_with_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = {"7": JobState("7", "RUNNING", "", "sacct")}
    timed_out = {"7": JobState("7", "TIMEOUT", "0:15", "sacct")}
    trial, seen = watch_one(tmp_path, monkeypatch, [running, running, timed_out])
    assert seen == [("report", trial, 4.0, 0), ("exit", trial, -15)]
    expected = "the trial's Slurm job 7 ended TIMEOUT (killed by signal 15)"
    assert trial.describe_exit(-15) == expected


def test_a_job_no_command_knows_any_more_ends_its_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("paralela.sweeping._slurm_trials.LOST_AFTER_S", 1.0)
    trial, seen = watch_one(tmp_path, monkeypatch, [{}])
    assert seen[-1] == ("exit", trial, 1)
    assert "VANISHED" in trial.describe_exit(1)
    assert "no Slurm command knew it" in trial.describe_exit(1)


def test_the_reaper_cancels_the_jobs_still_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = tmp_path / "scancel.args"
    fake = tmp_path / "bin" / "scancel"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {said}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    reaper = Reaper(grace=1.0)
    for job in ("11", "12", "13"):
        reaper.add_job(job)
    reaper.discard_job("12")
    reaper.close()
    assert said.read_text().split() == ["11", "13"]


def test_unknown_trial_job_options_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("paralela.backends.slurm.require_slurm", lambda _: None)
    with pytest.raises(ConfigError) as caught:
        SlurmTrials({"gpus_per_node": 1})
    assert ", ".join(TRIAL_OPTIONS) in str(caught.value)


def objective_here(params: dict[str, Any]) -> float:
    return float(params["x"])


def test_only_an_importable_function_can_run_as_a_job() -> None:
    assert importable_name(objective_here) == f"{__name__}:objective_here"
    assert function_command("m:f", "py") == ["py", "-m", "paralela.sweeping._function_trial", "m:f"]
    with pytest.raises(ConfigError, match="cannot be imported there"):
        importable_name(lambda params: 0.0)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"backend": "ray"}, "Unknown backend 'ray'; valid backends are: processes, slurm"),
        ({"backend_options": {"mem_gb": 2}}, "add backend='slurm'"),
        ({"backend": "slurm", "gpus_per_trial": 2}, "gpus_per_trial chooses this machine's"),
        ({"backend": "slurm", "gpus": "0"}, "'gpus_per_task': N"),
    ],
)
def test_sweep_refuses_bad_backend_arguments_before_anything_runs(
    tmp_path: Path, kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        paralela.sweep(
            ["true"], {"x": {"type": "float", "low": 0, "high": 1}}, n_trials=1,
            run_dir=tmp_path / "run", **kwargs,
        )  # fmt: skip
    assert not (tmp_path / "run").exists()


# -- against the real cluster --------------------------------------------------------


def cli(
    tmp_path: Path, *args: str, env: dict[str, str], space: str = "space.yaml"
) -> subprocess.Popen[str]:
    """``paralela sweep --backend slurm --slurm-mode per-trial ... --json ARGS`` started."""
    return subprocess.Popen(
        [PYTHON, "-m", "paralela", "sweep", "--space", space, "--backend", "slurm",
         "--slurm-mode", "per-trial", "--slurm-partition", "debug", "--timeout-min", "5",
         "--no-plots", "--json", "--run-dir", str(tmp_path / "run"), *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def trials_of(proc: subprocess.Popen[str], returncode: int = 0) -> list[dict[str, Any]]:
    """The trials a sweep started by :func:`cli` printed, once it exited ``returncode``
    (1: every trial failed)."""
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == returncode, err
    if returncode:
        assert "every trial failed" in err
    trials: list[dict[str, Any]] = json.loads(out)["trials"]
    return trials


def trial_env(tmp_path: Path, sleep: float) -> dict[str, str]:
    env = {**os.environ, RECORD_VARIABLE: str(tmp_path / "record.jsonl")}
    env[SLEEP_VARIABLE] = str(sleep)
    return env


def job_ids(run: Path) -> dict[int, str]:
    """Trial number -> the job that ran it (the last one, for a trial run again)."""
    found = {}
    for line in (run / "slurm-trials.jsonl").read_text().splitlines():
        entry = json.loads(line)
        found[entry["trial"]] = entry["job"]
    return found


def sacct_state(job: str) -> str:
    """The job's state in accounting, waiting (30 s at most) until it has one."""
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        state = done.stdout.strip().split(" ")[0]
        if state or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def in_queue(jobs: list[str]) -> list[str]:
    done = subprocess.run(
        ["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return done.stdout.split()


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_each_trial_is_a_job_of_its_own_and_at_most_workers_run_at_once(
    slurm_cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    trial = write_trial(
        tmp_path, "trial.py", TIMED_TRIAL + 'print("job", os.environ["SLURM_JOB_ID"])\n'
    )
    proc = cli(
        tmp_path, "--trials", "5", "--workers", "2", "--",
        PYTHON, str(trial), "--x", "{x}", env=trial_env(tmp_path, 1.0),
    )  # fmt: skip
    trials = trials_of(proc)
    assert [t["state"] for t in trials] == ["COMPLETE"] * 5
    ran = notes(tmp_path / "record.jsonl", "ran")
    assert sorted(r["params"]["x"] for r in ran) == sorted(t["params"]["x"] for t in trials)
    for t in trials:  # the value each trial's job reported is the trial's value
        assert t["values"] == [pytest.approx((t["params"]["x"] - 1.0) ** 2)]
    jobs = job_ids(tmp_path / "run")
    assert len(set(jobs.values())) == 5  # one job per trial
    for number, job in jobs.items():
        log = (tmp_path / "run" / "trials" / f"trial-{number:05d}.log").read_text()
        assert f"job {job}" in log  # the job's output is the trial's log
        assert sacct_state(job) == "COMPLETED"
    assert most_at_once([(r["start"], r["end"]) for r in ran]) <= 2


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_pruned_trial_has_its_job_cancelled(slurm_cluster: str, tmp_path: Path) -> None:
    # Five good trials, then a bad one that would report for 60 s: the median pruner
    # (4 startup trials, 1 warm-up step) stops it after its second report.
    (tmp_path / "space.csv").write_text("x\n" + "0.1\n" * 5 + "5.0\n")
    trial = write_trial(
        tmp_path,
        "steps.py",
        """
        x = paralela.current_params()["x"]
        for step in range(200 if x > 1 else 3):
            paralela.report(x + 1.0 / (step + 1), step=step)
            time.sleep(0.3)
        note("finished", x=x)
        """,
    )
    proc = cli(
        tmp_path, "--workers", "1", "--pruner", "median", "--", PYTHON, str(trial),
        env=trial_env(tmp_path, 0), space="space.csv",
    )  # fmt: skip
    trials = trials_of(proc)
    assert [t["state"] for t in trials] == ["COMPLETE"] * 5 + ["PRUNED"]
    assert len(notes(tmp_path / "record.jsonl", "finished")) == 5  # the bad one never did
    bad = job_ids(tmp_path / "run")[5]
    assert sacct_state(bad) == "CANCELLED"
    assert trials[5]["duration"] < 30


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_failed_job_is_recorded_with_its_state_and_log(
    slurm_cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    trial = write_trial(tmp_path, "fails.py", 'print("about to fail", flush=True)\nsys.exit(3)\n')
    proc = cli(tmp_path, "--trials", "1", "--", PYTHON, str(trial), env=trial_env(tmp_path, 0))
    (failed,) = trials_of(proc, returncode=EXIT_FAILED)
    assert failed["state"] == "FAIL"
    assert failed["exit_code"] == 3
    job = job_ids(tmp_path / "run")[0]
    assert failed["error"].startswith(f"the trial's Slurm job {job} ended FAILED (exit code 3)")
    assert "about to fail" in failed["error"]  # the end of its log


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_timed_out_job_ends_its_trial_instead_of_leaving_the_driver_waiting(
    slurm_cluster: str, tmp_path: Path
) -> None:
    # A 5 s time limit (sbatch --time=0:05) on a trial that would sleep 5 minutes: the
    # controller ends it within about a minute (it checks time limits periodically).
    (tmp_path / "space.yaml").write_text(SPACE)
    trial = write_trial(tmp_path, "slow.py", "paralela.report(1.0, step=0)\ntime.sleep(300)\n")
    proc = cli(
        tmp_path, "--trials", "1", "--slurm-additional", "time=0:05", "--", PYTHON, str(trial),
        env=trial_env(tmp_path, 0),
    )  # fmt: skip
    (timed_out,) = trials_of(proc, returncode=EXIT_FAILED)
    assert timed_out["state"] == "FAIL"
    assert timed_out["intermediate"] == {"0": 1.0}  # what it reported before is kept
    job = job_ids(tmp_path / "run")[0]
    assert timed_out["error"].startswith(f"the trial's Slurm job {job} ended TIMEOUT")
    assert "DUE TO TIME LIMIT" in timed_out["error"]  # slurmstepd's line in its log
    assert sacct_state(job) == "TIMEOUT"


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_killed_driver_has_its_jobs_cancelled_and_the_sweep_continues(
    slurm_cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    trial = write_trial(tmp_path, "trial.py", TIMED_TRIAL)
    argv = ["--trials", "3", "--workers", "2", "--", PYTHON, str(trial), "--x", "{x}"]
    first = cli(tmp_path, *argv, env=trial_env(tmp_path, 120))  # trials that would last
    record = tmp_path / "run" / "slurm-trials.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if record.exists() and len(record.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    jobs = list(job_ids(tmp_path / "run").values())
    assert len(jobs) == 2
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    deadline = time.monotonic() + 90
    while in_queue(jobs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert in_queue(jobs) == []  # the reaper cancelled them
    # (accounting may take a moment to record a job cancelled while it was pending)
    deadline = time.monotonic() + 30
    while [sacct_state(job) for job in jobs] != ["CANCELLED"] * 2:
        assert time.monotonic() < deadline, [sacct_state(job) for job in jobs]
        time.sleep(0.5)
    assert notes(tmp_path / "record.jsonl", "ran") == []  # nothing finished

    again = cli(tmp_path, *argv, env=trial_env(tmp_path, 0.2))
    trials = trials_of(again)
    assert sorted(t["state"] for t in trials if t["state"] == "COMPLETE") == ["COMPLETE"] * 3
    assert len(notes(tmp_path / "record.jsonl", "ran")) == 3  # each trial ran once


@pytest.mark.slurm
@pytest.mark.timeout(SLURM_TEST_TIMEOUT)
def test_a_function_objective_runs_in_jobs_through_the_python_api(
    slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "objectives_for_jobs.py").write_text(
        "import os\n"
        "import paralela\n"
        "def bowl(params):\n"
        "    paralela.report(100.0, step=0)\n"
        "    return (params['x'] - 1.0) ** 2 + len(os.environ['SLURM_JOB_ID']) * 0\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import objectives_for_jobs

    result = paralela.sweep(
        objectives_for_jobs.bowl, SPACE_DICT, n_trials=3, workers=3, backend="slurm",
        backend_options={"slurm_partition": slurm_cluster, "timeout_min": 5},
        run_dir=tmp_path / "run", plots=False, progress=False,
    )  # fmt: skip
    assert [t.state for t in result.trials] == ["COMPLETE"] * 3
    for t in result.trials:
        assert t.value == pytest.approx((t.params["x"] - 1.0) ** 2)
        # What it reported, then its return value as its last report.
        assert t.intermediate == {0: 100.0, 1: t.value}
    assert len(set(job_ids(tmp_path / "run").values())) == 3


SPACE_DICT = {"x": {"type": "float", "low": -2.0, "high": 3.0}}
