"""Check: every test marked ``gpu`` (``pytest -m gpu``) on this GPU.

Proves: the GPU tests that CI always skips (it has no GPU) pass here: NCCL ranks on
their own device, pipeline stages across the CPU and the GPU, a parameter server with
the model on the GPU, serve's workers each on their GPU, NVML and nvidia-smi agreeing.
A test skipped here (one that needs two GPUs) is listed in a note.

The dry run runs only tests/test_resources_gpus.py's, with its own environment (no fake
GPU): there every gpu test skips.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from common import ROOT, Mode, Outcome, run


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    files = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("test_*.py")
        if "@pytest.mark.gpu" in path.read_text()
    )
    if mode.dry:
        files = [f for f in files if f.endswith("test_resources_gpus.py")]
    outcome.expect(bool(files), "no test file holds a test marked gpu")
    report = work / "junit.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the real machine as it is, no fake GPU
    try:
        run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
             f"--junitxml={report}", *files],
            mode, timeout=600, env=env,
        )  # fmt: skip
    except RuntimeError as exc:
        outcome.problems.append(f"pytest failed: {exc}")
    if not report.exists():
        outcome.problems.append("pytest wrote no report")
        return outcome
    cases = list(ElementTree.parse(report).getroot().iter("testcase"))
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    passed = len(cases) - len(failed) - len(skipped)
    outcome.figures.update(
        {"files": len(files), "passed": passed, "failed": len(failed), "skipped": len(skipped)}
    )
    for case in failed:
        outcome.problems.append(f"{case.get('classname')}::{case.get('name')} failed")
    for case in skipped:
        reason = case.find("skipped")
        message = reason.get("message", "") if reason is not None else ""
        outcome.notes.append(f"skipped {case.get('name')}: {message}")
    outcome.expect(bool(cases), "pytest -m gpu ran no test")
    if not mode.dry:
        outcome.expect(passed >= 1, "no gpu test passed (were they all skipped?)")
    return outcome
