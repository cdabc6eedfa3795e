"""A rank program for tests/test_data_torch.py: DDP training of a small MLP on the
digits, fed by a ``paralela.data`` pipeline through ``TorchIterable`` and a DataLoader
with two workers.

The source is the indices of the first 1,408 training images: 4 parts (2 ranks x 2
loader workers) of 352 = 11 batches of 32, so every rank takes the same 22 steps per
epoch. Each rank writes ``<out>/rank-<RANK>.json``: the indices it trained on in its
first epoch, and its mean loss per epoch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch.nn import functional
from torch.utils.data import DataLoader

import paralela.distributed as pd
from paralela.data import Pipeline, TorchIterable

IMAGES, BATCH, EPOCHS = 1408, 32, 4


def main() -> None:
    out = Path(sys.argv[1])
    ctx = pd.init()
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels)

    def decode(index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, x[index], y[index]

    base = Pipeline.from_iterable(range(IMAGES)).map(decode, workers=2)

    def epoch_pipeline(epoch: int) -> Pipeline:
        return base.shuffle(128, seed=epoch).batch(BATCH, drop_last=True).prefetch(2)

    dataset = TorchIterable(epoch_pipeline)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ddp = pd.data_parallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    seen: list[int] = []
    losses: list[float] = []
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        total, steps = 0.0, 0
        for indices, xb, yb in loader:
            if epoch == 0:
                seen.extend(indices.tolist())  # collated by torch: a tensor
            optimizer.zero_grad()
            loss = functional.cross_entropy(ddp(xb), yb)
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        losses.append(total / steps)
    result: dict[str, Any] = {"rank": ctx.rank, "seen": seen, "losses": losses, "steps": steps}
    (out / f"rank-{ctx.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
