"""``gpu-check.md``: the device, the versions, each check's verdict and figures, and the
log's tail of each failure."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

# What each check proves, one line each (docs/gpu-check.md says more).
PROVES = {
    "pytest": "every test marked gpu passes on this GPU (pytest -m gpu)",
    "sweep": "8 trials, 4 slots on one GPU: each trial saw exactly its GPU, allocated on "
    "it, slots stayed busy, no out-of-memory",
    "launch": "DDP: NCCL on one rank and gloo on CUDA tensors on two ranks sharing the GPU "
    "give the CPU run's weights",
    "pipeline": "two stages on the GPU (GPipe and 1F1B across ranks, place_stages in one "
    "process) give the unsplit CPU model's outputs and gradients",
    "serve": "a MiniLM-sized embedder served on CUDA answers right under 64 clients; "
    "requests/s against --max-batch 1 and against the CPU",
    "predict": "paralela predict on CUDA over the sentences gives the serial CUDA loop's "
    "embeddings; sentences/s of both",
    "data": "a paralela.data pipeline with pinned memory feeds a CUDA training loop; the "
    "GPU's busy share against a tuned DataLoader",
}


def write_report(
    path: Path, environment: dict[str, Any], results: list[dict[str, Any]], seconds: float
) -> None:
    passed = sum(r["verdict"] == "PASS" for r in results)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# paralela GPU check",
        "",
        f"{now}: **{passed} of {len(results)} checks passed** in {seconds:.0f} s "
        "(`bash tools/gpu-check.sh`, docs/gpu-check.md).",
        "",
        "## Device and versions",
        "",
        *(f"- {key}: {value}" for key, value in environment.items()),
        "",
        "## Checks",
        "",
        "| check | verdict | seconds | figures |",
        "|---|---|---|---|",
    ]
    for r in results:
        figures = "; ".join(f"{k}: {v}" for k, v in r["figures"].items()) or "-"
        figures = figures.replace("|", "\\|")
        lines.append(f"| {r['name']} | {r['verdict']} | {r.get('seconds', 0)} | {figures} |")
    for r in results:
        lines += ["", f"### {r['name']}: {r['verdict']}", "", f"Proves: {PROVES[r['name']]}."]
        if r["figures"]:
            lines += ["", *(f"- {k}: {v}" for k, v in r["figures"].items())]
        if r["notes"]:
            lines += ["", *(f"- note: {n}" for n in r["notes"])]
        if r["problems"]:
            lines += ["", "Problems:", "", *(f"- {p}" for p in r["problems"])]
        if "log_tail" in r:
            lines += ["", "Log (last lines):", "", "```", r["log_tail"], "```"]
    path.write_text("\n".join(lines) + "\n")
