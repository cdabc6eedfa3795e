"""One rank of the launch check: data-parallel training (DDP) on seeded synthetic data.

Started by ``paralela launch``. ``--share-gpu`` puts ``$GPU_CHECK_GPU`` back in
``CUDA_VISIBLE_DEVICES`` before torch starts: paralela gives each GPU rank a GPU of its
own, so two ranks sharing the one GPU are launched as CPU ranks and take it here. Rank 0
writes the trained weights, what it saw, and the same training run in one process on the
CPU (the reference) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def train(model: Any, device: Any, steps: int, batch: int, rank: int, world: int) -> None:
    """SGD on the rows of each seeded batch that are this rank's (all rows when world=1)."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    features = next(model.parameters()).shape[1]
    generator = torch.Generator().manual_seed(1)
    target_weights = torch.randn(features, 1, generator=generator)
    for _ in range(steps):
        x = torch.randn(batch, features, generator=generator)
        y = torch.tanh(x @ target_weights)
        rows = slice(rank * batch // world, (rank + 1) * batch // world)
        loss = torch.nn.functional.mse_loss(model(x[rows].to(device)), y[rows].to(device))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()


def build(features: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, 4 * features), torch.nn.Tanh(), torch.nn.Linear(4 * features, 1)
    )


def weights(model: Any) -> list[Any]:
    return [p.detach().cpu().flatten().tolist() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--share-gpu", action="store_true")
    args = parser.parse_args()
    launched_with = os.environ.get("CUDA_VISIBLE_DEVICES")
    if args.share_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["GPU_CHECK_GPU"]
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the CPU computes it
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    model = build(args.features).to(device)
    ddp = DistributedDataParallel(model, device_ids=[0] if device.type == "cuda" else None)
    train(ddp, device, args.steps, args.batch, rank, world)
    probe = torch.ones(1, device=device) * (rank + 1)
    dist.all_reduce(probe)  # the group's sum over the tensors of its device
    if rank == 0:
        reference = build(args.features)
        train(reference, torch.device("cpu"), args.steps, args.batch, 0, 1)
        note = {
            "backend": dist.get_backend(),
            "world": world,
            "launched_with": launched_with,
            "device": str(next(model.parameters()).device),
            "sum": float(probe.item()),
            "weights": weights(model),
            "reference": weights(reference),
        }
        with open(args.out, "w") as out:
            json.dump(note, out)
    dist.barrier()  # no rank leaves the group while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
