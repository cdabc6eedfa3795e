"""Data-parallel training (DDP) fed by a ``paralela.data`` pipeline.

The training images are stored as JSON records (as lines of a file or rows of a shard
would be); a pipeline decodes them in worker processes (JSON parsing is pure-Python CPU
work), shuffles, batches and prefetches. ``TorchIterable`` turns it into a torch
``IterableDataset`` that gives every rank, and every DataLoader worker of a rank, its
own part of the records, cut before the decode: no record is decoded twice. Run::

    paralela launch --nproc 2 examples/train_ddp_pipeline.py --epochs 5

Without a launcher (``python examples/train_ddp_pipeline.py``) it trains as a group of
one. Rank 0 prints the validation accuracy and, with ``--out``, writes it as JSON.
Needs torch, numpy and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.nn import functional
from torch.utils.data import DataLoader

import paralela.distributed as pd
from paralela.data import Pipeline, TorchIterable


def records() -> tuple[list[bytes], torch.Tensor, torch.Tensor]:
    """1,437 training records (JSON: 64 pixels 0-16 and a label) and 360 validation
    images as tensors."""
    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(labels))
    val, train = order[:360], order[360:]
    encoded = [
        json.dumps({"pixels": images[i].astype(int).tolist(), "label": int(labels[i])}).encode()
        for i in train
    ]
    x_val = torch.tensor(images[val], dtype=torch.float32) / 16.0
    return encoded, x_val, torch.tensor(labels[val])


def decode(record: bytes) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A record's pixels scaled to [0, 1], and its label (arrays: the batch stacks them)."""
    fields = json.loads(record)
    pixels = np.asarray(fields["pixels"], dtype=np.float32) / 16.0
    return pixels, np.asarray(fields["label"], dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--loader-workers", type=int, default=1, help="DataLoader workers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    ctx = pd.init()  # gloo on CPU, NCCL on a GPU; rank and world size from the launcher
    train, x_val, y_val = records()
    # DDP needs the same number of steps on every rank: keep a whole number of batches
    # for each part (rank x loader worker); the rest of the records wait for next time.
    parts = ctx.world_size * max(1, args.loader_workers)
    train = train[: len(train) // (parts * args.batch_size) * parts * args.batch_size]
    source = Pipeline.from_iterable(train).map(decode, kind="process")

    def epoch_pipeline(epoch: int) -> Pipeline:
        # each part shuffles its own records, in a new order every epoch
        return source.shuffle(256, seed=epoch).batch(args.batch_size).prefetch(2)

    dataset = TorchIterable(epoch_pipeline)
    # batch_size=None: the pipeline batches (into tensors, with torch's default_collate).
    loader = DataLoader(dataset, batch_size=None, num_workers=args.loader_workers)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also syncs them)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(ctx.device)
    ddp = pd.data_parallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        total, steps = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = functional.cross_entropy(ddp(x.to(ctx.device)), y.to(ctx.device))
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        if ctx.is_main:
            print(f"epoch {epoch}: {steps} steps, mean loss {total / steps:.3f}", flush=True)

    if ctx.is_main:
        with torch.no_grad():
            accuracy = (model(x_val.to(ctx.device)).argmax(1).cpu() == y_val).float().mean()
        print(f"ranks {ctx.world_size}, epochs {args.epochs}, validation accuracy {accuracy:.3f}")
        if args.out:
            result = {"world_size": ctx.world_size, "accuracy": float(accuracy)}
            args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
