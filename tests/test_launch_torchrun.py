"""Programs written for torchrun behave the same under ``paralela launch``.

The same script runs under torchrun itself and under ``paralela launch``; each rank
records the variables of torchrun's contract. ``@record`` errors are shown by the
launcher, as torchrun shows them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paralela.cli._errors import EXIT_FAILED

SCRIPT = Path(__file__).parent / "distributed_scripts" / "torchrun_style.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
# Differ from run to run (ports, ids, paths): compared for presence, not value. torchrun's
# agent hosts the TCPStore (USE_AGENT_STORE True); under paralela rank 0 hosts it (False).
PER_RUN = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
}
LAUNCH = [sys.executable, "-m", "paralela", "launch"]


def run(argv: list[str | Path], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def told(out: Path, rank: int) -> dict[str, object]:
    data: dict[str, object] = json.loads((out / f"rank-{rank}.json").read_text())
    return data


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is installed with torch")
def test_each_rank_gets_torchruns_whole_contract(tmp_path: Path) -> None:
    ours, theirs, logs = tmp_path / "paralela", tmp_path / "torchrun", tmp_path / "logs"
    ours.mkdir()
    theirs.mkdir()
    done = run(
        [*LAUNCH, "--nproc", "2", "--max-restarts", "1", "--log-dir", str(logs), str(SCRIPT), ours],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reference = run(
        [str(TORCHRUN), "--nproc-per-node", "2", "--max-restarts", "1", str(SCRIPT), str(theirs)],
        tmp_path,
    )
    assert reference.returncode == 0, reference.stderr
    for rank in (0, 1):
        mine, torchrun = told(ours, rank), told(theirs, rank)
        assert mine["is_torchelastic_launched"] is True
        assert mine["all_reduce"] == 2.0
        for name, value in torchrun.items():
            assert mine.get(name) is not None, f"{name} is not set (torchrun: {value!r})"
            if name not in PER_RUN:
                assert mine[name] == value, f"{name}: {mine[name]!r}, torchrun {value!r}"
    assert told(ours, 0)["TORCHELASTIC_RUN_ID"] == told(ours, 1)["TORCHELASTIC_RUN_ID"]
    files = {told(ours, r)["TORCHELASTIC_ERROR_FILE"] for r in (0, 1)}
    assert len(files) == 2  # one error file per rank


def test_the_error_that_record_wrote_is_shown(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    done = run(
        [*LAUNCH, "--nproc", "2", "--log-dir", str(logs), str(SCRIPT), str(out)],
        tmp_path,
        FAIL_RANK="1",
    )
    assert done.returncode == EXIT_FAILED, done.stderr
    error_file = Path(str(told(out, 1)["TORCHELASTIC_ERROR_FILE"]))
    assert error_file.is_relative_to(logs)
    recorded = json.loads(error_file.read_text())
    assert "loss diverged at step 3" in recorded["message"]["message"]
    assert "Rank 1" in done.stderr
    assert f"Its error ({error_file}):" in done.stderr
    assert "ValueError: loss diverged at step 3" in done.stderr
    assert "Traceback" in done.stderr  # the traceback @record captured
    assert str(logs / "rank-1.log") in done.stderr


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = run(
        [*LAUNCH, "--log-dir", str(blocker / "logs"), str(SCRIPT), str(tmp_path)],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert f"Cannot write the launch's logs to {blocker / 'logs'}" in done.stderr
    assert "Not a directory" in done.stderr
    assert "--log-dir" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounts need root")
def test_a_read_only_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    readonly = tmp_path / "ro"
    readonly.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(readonly)])
    if mounted.returncode != 0:
        pytest.skip("this machine does not allow a tmpfs mount")
    try:
        done = run(
            [*LAUNCH, "--log-dir", str(readonly), str(SCRIPT), str(tmp_path)],
            tmp_path,
        )
    finally:
        subprocess.run(["umount", str(readonly)], check=True)
    assert done.returncode == 2, done.stderr
    assert "Read-only file system" in done.stderr
