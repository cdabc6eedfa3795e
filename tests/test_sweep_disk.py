"""A full disk or a read-only run directory: one paragraph naming the path and the real
cause, never a database traceback. Real small tmpfs mounts (CI runs as root); a disk
that fills while the trials run, too.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from disk_helpers import fill, mount_tmpfs, unmount
from sweep_helpers import command, write_script

from paralela.cli._errors import EXIT_FAILED
from paralela.studies import storage_problem

pytestmark = pytest.mark.timeout(120)

SPACE = "x: {type: float, low: 0.0, high: 1.0}\n"
QUICK = "paralela.report(paralela.current_params()['x'])\n"
# Trials with x > 0.5 fill the filesystem the run directory is on, then report.
FILLER = """\
x = paralela.current_params()["x"]
if x > 0.5:
    try:
        with open(os.path.join(os.environ["FILL_DIR"], f"ballast-{os.getpid()}"), "wb") as f:
            while True:
                f.write(bytes(65536))
    except OSError:
        pass
paralela.report(x)
"""


def sweep_cli(
    cwd: Path, run_dir: Path, script: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    (cwd / "space.yaml").write_text(SPACE)
    sweep = [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml"]
    return subprocess.run(
        [*sweep, "--run-dir", str(run_dir), *args, "--", *command(script)],
        cwd=cwd,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env},
        capture_output=True,
        text=True,
        timeout=100,
    )


def assert_one_paragraph(stderr: str, run_dir: Path, reason: str) -> None:
    assert "Traceback" not in stderr
    assert "exceeding max length" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    assert f"cannot write its run directory {run_dir}" in errors[0]
    assert reason in errors[0]
    assert "--run-dir" in errors[0]


def test_a_full_disk_before_the_first_trial(small_disk: Path, tmp_path: Path) -> None:
    fill(small_disk / "ballast")
    script = write_script(tmp_path, "train.py", QUICK)
    done = sweep_cli(tmp_path, small_disk / "run", script, "--trials", "2")
    assert done.returncode == EXIT_FAILED
    assert_one_paragraph(done.stderr, small_disk / "run", "disk is full")


def test_a_disk_that_fills_while_trials_run(small_disk: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", "import os\n" + FILLER)
    run_dir = small_disk / "run"
    done = sweep_cli(
        tmp_path, run_dir, script, "--trials", "12", "--seed", "1", FILL_DIR=str(small_disk)
    )
    assert done.returncode == EXIT_FAILED, done.stderr
    assert_one_paragraph(done.stderr, run_dir, "full")
    # Space again: the same sweep continues from what was saved.
    for ballast in small_disk.glob("ballast-*"):
        ballast.unlink()
    again = sweep_cli(tmp_path, run_dir, write_script(tmp_path, "train.py", QUICK), "--trials", "3")
    assert "cannot write" not in again.stderr


def test_a_read_only_run_directory(tmp_path: Path) -> None:
    readonly = tmp_path / "ro"
    mount_tmpfs(readonly, "ro,size=64k")
    try:
        script = write_script(tmp_path, "train.py", QUICK)
        done = sweep_cli(tmp_path, readonly / "run", script, "--trials", "2")
    finally:
        unmount(readonly)
    assert done.returncode == EXIT_FAILED
    assert_one_paragraph(done.stderr, readonly / "run", "Read-only file system")


def test_the_cause_is_found_under_optunas_wrapping() -> None:
    import optuna
    import sqlalchemy.exc

    root = sqlite3.OperationalError("database or disk is full")
    middle = sqlalchemy.exc.OperationalError("INSERT ...", {}, root)
    middle.__cause__ = root
    wrapped = optuna.exceptions.StorageInternalError(
        "An exception is raised during the commit. This typically happens due to "
        "invalid data in the commit, e.g. exceeding max length."
    )
    wrapped.__cause__ = middle
    assert storage_problem(wrapped) == ("database or disk is full", None)
    assert storage_problem(ValueError("unrelated")) is None
    full = OSError(28, "No space left on device", "/data/run/trials.csv")
    assert storage_problem(full) == ("No space left on device", "/data/run/trials.csv")
