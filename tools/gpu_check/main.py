"""The GPU check's driver: run each check in a child process, write ``gpu-check.md``.

::

    main.py --out OUT              every check in turn, each in its own process with a
      │                            time limit (and all within BUDGET_S)
      ├─ main.py --one NAME ...    one check: check_NAME.check(mode, work) -> Outcome,
      │                            written as JSON; output to NAME's log
      ▼
    OUT/gpu-check.md               device, versions, a verdict and figures per check,
                                   the log's tail of each failure
    OUT/gpu-check.log              every check's whole log

Exit 0 when every check passed, 1 otherwise. ``GPU_CHECK_FAIL=NAME`` makes check NAME
raise after its workload (the dry-run test uses it to see a failure reported).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, make_mode
from report import write_report

# (name, seconds it may take on the GPU): the sum stays under BUDGET_S with the install
CHECKS = (
    ("pytest", 150),
    ("sweep", 60),
    ("launch", 90),
    ("pipeline", 60),
    ("serve", 90),
    ("predict", 75),
    ("data", 60),
)
BUDGET_S = 420.0  # all checks together: 7 of the 8 minutes, 1 left for the install
# The dry run (tiny sizes on the CPU: 10 to 40 s) ends with a report within
# tests/test_gpu_check.py's time limit even when a check hangs, and passes on a machine
# so busy that it takes 6 times as long (seen with a load of 12 on 2 cores).
DRY_LIMIT_S, DRY_BUDGET_S = 150.0, 240.0
LOG_TAIL_LINES = 60


def run_one(name: str, work: Path, result: Path) -> None:
    """Child process: run check ``name``, write its outcome to ``result``."""
    module = importlib.import_module(f"check_{name}")
    work.mkdir(parents=True, exist_ok=True)
    outcome = module.check(make_mode(work), work)
    if os.environ.get("GPU_CHECK_FAIL") == name:
        raise RuntimeError(f"failure injected by GPU_CHECK_FAIL={name} (the dry run's self-test)")
    result.write_text(json.dumps(outcome.to_json()))


def run_all(out: Path, only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="paralela-gpu-check-"))
    started = time.monotonic()
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    budget = DRY_BUDGET_S if dry else BUDGET_S
    results: list[dict[str, Any]] = []
    with (out / "gpu-check.log").open("w") as log:
        for name, limit in CHECKS:
            if only is not None and name not in only:
                continue
            left = budget - (time.monotonic() - started)
            results.append(
                _child(name, min(limit, DRY_LIMIT_S if dry else limit, left), scratch, log)
            )
            print(f"gpu-check: {name}: {results[-1]['verdict']}", flush=True)
    environment = _environment()
    write_report(out / "gpu-check.md", environment, results, time.monotonic() - started)
    shutil.rmtree(scratch, ignore_errors=True)  # the logs are in gpu-check.log
    print(f"gpu-check: report in {out / 'gpu-check.md'}", flush=True)
    return 0 if all(r["verdict"] == "PASS" for r in results) else 1


def _child(name: str, limit: float, scratch: Path, log: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "figures": {}, "problems": [], "notes": []}
    if limit < 5:
        entry.update(verdict="FAIL", seconds=0.0, problems=["not run: the time budget is spent"])
        return entry
    result = scratch / f"{name}.json"
    log_path = scratch / f"{name}.log"
    argv = [sys.executable, __file__, "--one", name, "--work", str(scratch / name)]
    started = time.monotonic()
    with log_path.open("w") as child_log:
        child = subprocess.Popen(
            [*argv, "--result", str(result)],
            stdout=child_log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_tree(child)
            code = None
    entry["seconds"] = round(time.monotonic() - started, 1)
    text = log_path.read_text(errors="replace")
    log.write(f"===== {name} =====\n{text}\n")
    if code is None:
        entry["problems"] = [f"did not finish within its {limit:.0f} s"]
    elif code != 0 or not result.exists():
        entry["problems"] = [f"the check's process exited {code} (its log's tail below)"]
    else:
        entry.update(json.loads(result.read_text()))
    entry["verdict"] = "PASS" if not entry["problems"] else "FAIL"
    if entry["verdict"] == "FAIL":
        entry["log_tail"] = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    return entry


def _kill_tree(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL a check and everything it started: its process group, and the processes
    that made groups of their own (sweep trials, launch ranks, serve workers)."""
    import psutil

    try:
        descendants = psutil.Process(child.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    child.wait()


def _environment() -> dict[str, Any]:
    """The device and versions, read by a child process (torch stays out of this one)."""
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    code = (
        "import json, platform, importlib.metadata as m\n"
        f"dry = {dry}\n"
        "torch = None if dry else __import__('torch')\n"
        "v = {'python': platform.python_version()}\n"
        "if torch is not None:\n"
        "    v.update({'cuda': torch.version.cuda, 'cuda available': torch.cuda.is_available()})\n"
        "for name in ('torch', 'paralela', 'optuna', 'fastapi', 'uvicorn', 'numpy'):\n"
        "    try: v[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: v[name] = 'not installed'\n"
        "if torch is not None and torch.cuda.is_available():\n"
        "    v['device'] = torch.cuda.get_device_name(0)\n"
        "    v['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
        "print(json.dumps(v))\n"
    )
    info: dict[str, Any] = {}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        info.update(json.loads(done.stdout))
    except (subprocess.SubprocessError, ValueError) as exc:
        info["versions"] = f"could not be read: {exc}"
    if dry:
        info["device"] = "none: dry run on the CPU (a fake nvidia-smi, gloo for NCCL)"
    else:
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                 "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            info["nvidia-smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia-smi"] = f"failed: {exc}"
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="the folder for gpu-check.md")
    parser.add_argument("--only", help="comma list of checks to run (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args.work, args.result)
        return
    if args.out is None:
        parser.error("--out OUT is required")
    only = args.only.split(",") if args.only else None
    unknown = set(only or ()) - {name for name, _ in CHECKS}
    if unknown:
        parser.error(f"unknown checks {sorted(unknown)}; valid: {[n for n, _ in CHECKS]}")
    raise SystemExit(run_all(args.out, only))


if __name__ == "__main__":
    main()
