"""Lesson 8: pipeline (model) parallelism: micro-batches and the bubble, measured.

A model too large for one device is cut into **stages**, consecutive layers, one per
device. Sent whole, a batch keeps one stage busy at a time: with 2 stages each works
half the time. Cut into ``m`` **micro-batches**, the stages work on different
micro-batches at once; only the start and the end of each step leave a stage idle, the
**bubble**: ``(p - 1) / (m + p - 1)`` of the step with ``p`` stages. The best step time
is then ``T1 / p x (m + p - 1) / m``, ``T1`` being one device's time for the whole model.

This script starts 2 ranks with ``paralela.launch`` (gloo on CPU, one thread each: a
rank stands for one device). Rank 0 first times the whole model alone (``T1``); then
both ranks build ``paralela.distributed.pipeline`` over an MLP of 8 layers of 1024
units, one stage each (GPipe schedule), and time a training step on a batch of 256 for
1, 2, 4, 8 and 16 micro-batches, in 3 rounds that interleave the variants (each keeps
its fastest round: the machine may be shared). It prints, for each, the measured step
time and speed-up over one device beside the bubble's prediction. Run::

    python examples/lessons/pipeline_parallelism.py [--quick]

``--quick`` (CI) times one round of fewer steps of a smaller batch, for fewer
micro-batch counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTH, LAYERS = 1024, 8
WARMUP = 2


def make_model() -> Any:
    """The same seeded MLP on every rank: 8 layers of WIDTH units, then 10 outputs."""
    import torch
    from torch import nn

    torch.set_num_threads(1)  # a rank stands for one device: one core, one thread
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def timed(step: Any, steps: int) -> float:
    """Seconds per call of ``step()``, over ``steps`` calls after WARMUP untimed ones."""
    for _ in range(WARMUP):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def rank_main(batch: int, steps: int, repeats: int, microbatches: list[int], out: Path) -> None:
    """One rank: the whole model alone (rank 0), then one stage of each pipeline; the
    rounds interleave them, and each keeps its fastest round (the machine is shared)."""
    import torch
    from torch.nn import functional

    import paralela.distributed as pd

    ctx = pd.init(backend="gloo")
    x = torch.randn(batch, WIDTH, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))
    model = make_model()
    whole_optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def whole() -> None:
        functional.cross_entropy(model(x), y).backward()
        whole_optimizer.step()
        whole_optimizer.zero_grad()

    staged = {}
    for m in microbatches:  # every rank builds the same pipelines in the same order
        pipe = pd.pipeline(
            make_model(), microbatches=m, schedule="gpipe", loss_fn=functional.cross_entropy
        )
        optimizer = torch.optim.SGD(pipe.stage_module.parameters(), lr=0.01)

        def step(pipe: Any = pipe, optimizer: Any = optimizer) -> None:
            pipe.step(x, y)
            optimizer.step()
            optimizer.zero_grad()

        staged[m] = step

    alone, best = float("inf"), {m: float("inf") for m in microbatches}
    for _ in range(repeats):
        if ctx.is_main:  # the other rank waits in the barrier (blocked, using no CPU)
            alone = min(alone, timed(whole, steps))
        for m in microbatches:
            pd.barrier()
            best[m] = min(best[m], timed(staged[m], steps))
    record = {"rank": ctx.rank, "alone_s": alone, "pipeline_s": {str(m): best[m] for m in best}}
    (out / f"rank-{ctx.rank}.json").write_text(json.dumps(record))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller steps (CI)")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--microbatches", default="1,2,4,8,16", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    ms = [int(m) for m in args.microbatches.split(",")]
    if args.rank:
        rank_main(args.batch, args.steps, args.repeats, ms, args.out)
        return 0

    import paralela

    if args.quick:
        args.batch, args.steps, args.repeats, ms = 128, 3, 1, [1, 4, 8]
    p = 2
    print(
        f"MLP of {LAYERS} x {WIDTH} units in {p} stages (one rank each, one thread each), "
        f"batch {args.batch}, GPipe; the best of {args.repeats} rounds of {args.steps} timed "
        f"steps after {WARMUP}"
    )
    with tempfile.TemporaryDirectory(prefix="lesson-pipeline-") as tmp:
        out = Path(tmp)
        program = [
            __file__,
            "--rank",
            "--batch",
            str(args.batch),
            "--steps",
            str(args.steps),
            "--repeats",
            str(args.repeats),
            "--microbatches",
            ",".join(map(str, ms)),
            "--out",
            str(out),
        ]
        try:
            with open(os.devnull, "wb") as quiet:
                paralela.launch(program, nproc=p, log_dir=out / "logs", console=quiet, local=True)
        except paralela.ParalelaError:
            for log in sorted((out / "logs").glob("rank-*.log")):
                tail = "\n".join(log.read_text().splitlines()[-20:])
                print(f"--- {log.name} (last lines)\n{tail}")
            raise
        records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(p)]

    alone = records[0]["alone_s"]
    print()
    print(
        "| micro-batches m | rows each | step ms | speed-up vs 1 device | bubble (p-1)/(m+p-1) | "
        "predicted speed-up p*m/(m+p-1) |"
    )
    print("|---|---|---|---|---|---|")
    print(f"| 1 device, whole model | {args.batch} | {alone * 1e3:.1f} | 1.00x | - | - |")
    speedups = {}
    for m in ms:
        step = max(r["pipeline_s"][str(m)] for r in records)  # the slower rank's pace
        speedups[m] = alone / step
        bubble = (p - 1) / (m + p - 1)
        print(
            f"| {m} | {args.batch // m} | {step * 1e3:.1f} | {speedups[m]:.2f}x | "
            f"{bubble:.0%} | {p * m / (m + p - 1):.2f}x |"
        )
    best = max(speedups, key=lambda m: speedups[m])
    print(
        f"\nRESULT: 2 stages, m=1: {speedups[ms[0]]:.2f}x one device (bubble 50%); "
        f"m={best}: {speedups[best]:.2f}x (bubble {(p - 1) / (best + p - 1):.0%}, "
        f"predicted {p * best / (best + p - 1):.2f}x)"
    )
    print(
        "Conclusion: micro-batches fill the pipeline; past a point, smaller matrix products "
        "and more messages per step eat what the smaller bubble gives."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
