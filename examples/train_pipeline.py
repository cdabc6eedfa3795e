"""Train an MLP on scikit-learn's digits with its layers split over 2 ranks (a pipeline).

Run it with the launcher, one rank per stage::

    paralela launch --nproc 2 examples/train_pipeline.py [--epochs 8] [--schedule 1f1b]
        [--microbatches 4] [--out result.json] [--checkpoint model.pt]

(``torchrun --nproc-per-node 2 examples/train_pipeline.py`` works too; a plain
``python examples/train_pipeline.py`` is a group of one rank holding the whole model
as a single stage.) Every rank
builds the same model from the same seed and loads the same data; ``pipeline()`` keeps
the layers of this rank's stage: rank 0 the first hidden layer, rank 1 the rest.
Each batch of 64 images is cut into micro-batches that flow through the stages with
the 1F1B schedule. Only the last stage sees the outputs, so it prints the loss of every
epoch and the test accuracy (``test accuracy 0.97``), and writes them to ``--out`` as
JSON. With ``--checkpoint`` rank 0 gathers the stages' weights into one state dict that
loads into the unsplit model. Needs torch and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from paralela.distributed import pipeline


def make_model(hidden: int = 128) -> nn.Sequential:
    """The unsplit model: 64 pixels -> hidden -> hidden -> 10 digits."""
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits (pixels scaled to 0..1), 360 of them held out for testing."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=360, random_state=0, stratify=digits.target
    )
    return (
        torch.tensor(x_train, dtype=torch.float32),
        torch.tensor(y_train),
        torch.tensor(x_test, dtype=torch.float32),
        torch.tensor(y_test),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b", help="1f1b or gpipe")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", type=Path, help="write the last stage's results here (JSON)")
    parser.add_argument("--checkpoint", type=Path, help="rank 0 saves the whole model here")
    args = parser.parse_args()

    torch.manual_seed(0)  # the same initial weights on every rank
    x_train, y_train, x_test, y_test = load_data()
    pipe = pipeline(
        make_model(),
        microbatches=args.microbatches,
        schedule=args.schedule,
        loss_fn=nn.functional.cross_entropy,
    )
    optimizer = torch.optim.Adam(pipe.stage_module.parameters(), lr=args.lr)
    layers = [name for name, _ in pipe.stage_module.named_children()]
    print(f"rank {dist.get_rank()}: {pipe}, layers {layers}", flush=True)

    losses = []
    for epoch in range(args.epochs):
        # The same shuffle on every rank; full batches only (each splits into micro-batches).
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        n_batches = len(order) // args.batch_size
        total = 0.0
        for b in range(n_batches):
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            result = pipe.step(x_train[idx], y_train[idx])
            optimizer.step()
            optimizer.zero_grad()
            if result.loss is not None:
                total += float(result.loss)
        if pipe.is_last:
            losses.append(total / n_batches)
            print(f"epoch {epoch} loss {losses[-1]:.4f}", flush=True)

    # Evaluation: forward only, in batches padded to a multiple of the micro-batches.
    correct = 0
    for start in range(0, len(x_test), args.batch_size):
        batch = x_test[start : start + args.batch_size]
        pad = -len(batch) % args.microbatches
        output = pipe.predict(torch.cat([batch, batch[:pad]]))
        if output is not None:
            labels = y_test[start : start + len(batch)]
            correct += int((output[: len(batch)].argmax(1) == labels).sum())
    if pipe.is_last:
        accuracy = correct / len(x_test)
        print(f"test accuracy {accuracy:.4f}")
        if args.out:
            results = {"accuracy": accuracy, "losses": losses, "epochs": args.epochs}
            args.out.write_text(json.dumps(results))

    state = pipe.gather_state_dict(dst=0)  # every rank takes part
    if state is not None and args.checkpoint:
        torch.save(state, args.checkpoint)
        print(f"saved the whole model ({len(state)} tensors) to {args.checkpoint}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
