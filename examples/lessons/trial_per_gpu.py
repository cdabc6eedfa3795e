"""Lesson 3: one trial per GPU, with slots (docs/lessons/trial-per-gpu.md).

A hyperparameter sweep on a machine with several GPUs should keep every GPU busy with
one trial and never put two trials on one GPU by accident. paralela cuts the machine
into *slots* (a GPU and a share of the CPUs each) and starts each trial's process with
its slot in the environment, before the trial imports torch: ``CUDA_VISIBLE_DEVICES``
names its GPU (so the trial sees it as ``cuda:0``), and ``OMP_NUM_THREADS`` its CPUs.

No GPU is needed to see it. This script makes paralela believe it runs in a Slurm job
that was granted four GPUs (``SLURM_JOB_GPUS=0,1,2,3``, ``CUDA_VISIBLE_DEVICES=0,1,2,3``,
as Slurm sets them), and runs a sweep whose trials print what they see and then wait,
as a trial waits for its GPU to compute. It runs the same sweep on 1 GPU, on 4 GPUs,
and with 2 trials sharing each GPU (``trials_per_gpu=2``, for small models).

Run it:  python examples/lessons/trial_per_gpu.py           (about a minute)
         python examples/lessons/trial_per_gpu.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import paralela

SPACE = {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}}
# What paralela would find in a Slurm job granted four GPUs, on any machine: it takes the
# GPUs Slurm granted when neither NVML nor nvidia-smi can list them (docs/resources.md).
# A machine with real GPUs shows its own instead.
FOUR_GPUS = {"SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
GPU_SECONDS = 0.5  # one trial's "training" on its GPU (a sleep: the CPU is free meanwhile)


def objective(params: dict[str, Any]) -> float:
    """One trial: say what it sees, "train", return a loss."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    threads = os.environ.get("OMP_NUM_THREADS")
    print(f"lr={params['lr']:.5f} sees CUDA_VISIBLE_DEVICES={seen} OMP_NUM_THREADS={threads}")
    time.sleep(GPU_SECONDS)
    return float((params["lr"] - 0.01) ** 2)


def seen_devices(trial: Any) -> str:
    """What a finished trial printed as its ``CUDA_VISIBLE_DEVICES`` (from its log)."""
    line = Path(trial.log_path).read_text().strip().splitlines()[0]
    return line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0]


def run(label: str, n_trials: int, root: Path, **options: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = paralela.sweep(
        objective,
        SPACE,
        n_trials=n_trials,
        sampler="random",
        seed=0,
        run_dir=root / label.replace(" ", "-"),
        plots=False,
        progress=False,
        **options,
    )
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (CI)")
    args = parser.parse_args()
    n_trials = 8 if args.quick else 24
    os.environ.update(FOUR_GPUS)
    gpus = paralela.detect().gpus
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    names = sorted({g.name for g in gpus})
    print(f"paralela sees {len(gpus)} GPUs ({'; '.join(names)})\n")

    root = Path(tempfile.mkdtemp(prefix="paralela-lesson-gpus-"))
    try:
        runs: list[tuple[str, dict[str, Any]]] = [
            ("1 GPU", {"gpus": "0"}),
            ("4 GPUs", {}),
            ("4 GPUs, 2 trials each", {"trials_per_gpu": 2}),
        ]
        rows = []
        shown = None
        own = total = 0
        for label, options in runs:
            seconds, result = run(label, n_trials, root, **options)
            slots = len({t.slot for t in result.trials})
            own += sum(seen_devices(t) == t.devices for t in result.trials)
            total += len(result.trials)
            rows.append((label, slots, seconds, result.best_value))
            if label == "4 GPUs":
                shown = result
        assert shown is not None
        print("What each trial printed (from its log), with 4 GPUs:")
        for trial in sorted(shown.trials, key=lambda t: t.number)[:8]:
            line = Path(trial.log_path).read_text().strip().splitlines()[0]
            print(f"  trial {trial.number:>2} on slot {trial.slot} (GPU {trial.devices}): {line}")
        print()
        print(f"{n_trials} trials of {GPU_SECONDS} s of GPU work each:")
        header = f"  {'run':<24} {'slots used':>10} {'wall s':>8} {'speed-up':>9}"
        print(header)
        base = rows[0][2]
        for label, slots, seconds, _ in rows:
            print(f"  {label:<24} {slots:>10} {seconds:>8.2f} {base / seconds:>8.2f}x")
        print()
        four = rows[1][2]
        print(
            f"RESULT: {n_trials} trials: 1 GPU {base:.1f} s, 4 GPUs {four:.1f} s "
            f"({base / four:.1f}x); {own} of {total} trials saw exactly their slot's GPU"
        )
        print(
            "Conclusion: one slot per GPU keeps every GPU busy with one trial; the trial "
            "sees its GPU as the only one (cuda:0) because CUDA_VISIBLE_DEVICES is set "
            "before it starts."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
