"""Check: a two-stage pipeline (GPipe and 1F1B) with its stages on the GPU.

Proves: ``pipeline`` across two ranks under ``paralela launch`` trains with both
schedules to the weights and outputs of the unsplit model on the CPU, and
``place_stages`` with both stages on the one GPU in one process does too.

Across ranks, the stages sit on the GPU only with a GPU per rank: NCCL refuses two ranks
on one GPU, and gloo sends CPU tensors only. On a machine with one GPU the two ranks
therefore run on the CPU (gloo) and say so in a note; ``place_stages`` puts both stages
on the GPU there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import HERE, Mode, Outcome, gpu_uuid, max_abs_diff, run, visible_gpus

TOLERANCE = 1e-4  # float32 (TF32 off) after a few steps, against the CPU's unsplit model


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    gpus = 0 if mode.dry else visible_gpus(mode)
    across = "cuda" if gpus >= 2 else "cpu"
    if across == "cpu":
        outcome.notes.append(
            f"{gpus} GPU(s): the two ranks' stages ran on the CPU (gloo); a stage per GPU "
            "needs two GPUs (NCCL refuses two ranks on one GPU, gloo sends CPU tensors only)"
        )
    out = work / "pipeline.json"
    run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", "2",
         *(["--gpus-per-rank", "0"] if across == "cpu" else []),
         "--log-dir", str(work / "logs"), str(HERE / "pipeline_rank.py"),
         "--device", across, "--placed-device", "cpu" if mode.dry else "cuda:0",
         "--width", str(mode.size(512, 8)), "--steps", str(mode.size(10, 3)),
         "--out", str(out), *(["--share-gpu"] if across == "cpu" else [])],
        mode, timeout=150, env={**mode.env, "GPU_CHECK_GPU": gpu_uuid(mode)},
    )  # fmt: skip
    note = json.loads(out.read_text())
    reference = note["reference weights"]
    for name in ("gpipe", "1f1b", "placed"):
        diff = max_abs_diff(note[f"{name} weights"], reference)
        out_diff = max_abs_diff([note[f"{name} output"]], [note["reference output"]])
        outcome.figures[f"{name}: weights / outputs vs CPU"] = f"{diff:.1e} / {out_diff:.1e}"
        outcome.expect(diff <= TOLERANCE, f"{name}: weights differ from the CPU's by {diff}")
        outcome.expect(out_diff <= TOLERANCE, f"{name}: outputs differ by {out_diff}")
    placed_on = ["cpu"] if mode.dry else ["cuda:0"]
    outcome.expect(
        note["placed devices"] == placed_on,
        f"place_stages put the layers on {note['placed devices']}, not {placed_on}",
    )
    outcome.figures["place_stages devices"] = ", ".join(note["placed devices"])
    outcome.figures["ranks' stages on"] = across
    return outcome
