"""Data-parallel training (all-reduce) of a small MLP on scikit-learn's digits.

Every rank holds the whole model and trains on its own share of each epoch; after each
backward pass DDP averages the gradients over the ranks, so the weights stay identical
everywhere and the result equals one process training on the combined batch. Run::

    paralela launch --nproc 2 examples/train_ddp.py --epochs 10 --checkpoint ckpt.pt

``--checkpoint`` saves after every epoch (rank 0 writes, atomically) and resumes from
it: with ``paralela launch --max-restarts 1``, a rank that dies restarts the group,
which goes on from the last finished epoch. Without a launcher (``python
examples/train_ddp.py``) it trains as a group of one. Rank 0 prints the validation
accuracy and, with ``--out``, writes it as JSON. Needs torch and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch.nn import functional
from torch.utils.data import TensorDataset

import paralela.distributed as pd


def digits() -> tuple[TensorDataset, TensorDataset]:
    """Training and validation sets: 1,437 and 360 images of 8x8 pixels scaled to [0, 1]."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    val, train = order[:360], order[360:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    ctx = pd.init()  # gloo on CPU, NCCL on a GPU; rank and world size from the launcher
    train_set, val_set = digits()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also syncs them)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(ctx.device)
    ddp = pd.data_parallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loader = pd.shard(train_set, batch_size=args.batch_size, seed=0)

    first = 0
    state = pd.load_checkpoint(args.checkpoint) if args.checkpoint else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["epoch"] + 1
        if ctx.is_main:
            print(f"resuming after epoch {state['epoch']}", flush=True)

    for epoch in range(first, args.epochs):
        loader.set_epoch(epoch)  # this epoch's shuffle, the same on every rank
        for x, y in loader:
            optimizer.zero_grad()
            loss = functional.cross_entropy(ddp(x.to(ctx.device)), y.to(ctx.device))
            loss.backward()
            optimizer.step()
        if args.checkpoint:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            pd.save_checkpoint({**state, "epoch": epoch}, args.checkpoint)

    if ctx.is_main:
        x_val, y_val = val_set.tensors
        with torch.no_grad():
            accuracy = (model(x_val.to(ctx.device)).argmax(1).cpu() == y_val).float().mean()
        print(f"ranks {ctx.world_size}, epochs {args.epochs}, validation accuracy {accuracy:.3f}")
        if args.out:
            result = {"world_size": ctx.world_size, "accuracy": float(accuracy)}
            args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
