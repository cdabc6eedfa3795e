"""One rank of the demo's data-parallel training (started by the launcher, not by hand).

Kept apart from :mod:`paralela.demos._ddp_demo` (which ``paralela.demos`` imports), so
that ``python -m paralela.demos._ddp_rank`` runs a module no one imported before.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from paralela.demos._ddp_demo import BATCH_PER_RANK, EPOCHS, LEARNING_RATE

__all__ = ["main"]


def main() -> None:
    """One rank of the demo's training (run by the launcher, not by hand)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from torch.nn import functional
    from torch.utils.data import TensorDataset

    import paralela.distributed as pd
    from paralela.demos._digits import _data

    ctx = pd.init()
    x_train, y_train, x_val, y_val = _data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to(ctx.device)
    ddp = pd.data_parallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE, momentum=0.9)
    loader = pd.shard(TensorDataset(x_train, y_train), batch_size=BATCH_PER_RANK)
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = functional.cross_entropy(ddp(x.to(ctx.device)), y.to(ctx.device))
            loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch 2.13
            optimizer.step()
    if ctx.is_main:
        with torch.no_grad():
            logits = model(x_val.to(ctx.device)).cpu()
        result = {
            "accuracy": float((logits.argmax(1) == y_val).float().mean()),
            "val_loss": float(functional.cross_entropy(logits, y_val)),
        }
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
