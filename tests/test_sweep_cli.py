"""``paralela sweep``: real ``python -m paralela`` processes, real trials, real SQLite;
exit codes 0 (the sweep ran), 1 (more failures than --max-failures), 2 (bad usage)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_helpers import (
    GPU_UUIDS,
    RECORD_VARIABLE,
    SLEEP_VARIABLE,
    TESTS_DIR,
    TIMED_TRIAL,
    devices_overlap,
    fake_gpu_env,
    intervals_by_device,
    most_at_once,
    notes,
    write_script,
)

pytestmark = pytest.mark.timeout(90)

SPACE_YAML = """\
x: {type: float, low: -2.0, high: 3.0}
act: "[relu]"
"""

OBJECTIVES = f"""\
import sys

sys.path.insert(0, {str(TESTS_DIR)!r})
from sweep_helpers import note


def score(params):
    note("ran", params=params)
    return (params["x"] - 1.0) ** 2
"""


def run_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m paralela sweep ARGS`` in ``tmp_path``, real GPUs hidden unless ``env``."""
    base = env if env is not None else {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    base = {**base, RECORD_VARIABLE: str(tmp_path / "notes.jsonl")}
    base = {k: v for k, v in base.items() if not k.startswith("PARALELA_")}
    return subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", *args],
        cwd=tmp_path,
        env=base,
        capture_output=True,
        text=True,
        timeout=80,
    )


@pytest.fixture
def space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE_YAML)
    return path


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    return write_script(tmp_path, "trial.py", TIMED_TRIAL)


def test_a_command_sweep_prints_a_leaderboard_and_the_best_parameters(
    tmp_path: Path, space: Path, trial: Path
) -> None:
    done = run_cli(
        tmp_path,
        *("--space", "space.yaml", "--trials", "6", "--workers", "2", "--run-dir", "out"),
        *("--", sys.executable, "trial.py", "--x", "{x}", "--act", "{act}"),
    )

    assert done.returncode == 0, done.stderr
    exported = json.loads((tmp_path / "out" / "trials.json").read_text())
    assert len(exported["trials"]) == 6
    assert {t["state"] for t in exported["trials"]} == {"COMPLETE"}
    assert len(notes(tmp_path / "notes.jsonl", "ran")) == 6
    best = exported["best"]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Leaderboard of trial")
    assert sum(1 for line in lines if line.startswith("│ ")) >= 6  # a row per trial
    for t in exported["trials"]:
        assert f"#{t['number']} " in done.stdout
    # printed as it is (no rich markup eats "[relu]"), on one line
    assert best["params"]["act"] == "[relu]"
    assert f"Best parameters: {json.dumps(best['params'])}" in lines
    assert "6 trials (6 complete) on 2 slots" in done.stdout
    assert f"best #{best['number']}: " in done.stdout
    assert "Trials, logs and plots: out" in lines
    assert (tmp_path / "out" / "plots" / "optimization_history.png").is_file()


def test_a_multi_objective_leaderboard_is_the_pareto_front_with_every_objective(
    tmp_path: Path,
) -> None:
    """x^2 (minimised) and sin(x) (maximised) on six rows: four of them are the front."""
    xs = [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    (tmp_path / "rows.csv").write_text("x\n" + "\n".join(map(str, xs)) + "\n")
    done = run_cli(
        tmp_path,
        *("--space", "rows.csv", "--function", "sweep_helpers:two_objectives"),
        *("--direction", "minimize,maximize", "--workers", "2", "--run-dir", "out"),
        *("--no-plots",),
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(TESTS_DIR)},
    )

    assert done.returncode == 0, done.stderr
    exported = json.loads((tmp_path / "out" / "trials.json").read_text())
    number = {t["params"]["x"]: t["number"] for t in exported["trials"]}
    import optuna

    study = optuna.load_study(study_name=exported["study_name"], storage=exported["storage"])
    front = sorted(t.number for t in study.best_trials)  # Optuna's Pareto front
    assert front == sorted(number[x] for x in (0.0, 0.5, 1.0, 2.0))
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Pareto front of two_objectives")
    header = [line.split("┃") for line in lines if line.startswith("┃")]  # two lines
    columns = [" ".join(cells).split() for cells in zip(*header, strict=True)]
    assert ["value", "0", "minimize"] in columns
    assert ["value", "1", "maximize"] in columns
    rows = {int(line.split("#")[1].split()[0]): line for line in lines if "│ #" in line}
    assert sorted(rows) == front  # every trial of the front, and only those
    for x in (0.0, 0.5, 1.0, 2.0):  # each row shows both objectives
        cells = [cell.strip() for cell in rows[number[x]].split("│")]
        assert f"{x * x:.6g}" in cells
        assert f"{math.sin(x):.6g}" in cells
    assert "Best parameters:" not in done.stdout  # several objectives: no single best
    assert "Pareto front: 4 trials" in done.stdout


