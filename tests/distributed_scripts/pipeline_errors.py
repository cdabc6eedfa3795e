"""One rank of a 2-rank group that provokes the pipeline's errors and records them.

Usage: python pipeline_errors.py OUT_DIR

Each case runs on both ranks; a ConfigError's message is recorded, anything else
fails the rank. After the refused steps a valid step must still work: a refused
step leaves the group usable (no rank waits for a partner that gave up). Each rank
writes ``OUT_DIR/errors-rank{R}.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from paralela.distributed._pipeline import pipeline
from paralela.errors import ConfigError


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def main() -> None:
    out_dir = Path(sys.argv[1])
    loss_fn = nn.functional.cross_entropy
    messages: dict[str, str] = {}

    def expect(case: str, call: Callable[[], object]) -> None:
        try:
            call()
        except ConfigError as exc:
            messages[case] = str(exc)
        else:
            messages[case] = "NO ERROR"

    # Refused before any communication: the same on every rank.
    expect("schedule", lambda: pipeline(model(), microbatches=2, schedule="zigzag"))
    expect("stages", lambda: pipeline(list(model()), microbatches=2))
    expect("balance", lambda: pipeline(model(), microbatches=2, balance=[1, 1, 1]))
    expect("1f1b", lambda: pipeline(model(), microbatches=1, schedule="1f1b"))
    expect("layers", lambda: pipeline(nn.Sequential(nn.Linear(4, 3)), microbatches=2))

    pipe = pipeline(model(), microbatches=2, schedule="1f1b", loss_fn=loss_fn)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    rank = dist.get_rank()
    # Refused after the ranks compared notes: every rank raises, none hangs.
    expect("rows", lambda: pipe.step(torch.randn(5, 4), torch.randint(0, 3, (5,))))
    expect("target", lambda: pipe.step(x, y if rank == 0 else None))
    expect("mismatch", lambda: pipe.step(x, y[:4]))
    expect("inputs", lambda: pipe.step(None, y))
    expect("predict_rows", lambda: pipe.predict(torch.randn(3, 4)))
    no_loss = pipeline(model(), microbatches=2)
    expect("no_loss", lambda: no_loss.step(x, y))

    result = pipe.step(x, y)  # the group still works
    after = {"ok": True, "loss": None if result.loss is None else float(result.loss)}
    (out_dir / f"errors-rank{rank}.json").write_text(
        json.dumps({"messages": messages, "after": after})
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
