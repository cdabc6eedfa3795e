"""The prepared GPU check (tools/gpu-check.sh, docs/gpu-check.md) in its dry run: every
check's logic for real on the CPU (a fake nvidia-smi, gloo for NCCL, tiny sizes), so that
the script cannot rot between the times a GPU is at hand."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The checks, split over two tests so that each stays well within a test's time limit on
# a busy machine; together they run every check.
TRAINING = ("pytest", "sweep", "launch", "pipeline")
SERVING = ("serve", "predict", "data")
# a figure each check must report (its own result, not only that it ran)
FIGURES = {
    "sweep": "most trials at once",
    "launch": "gloo, 2 ranks sharing the GPU: largest weight difference to the CPU run",
    "pipeline": "1f1b: weights / outputs vs CPU",
    "serve": "batched / --max-batch 1",
    "predict": "serial loop sentences/s",
    "data": "busy share, paralela / DataLoader",
}


def dry_run(tmp_path: Path, only: tuple[str, ...], fail: str = "") -> tuple[int, str, str]:
    """Run ``tools/gpu-check.sh --only ...`` in its dry run: exit status, report, stdout."""
    env = {**os.environ, "PARALELA_GPU_CHECK_DRY": "1", "PYTHON": sys.executable}
    env["GPU_CHECK_FAIL"] = fail  # that check raises once its workload is done
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-check.sh"), "--only", ",".join(only),
         str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    report = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "dry run on the CPU" in report  # the device line
    rows = dict(re.findall(r"^\| (\w+) \| (PASS|FAIL) \|", report, re.MULTILINE))
    assert rows == {name: "FAIL" if name == fail else "PASS" for name in only}, report
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert all(f"===== {name} =====" in log for name in only)
    return done.returncode, report, done.stdout


def sections(report: str) -> dict[str, str]:
    return dict(re.findall(r"^### (\w+): \w+\n(.*?)(?=^### |\Z)", report, re.M | re.S))


def check_figures(report: str, names: tuple[str, ...]) -> None:
    for name in names:
        assert FIGURES[name] in sections(report)[name], f"{name}: no {FIGURES[name]!r}"


def test_the_dry_run_tests_cover_every_check() -> None:
    driver = (ROOT / "tools" / "gpu_check" / "main.py").read_text()
    assert set(re.findall(r'^    \("(\w+)", \d+\),$', driver, re.MULTILINE)) == {
        *TRAINING,
        *SERVING,
    }


# About 20 s each on a quiet machine. The driver gives the dry run 240 s at most, then
# writes its report (a check that hangs is killed): the time limit leaves room for that.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_run_of_the_training_checks_reports_a_failure_with_its_log(
    tmp_path: Path,
) -> None:
    code, report, stdout = dry_run(tmp_path, TRAINING, "pytest")
    assert code == 1, report
    assert "**3 of 4 checks passed**" in report
    check_figures(report, ("sweep", "launch", "pipeline"))
    failed = sections(report)["pytest"]
    assert "the check's process exited 1" in failed
    assert "Log (last lines):" in failed
    assert "-m pytest -m gpu" in failed  # the log shows what ran ...
    assert "RuntimeError: failure injected by GPU_CHECK_FAIL=pytest" in failed  # ... and why
    assert "- passed:" not in failed  # a check that crashed has no figures
    assert "Log (last lines):" not in sections(report)["sweep"]  # a passing one has no log
    assert "gpu-check: pytest: FAIL" in stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_run_of_the_serving_and_data_checks_passes(tmp_path: Path) -> None:
    code, report, _ = dry_run(tmp_path, SERVING)
    assert code == 0, report
    assert "**3 of 3 checks passed**" in report
    check_figures(report, ("serve", "predict", "data"))


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


def fake_wheel(directory: Path, name: str, *requires: str) -> None:
    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        metadata = [f"Name: {name}", *(f"Requires-Dist: {r}" for r in requires)]
        wheel.writestr(f"{name}-1.0.dist-info/METADATA", "\n".join(metadata) + "\n")


def test_make_gpu_wheels_names_a_requirement_neither_the_wheels_nor_the_image_meet(
    tmp_path: Path,
) -> None:
    # fastapi 0.165 needs opentelemetry-api, which the GPU image lacks
    fake_wheel(tmp_path, "fastapi", "starlette>=1.6", "opentelemetry-api>=1.44")
    fake_wheel(tmp_path, "starlette", "anyio>=4", 'uvloop; sys_platform == "win32"')
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["rich>=13"]\n[project.optional-dependencies]\n'
        'torch = ["torch"]\nsweep = []\nserve = ["fastapi", "uvicorn"]\n'
    )
    closure = [sys.executable, str(ROOT / "tools" / "gpu_check" / "wheel_closure.py")]
    image = ["rich", "torch", "anyio"]
    done = subprocess.run(
        [*closure, str(tmp_path), str(pyproject), *image],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "provide: uvicorn (for paralela); opentelemetry-api>=1.44 (for fastapi)." in done.stderr
    assert "uvloop" not in done.stderr  # a requirement for another platform
    fake_wheel(tmp_path, "opentelemetry_api")
    done = subprocess.run(
        [*closure, str(tmp_path), str(pyproject), *image, "uvicorn"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "every requirement is met (3 wheels and the image)" in done.stdout