def test_a_function_sweep_with_json_output(tmp_path: Path, space: Path) -> None:
    (tmp_path / "objectives.py").write_text(OBJECTIVES)
    done = run_cli(
        tmp_path,
        *("--space", "space.yaml", "--function", "objectives:score", "--trials", "4"),
        *("--workers", "2", "--run-dir", "out", "--json", "--seed", "3"),
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # only JSON on stdout
    assert result == json.loads((tmp_path / "out" / "trials.json").read_text())
    assert result["study_name"].startswith("score-")
    assert len(result["trials"]) == 4
    values = [t["value"] for t in result["trials"]]
    assert values == [(t["params"]["x"] - 1.0) ** 2 for t in result["trials"]]
    assert result["best"]["value"] == min(values)
    ran = notes(tmp_path / "notes.jsonl", "ran")
    assert sorted(n["params"]["x"] for n in ran) == sorted(
        t["params"]["x"] for t in result["trials"]
    )


def test_gpus_pins_one_trial_per_gpu(tmp_path: Path, space: Path, trial: Path) -> None:
    env = {**fake_gpu_env(tmp_path / "gpus"), SLEEP_VARIABLE: "0.3"}
    done = run_cli(
        tmp_path,
        *("--space", "space.yaml", "--trials", "6", "--gpus", "0,1,2", "--run-dir", "out"),
        *("--json", "--", sys.executable, "trial.py", "--x", "{x}"),
        env=env,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["slots"] == 3
    by_device = intervals_by_device(notes(tmp_path / "notes.jsonl", "ran"))
    assert set(by_device) == set(GPU_UUIDS)
    assert all(most_at_once(intervals) == 1 for intervals in by_device.values())
    assert devices_overlap(by_device)
    assert {t["devices"] for t in result["trials"]} == set(GPU_UUIDS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--space", "bad.yaml", "--trials", "2", "--", "python", "trial.py"),
            "bad.yaml, line 2, parameter 'lr': type float needs 'low' and 'high'",
        ),
        (
            ("--space", "missing.yaml", "--trials", "2", "--", "python", "trial.py"),
            "Search space file not found: 'missing.yaml'",
        ),
        (
            ("--space", "space.yaml", "--trials", "2", "--sampler", "bayes", "--", "python"),
            "Unknown sampler 'bayes'; valid samplers are: tpe, random, grid,",
        ),
        (
            ("--space", "space.yaml", "--trials", "2", "--pruner", "early", "--", "python"),
            "Unknown pruner 'early'; valid pruners are: none, median,",
        ),
        (
            ("--space", "space.yaml", "--trials", "2", "--", "no-such-trainer-xyz", "--x", "{x}"),
            "Trial command not found: 'no-such-trainer-xyz'",
        ),
        (
            ("--space", "space.yaml", "--trials", "2", "--", "python", "trial.py", "{lr}"),
            "uses {lr}, which the space does not define",
        ),
        (
            ("--space", "space.yaml", "--", "python", "trial.py", "{x}"),
            "Give a trial budget (n_trials=, --trials) or a time budget",
        ),
        (("--space", "space.yaml", "--trials", "2"), "give the trial command after '--'"),
        (
            ("--space", "space.yaml", "--function", "m:f", "--trials", "2", "--", "python"),
            "give either --function or a command after '--', not both",
        ),
    ],
    ids=[
        "bad-space",
        "missing-space",
        "sampler",
        "pruner",
        "not-found",
        "placeholder",
        "no-budget",
        "no-command",
        "both",
    ],
)
def test_bad_usage_exits_2_with_a_message_and_runs_nothing(
    args: tuple[str, ...], message: str, tmp_path: Path, space: Path
) -> None:
    (tmp_path / "bad.yaml").write_text("x: {type: float, low: 0, high: 1}\nlr: {type: float}\n")
    done = run_cli(tmp_path, *args, "--run-dir", "out")

    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("Error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "notes.jsonl").exists()
    assert not (tmp_path / "out").exists()


def test_more_failures_than_max_failures_exits_1(tmp_path: Path, space: Path) -> None:
    write_script(
        tmp_path,
        "crash.py",
        """\
        note("ran")
        print("CUDA out of memory (pretend)", file=sys.stderr)
        sys.exit(4)
        """,
    )
    done = run_cli(
        tmp_path,
        *("--space", "space.yaml", "--trials", "50", "--workers", "1", "--max-failures", "1"),
        *("--run-dir", "out", "--", sys.executable, "crash.py", "{x}"),
    )

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Error: 2 trials failed, more than max_failures=1; the sweep stopped." in done.stderr
    assert "exit code 4" in done.stderr
    assert "CUDA out of memory (pretend)" in done.stderr
    assert len(notes(tmp_path / "notes.jsonl", "ran")) == 2
