"""One rank of the pipeline check: a two-stage MLP trained with GPipe and with 1F1B.

Started by ``paralela launch --nproc 2``: each rank holds one stage (``pipeline``), on
``--device`` (one GPU per rank with NCCL, or the CPU with gloo; ``--share-gpu`` then
shows the GPU to the CPU ranks, as in ddp_rank.py). Rank 0 also trains the
model with both stages on ``--placed-device`` in this one process (``place_stages``) and
the unsplit model on the CPU (the reference), and writes every set of weights and the
last outputs to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

MICROBATCHES = 4


def build(width: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 2 * width), nn.Tanh(),
        nn.Linear(2 * width, width), nn.Tanh(), nn.Linear(width, 1),
    )  # fmt: skip


def batches(width: int, steps: int, rows: int) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(2)
    out = []
    for _ in range(steps + 1):  # the last one is the test batch
        x = torch.randn(rows, width, generator=generator)
        out.append((x, torch.sin(x.sum(1, keepdim=True))))
    return out


def flat(state: dict[str, Any]) -> list[list[float]]:
    return [state[k].detach().cpu().flatten().tolist() for k in sorted(state)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", required=True)
    parser.add_argument("--placed-device", required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--share-gpu", action="store_true")
    args = parser.parse_args()
    if args.share_gpu:  # CPU ranks (one GPU): rank 0's place_stages still needs the GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["GPU_CHECK_GPU"]
    import torch
    from torch.nn import functional

    from paralela.distributed import pipeline

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    data = batches(args.width, args.steps, 8 * MICROBATCHES)
    *train, (x_test, _) = data
    note: dict[str, Any] = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    for schedule in ("gpipe", "1f1b"):
        pipe = pipeline(
            build(args.width), microbatches=MICROBATCHES, schedule=schedule,
            loss_fn=functional.mse_loss, device=args.device,
        )  # fmt: skip
        optimizer = torch.optim.SGD(pipe.stage_module.parameters(), lr=0.05)
        for x, y in train:
            pipe.step(x, y)
            optimizer.step()
            optimizer.zero_grad()
        output = pipe.predict(x_test)
        state = pipe.gather_state_dict()
        if output is not None:  # the last stage
            note[f"{schedule} output"] = output.cpu().flatten().tolist()
            note[f"{schedule} stage device"] = str(next(pipe.stage_module.parameters()).device)
        if state is not None:  # rank 0
            note[f"{schedule} weights"] = flat(state)
    notes: list[Any] = [None, None]
    torch.distributed.gather_object(note, notes if pipe.is_first else None, dst=0)
    if pipe.is_first:
        _against_the_cpu(note, notes[-1], args, train, x_test)
    torch.distributed.barrier()  # no rank leaves the group while another still uses it
    torch.distributed.destroy_process_group()


def _against_the_cpu(
    note: dict[str, Any], last: dict[str, Any], args: Any, train: Any, x_test: Any
) -> None:
    """Rank 0: train the unsplit model on the CPU, and place_stages' on one device."""
    import torch
    from torch.nn import functional

    from paralela.distributed import place_stages

    note.update({k: v for k, v in last.items() if "output" in k or "stage" in k})
    reference = build(args.width)
    placed_model = place_stages(build(args.width), [args.placed_device] * 2, microbatches=4)
    for model in (reference, placed_model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in train:
            out = model(x.to(next(model.parameters()).device))
            functional.mse_loss(out, y.to(out.device)).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        note["reference output"] = reference(x_test).flatten().tolist()
        note["placed output"] = placed_model(x_test).cpu().flatten().tolist()
    note["reference weights"] = flat(reference.state_dict())
    note["placed weights"] = flat(placed_model.state_dict())
    note["placed devices"] = sorted({str(p.device) for p in placed_model.parameters()})
    with open(args.out, "w") as out_file:
        json.dump(note, out_file)


if __name__ == "__main__":
    main()
