"""Check: a sweep of 8 CUDA trials with 4 slots on the one GPU (``--trials-per-gpu 4``).

Proves: paralela cuts the GPU into 4 slots and gives each trial exactly that GPU in
``CUDA_VISIBLE_DEVICES`` (its UUID, the one torch then sees as device 0); each trial
allocated on it and read back what it wrote; the 4 slots stayed busy (trials overlapped);
no trial ran out of memory; every trial completed with the value it reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import HERE, Mode, Outcome, gpu_uuid, run

TRIALS = 8
SLOTS = 4
MIN_BUSY = 0.6  # share of the 4 slots' time that trials ran, on the GPU (not the dry run)


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    uuid = gpu_uuid(mode).lower()
    space = work / "space.csv"
    space.write_text("x\n" + "".join(f"{x}\n" for x in range(TRIALS)))
    record = work / "trials.jsonl"
    env = {**mode.env, "GPU_CHECK_RECORD": str(record)}
    mib, seconds = mode.size(2048, 1), (3.0 if not mode.dry else 0.0)
    done = run(
        [sys.executable, "-m", "paralela", "sweep", "--space", str(space),
         "--trials", str(TRIALS), "--trials-per-gpu", str(SLOTS),
         "--run-dir", str(work / "run"), "--no-plots", "--no-progress", "--json", "--",
         sys.executable, str(HERE / "sweep_trial.py"), "--x", "{x}", "--mib", str(mib),
         "--seconds", str(seconds)],
        mode, timeout=240, env=env,
    )  # fmt: skip
    result = json.loads(done.stdout)
    notes = [json.loads(line) for line in record.read_text().splitlines()]
    outcome.expect(len(notes) == TRIALS, f"{len(notes)} trials noted, expected {TRIALS}")
    seen = {n["visible"] for n in notes}
    outcome.expect(seen == {uuid}, f"trials saw CUDA_VISIBLE_DEVICES {seen}, not {{{uuid!r}}}")
    outcome.expect(all(not n["oom"] for n in notes), "a trial ran out of memory")
    outcome.expect(
        all(n.get("read_back") == float(n["number"]) for n in notes),
        "a trial did not read back what it wrote on its device",
    )
    if not mode.dry:
        outcome.expect(
            all(n.get("device_count") == 1 and n.get("uuid") == uuid for n in notes),
            f"a trial's torch saw other GPUs than {uuid}: "
            f"{[(n.get('device_count'), n.get('uuid')) for n in notes]}",
        )
        outcome.expect(
            all(n.get("allocated_mib", 0) >= mib for n in notes),
            f"a trial allocated less than {mib} MiB on the GPU",
        )
    values = sorted(t["value"] for t in result["trials"] if t["state"] == "COMPLETE")
    expected = sorted(float(x * x) for x in range(TRIALS))
    outcome.expect(values == expected, f"completed trials' values {values}, expected {expected}")
    first = min(n["start"] for n in notes)
    last = max(n["end"] for n in notes)
    busy = sum(n["end"] - n["start"] for n in notes) / (SLOTS * (last - first))
    overlap = max(sum(1 for m in notes if m["start"] <= n["start"] < m["end"]) for n in notes)
    outcome.figures.update(
        {
            "trials": len(notes),
            "slots": SLOTS,
            "MiB per trial": mib,
            "most trials at once": overlap,
            "slots busy": round(busy, 2),
            "wall s": round(last - first, 1),
        }
    )
    if not mode.dry:
        outcome.expect(overlap == SLOTS, f"at most {overlap} trials ran at once, not {SLOTS}")
        outcome.expect(busy >= MIN_BUSY, f"slots busy {busy:.2f} of the time, < {MIN_BUSY}")
    return outcome
