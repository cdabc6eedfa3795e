"""What a sweep's start-up and its workers' first trial import (issue 27, sweep rows).

Each check runs in a fresh interpreter, so that what the test process already imported
cannot hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> dict[str, object]:
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
