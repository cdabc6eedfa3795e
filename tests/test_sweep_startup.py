"""What a sweep's start-up and its workers' first trial import (issue 27, sweep rows).

Each check runs in a fresh interpreter, so that what the test process already imported
cannot hide an import.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

# This module is imported by the sweep's workers (its objective below): json,
# subprocess and pytest are imported inside the tests, not here.
_RECORD = "SWEEP_STARTUP_RECORD"


def _run(code: str) -> dict[str, object]:
    import json
    import subprocess
    import textwrap

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_sweep_slots_skip_memory_and_filesystem_detection() -> None:
    # Slots are made of CPUs and GPUs: the sweep's start-up does not import psutil
    # (memory) nor read the mount table (filesystems).
    out = _run(
        """
        import json, sys
        from paralela.sweeping._slots import machine_slots
        slots = machine_slots(2, None, 1, 1, None, [])
        print(json.dumps({
            "slots": len(slots),
            "cpus": [list(s.cpus) for s in slots],
            "loaded": sorted(m for m in ("psutil", "paralela.resources._filesystems",
                                         "paralela.resources._memory") if m in sys.modules),
        }))
        """
    )
    assert out["loaded"] == []
    assert out["slots"] >= 1
    assert all(out["cpus"])  # type: ignore[arg-type]


def test_detect_for_slots_makes_the_same_slots_as_detect() -> None:
    from paralela.resources import detect, detect_for_slots, make_slots

    full, light = detect(), detect_for_slots()
    assert (light.host, light.cpus, light.gpus) == (full.host, full.cpus, full.gpus)
    assert make_slots(light) == make_slots(full)
    assert make_slots(light, n_slots=3) == make_slots(full, n_slots=3)
    assert full.memory.total > 0  # detect() keeps everything for `paralela info`


def loaded_in_worker(params: dict[str, Any]) -> float:
    """Notes (one line, with os only) whether the command trials' module is loaded."""
    line = f"{os.getpid()} {'paralela.sweeping._trials' in sys.modules}\n"
    fd = os.open(os.environ[_RECORD], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return float(params["x"])


def test_a_function_trials_worker_does_not_import_the_command_trials_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paralela

    record = tmp_path / "loaded.txt"
    monkeypatch.setenv(_RECORD, str(record))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = paralela.sweep(
        loaded_in_worker,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=4,
        workers=2,
        run_dir=tmp_path / "run",
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 4
    lines = record.read_text().split()
    assert len(lines) == 8  # a pid and a flag for each of the 4 trials
    assert set(lines[1::2]) == {"False"}


def test_workers_import_the_trial_runner_and_the_objectives_module_as_they_start() -> None:
    """The sweep's workers preload what their first trial imports (make_backend's
    ``preload``), while the driver opens the database; a ``__main__`` objective travels
    by value, so there is no module of its to import."""
    from paralela.sweeping._api import _worker_modules

    assert _worker_modules(loaded_in_worker) == [
        "paralela.sweeping._worker_trial",
        loaded_in_worker.__module__,
    ]

    def local(params: dict[str, Any]) -> float:
        return 0.0

    local.__module__ = "__main__"
    assert _worker_modules(local) == ["paralela.sweeping._worker_trial"]


def test_a_function_trials_worker_starts_without_typing_dataclasses_or_optuna() -> None:
    # What a worker imports as it starts (the backend's worker loop and the preloaded
    # trial runner) is on the way to the first trial, while the driver opens the
    # database: typing, dataclasses and inspect were ~10 ms of each worker's start.
    out = _run(
        """
        import json, sys
        before = set(sys.modules)
        import paralela.backends._worker
        import paralela.sweeping._worker_trial
        heavy = ("typing", "dataclasses", "inspect", "traceback", "subprocess",
                 "optuna", "sqlalchemy", "numpy")
        print(json.dumps({"loaded": sorted(m for m in heavy
                                           if m in sys.modules and m not in before)}))
        """
    )
    assert out["loaded"] == []
