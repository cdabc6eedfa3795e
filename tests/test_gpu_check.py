"""The prepared GPU check (tools/gpu-check.sh, docs/gpu-check.md) in its dry run: every
check's logic for real on the CPU (a fake nvidia-smi, gloo for NCCL, tiny sizes), so that
the script cannot rot between the times a GPU is at hand."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("pytest", "sweep", "launch", "pipeline", "serve", "predict", "data")
# a figure each check must report (its own result, not only that it ran)
FIGURES = {
    "sweep": "most trials at once",
    "launch": "gloo, 2 ranks sharing the GPU: largest weight difference to the CPU run",
    "pipeline": "1f1b: weights / outputs vs CPU",
    "serve": "batched / --max-batch 1",
    "predict": "serial loop sentences/s",
    "data": "busy share, paralela / DataLoader",
}


@pytest.mark.slow
def test_the_dry_run_reports_every_check_and_a_failure_with_its_log(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PARALELA_GPU_CHECK_DRY": "1",
        "PYTHON": sys.executable,
        "GPU_CHECK_FAIL": "pytest",  # pytest's check raises once its workload is done
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-check.sh"), str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=115,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    report = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "**6 of 7 checks passed**" in report, report
    assert "dry run on the CPU" in report  # the device line
    rows = dict(re.findall(r"^\| (\w+) \| (PASS|FAIL) \|", report, re.MULTILINE))
    assert rows == {name: "FAIL" if name == "pytest" else "PASS" for name in CHECKS}, report
    sections = dict(re.findall(r"^### (\w+): \w+\n(.*?)(?=^### |\Z)", report, re.M | re.S))
    for name, figure in FIGURES.items():
        assert figure in sections[name], f"{name}: no {figure!r} in\n{sections[name]}"
    failed = sections["pytest"]
    assert "the check's process exited 1" in failed
    assert "Log (last lines):" in failed
    assert "-m pytest -m gpu" in failed  # the log shows what ran ...
    assert "RuntimeError: failure injected by GPU_CHECK_FAIL=pytest" in failed  # ... and why
    assert "- passed:" not in failed  # a check that crashed has no figures
    assert "Log (last lines):" not in sections["serve"]  # a passing check has no log
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert all(f"===== {name} =====" in log for name in CHECKS)
    assert "gpu-check: pytest: FAIL" in done.stdout


HANGING_CHECK = """
import subprocess, sys, time
from pathlib import Path

def check(mode, work):
    # a grandchild in a session of its own, as sweep trials and launch ranks are
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    Path(sys.argv[sys.argv.index("--work") + 1] + ".pid").write_text(str(stray.pid))
    print("hanging now", flush=True)
    time.sleep(600)
"""

DRIVE_ONE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import main
with open(sys.argv[2] + "/all.log", "w") as log:
    entry = main._child("hang", 6.0, Path(sys.argv[2]), log)
print(json.dumps(entry))
"""


@pytest.mark.slow
def test_a_check_that_hangs_is_killed_with_what_it_started_and_reported(
    tmp_path: Path, poll: Any
) -> None:
    (tmp_path / "check_hang.py").write_text(HANGING_CHECK)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GPU_CHECK_DRY": "1"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVE_ONE, str(ROOT / "tools" / "gpu_check"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)
    assert entry["verdict"] == "FAIL"
    assert entry["problems"] == ["did not finish within its 6 s"]
    assert "hanging now" in entry["log_tail"]
    stray = psutil.Process(int((tmp_path / "hang.pid").read_text()))  # it had started
    poll(lambda: not stray.is_running() or stray.status() == psutil.STATUS_ZOMBIE, timeout=10)
