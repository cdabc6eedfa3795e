"""detect() on this machine, JSON round trip, and a cheap import."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from paralela.resources import Resources, detect, make_slots


def test_detect_on_this_machine() -> None:
    res = detect()
    assert res.host == socket.gethostname()
    assert 1 <= res.cpus.usable <= len(os.sched_getaffinity(0))
    assert res.memory.total > 0
    assert res.gpu_source in ("nvml", "nvidia-smi", "none")
    assert [f.role for f in res.filesystems][:2] == ["working", "temporary"]


def test_json_round_trip() -> None:
    res = detect()
    text = json.dumps(res.to_dict())
    assert Resources.from_dict(json.loads(text)) == res


def test_detect_reads_the_given_environment() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "a,b,c",
        "PATH": os.environ.get("PATH", ""),
    }
    res = detect(env)
    assert res.slurm is not None
    assert res.slurm.nodes == ("a", "b", "c")
    assert detect({"PATH": os.environ.get("PATH", "")}).slurm is None


def test_default_cpu_slots_cover_the_usable_cpus() -> None:
    res = detect()
    slots = make_slots(res)
    assert len(slots) == res.cpus.usable
    assert sorted(c for s in slots for c in s.cpus) == list(res.cpus.usable_ids)


def test_import_is_cheap() -> None:
    code = (
        "import sys, paralela.resources; "
        "print(sorted(m for m in ('rich', 'typer', 'psutil', 'pynvml', 'hostlist') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
