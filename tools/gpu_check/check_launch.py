"""Check: ``paralela launch`` of DDP with NCCL on one rank, and with gloo on CUDA tensors
on two ranks sharing the GPU.

Proves: the launcher pins the NCCL rank to the GPU (its UUID in ``CUDA_VISIBLE_DEVICES``,
torch's ``cuda:0``), NCCL and gloo carry CUDA tensors (all-reduce, DDP's gradient
buckets), and both trainings end with the weights of the same training run on the CPU in
one process, within float32 tolerance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import HERE, Mode, Outcome, gpu_uuid, max_abs_diff, run

TOLERANCE = 1e-4  # float32 kernels (TF32 off) against the CPU's, after the steps below


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    uuid = gpu_uuid(mode)
    sizes = ["--steps", str(mode.size(30, 5)), "--features", str(mode.size(256, 8)),
             "--batch", str(mode.size(512, 16))]  # fmt: skip
    runs = {
        f"{mode.backend}, 1 rank": ([], mode.backend),
        "gloo, 2 ranks sharing the GPU": (["--nproc", "2", "--gpus-per-rank", "0"], "gloo"),
    }
    for index, (label, (launch_options, backend)) in enumerate(runs.items()):
        out = work / f"run-{index}.json"
        nproc = launch_options[1] if launch_options else "1"
        argv = [sys.executable, "-m", "paralela", "launch", "--nproc", nproc,
                *launch_options[2:], "--log-dir", str(work / f"logs-{index}"),
                str(HERE / "ddp_rank.py"), "--backend", backend, "--device", mode.device,
                "--out", str(out), *sizes]  # fmt: skip
        if launch_options:
            argv.append("--share-gpu")
        run(argv, mode, timeout=120, env={**mode.env, "GPU_CHECK_GPU": uuid})
        note = json.loads(out.read_text())
        world = int(nproc)
        diff = max_abs_diff(note["weights"], note["reference"])
        outcome.figures[f"{label}: largest weight difference to the CPU run"] = f"{diff:.1e}"
        outcome.expect(diff <= TOLERANCE, f"{label}: weights differ from the CPU run's by {diff}")
        outcome.expect(note["backend"] == backend, f"{label}: backend {note['backend']}")
        outcome.expect(note["world"] == world, f"{label}: {note['world']} ranks, not {world}")
        outcome.expect(
            note["sum"] == world * (world + 1) / 2, f"{label}: all-reduce gave {note['sum']}"
        )
        expected_device = "cuda:0" if mode.device == "cuda" else "cpu"
        outcome.expect(note["device"] == expected_device, f"{label}: model on {note['device']}")
        expected_visible = "" if launch_options else uuid  # CPU ranks get ""
        outcome.expect(
            note["launched_with"] == expected_visible,
            f"{label}: the launcher gave CUDA_VISIBLE_DEVICES={note['launched_with']!r}, "
            f"expected {expected_visible!r}",
        )
    return outcome
