"""One rank of a 2-stage pipeline; records what the test compares with the unsplit model.

Usage: python pipeline_equivalence.py OUT_DIR

For each run (GPipe and 1F1B with a mean loss, 1F1B with a summed loss) both ranks
build the same model, train two steps
(batches of 16 and then 8 rows, 4 micro-batches, SGD), and record per step the
gradients of their stage (before the optimizer step) and, on the last stage, the
loss and the output; then a forward-only ``predict`` and the gathered state dict.
Each rank writes ``OUT_DIR/{schedule}-{reduction}-rank{R}.pt``.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from paralela.distributed._pipeline import pipeline


def make_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(rows, 8, generator=gen), torch.randint(0, 4, (rows,), generator=gen))
        for rows in (16, 8)
    ]


def run(schedule: str, reduction: str, out_dir: Path) -> None:
    torch.manual_seed(0)
    model = make_model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    pipe = pipeline(
        model,
        microbatches=4,
        schedule=schedule,
        loss_fn=partial(nn.functional.cross_entropy, reduction=reduction),
        loss_reduction=reduction,
    )
    lr = 0.5 if reduction == "mean" else 0.05  # a summed loss has larger gradients
    optimizer = torch.optim.SGD(pipe.stage_module.parameters(), lr=lr)
    record: dict[str, Any] = {
        "initial": initial,
        "batches": batches(),
        "stage_keys": sorted(pipe.state_dict()),
        "is_first": pipe.is_first,
        "is_last": pipe.is_last,
        "steps": [],
    }
    for inputs, target in record["batches"]:
        result = pipe.step(inputs, target)  # every rank passes the same batch
        grads = {
            name: p.grad.clone()
            for name, p in pipe.stage_module.named_parameters()
            if p.grad is not None
        }
        record["steps"].append(
            {"grads": grads, "loss": result.loss, "losses": result.losses, "output": result.output}
        )
        optimizer.step()
        optimizer.zero_grad()
    probe = torch.randn(12, 8, generator=torch.Generator().manual_seed(2))
    record["probe"] = probe
    record["predicted"] = pipe.predict(probe)
    record["gathered"] = pipe.gather_state_dict(dst=0)
    torch.save(record, out_dir / f"{schedule}-{reduction}-rank{dist.get_rank()}.pt")


def main() -> None:
    out_dir = Path(sys.argv[1])
    for schedule, reduction in (("gpipe", "mean"), ("1f1b", "mean"), ("1f1b", "sum")):
        run(schedule, reduction, out_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
