"""What every check of the GPU check shares: the mode, the sizes, the fake GPU, results.

::

    GPU_CHECK_DRY=0   the lent GPU: device "cuda", NCCL, full sizes, the real GPU
    GPU_CHECK_DRY=1   CI: device "cpu", gloo, tiny sizes, one fake GPU (a fake
                      nvidia-smi first on PATH, NVML hidden) that paralela hands out

A check is a function ``check(mode, work) -> Outcome``: it runs its workload through
paralela's CLI or public API, checks the workload's own result (``Outcome.expect``) and
records figures. It imports nothing of paralela's private modules.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

FAKE_UUID = "GPU-d2d2d2d2-0000-0000-0000-000000000000"
_FAKE_SMI = f"""#!/bin/sh
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA H100 80GB HBM3 (fake, dry run) (UUID: {FAKE_UUID})"
  exit 0
fi
if [ "$1" != "--query-gpu=index,uuid,name,memory.total,memory.free" ]; then
  echo "the dry run's fake nvidia-smi answers only paralela's query, not: $*" >&2
  exit 2
fi
echo "0, {FAKE_UUID}, NVIDIA H100 80GB HBM3 (fake), 81559, 81000"
"""


@dataclass(frozen=True)
class Mode:
    """Where the checks run and how large their workloads are."""

    dry: bool
    device: str  # "cuda" on the GPU, "cpu" in the dry run
    backend: str  # the process group of a GPU rank: "nccl", or "gloo" in the dry run
    env: dict[str, str]  # the environment of every child process

    def size(self, real: int, dry: int) -> int:
        return dry if self.dry else real


@dataclass
class Outcome:
    """A check's verdict: the problems found (none: passed) and its figures."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def expect(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    def to_json(self) -> dict[str, Any]:
        return {"figures": self.figures, "problems": self.problems, "notes": self.notes}


def make_mode(work: Path) -> Mode:
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    if dry:
        env.pop("CUDA_VISIBLE_DEVICES", None)
        fake = work / "fake-gpu"
        (fake / "bin").mkdir(parents=True, exist_ok=True)
        (fake / "no_nvml").mkdir(exist_ok=True)
        smi = fake / "bin" / "nvidia-smi"
        smi.write_text(_FAKE_SMI)
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
        (fake / "no_nvml" / "pynvml.py").write_text(
            'raise ImportError("hidden by the GPU check dry run: it shows a fake nvidia-smi")\n'
        )
        env["PATH"] = f"{fake / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["PYTHONPATH"] = f"{fake / 'no_nvml'}{os.pathsep}{env['PYTHONPATH']}"
    device, backend = ("cpu", "gloo") if dry else ("cuda", "nccl")
    return Mode(dry=dry, device=device, backend=backend, env=env)


def gpu_uuid(mode: Mode) -> str:
    """The UUID of the one GPU, as paralela hands it out (the fake one in a dry run)."""
    out = run([sys.executable, "-m", "paralela", "info", "--json"], mode, timeout=60)
    gpus = json.loads(out.stdout)["gpus"]
    if len(gpus) < 1:
        raise RuntimeError(f"paralela info sees no GPU: {out.stdout}")
    return str(gpus[0]["uuid"])


def run(
    argv: list[str], mode: Mode, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``, echo its output to this check's log, raise when it fails."""
    started = time.monotonic()
    print(f"$ {' '.join(argv)}", flush=True)
    done = subprocess.run(
        argv, env=env or mode.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    print(done.stdout[-2000:], done.stderr[-3000:], sep="\n", flush=True)
    print(f"(exit {done.returncode} after {time.monotonic() - started:.1f} s)", flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {done.returncode}: {done.stderr[-1500:]}")
    return done


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest absolute difference of two lists of flat lists of numbers."""
    worst = 0.0
    for xs, ys in zip(a, b, strict=True):
        if len(xs) != len(ys):
            return float("inf")
        worst = max([worst, *(abs(x - y) for x, y in zip(xs, ys, strict=True))])
    return worst


def visible_gpus(mode: Mode) -> int:
    """How many GPUs torch sees here."""
    code = "import torch; print(torch.cuda.device_count())"
    return int(run([sys.executable, "-c", code], mode, timeout=60).stdout.strip())
