"""One trial of the sweep check (a command trial: a fresh process per trial).

It notes what it saw before torch starts (``CUDA_VISIBLE_DEVICES``), allocates ``--mib``
MiB on its device, fills it with its number and reads it back, runs matrix products for
``--seconds``, appends one JSON line to ``$GPU_CHECK_RECORD`` and reports ``x * x``.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--x", type=float, required=True)
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    note: dict[str, object] = {
        "number": int(os.environ["PARALELA_TRIAL_NUMBER"]),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "").lower(),
        "start": time.time(),
    }
    import paralela

    if os.environ.get("GPU_CHECK_DRY") == "1":  # the dry run: no torch, memory on the host
        block = array.array("f", [float(note["number"])]) * (args.mib * 2**20 // 4)  # type: ignore[arg-type]
        note.update(read_back=block[-1], oom=False)
    else:
        _on_the_gpu(note, args.mib, args.seconds)
    note["end"] = time.time()
    fd = os.open(os.environ["GPU_CHECK_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(note) + "\n").encode())
    finally:
        os.close(fd)
    if note["oom"]:
        raise SystemExit(f"trial {note['number']} ran out of GPU memory: {note['error']}")
    paralela.report(args.x * args.x)


def _on_the_gpu(note: dict[str, object], mib: int, seconds: float) -> None:
    import torch

    try:
        note["device_count"] = torch.cuda.device_count()
        note["uuid"] = f"GPU-{torch.cuda.get_device_properties(0).uuid}".lower()
        block = torch.empty(mib * 2**20 // 4, device="cuda")
        block.fill_(float(note["number"]))  # type: ignore[arg-type]
        note["read_back"] = float(block[-1].item())
        note["allocated_mib"] = torch.cuda.memory_allocated() / 2**20
        a = torch.randn(4096, 4096, device="cuda") / 64
        deadline = time.monotonic() + seconds
        products = 0
        while time.monotonic() < deadline or products == 0:
            a = torch.tanh(a @ a)
            torch.cuda.synchronize()
            products += 1
        note.update(products=products, oom=False)
    except torch.OutOfMemoryError as exc:
        note.update(oom=True, error=str(exc)[:300])


if __name__ == "__main__":
    main()
