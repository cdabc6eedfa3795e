"""Lesson 7: all-reduce vs parameter server: time per step and bytes moved.

Two ways to train one model on several processes with data parallelism:

* **all-reduce** (``paralela.distributed.data_parallel``, PyTorch's DDP): every rank
  holds the model and the optimizer; after each backward pass the ranks average their
  gradients among themselves (a ring: each rank sends and receives about
  ``2 (N-1)/N`` times the gradients' size), then all take the same step;
* **parameter server** (``paralela.distributed.parameter_server``): server ranks hold
  the parameters and the optimizer; each trainer pushes its gradients to them and
  pulls the new parameters back, every step (``2 x`` the model's size per trainer,
  and the server receives and sends that for every trainer). ``sync`` averages all
  trainers' pushes into one step; ``async`` applies each push as it comes.

This script starts each variant with ``paralela.launch`` (gloo and TensorPipe on CPU,
on this machine, one torch thread per rank) as its own ranks, and each rank times its
training steps on an MLP of about 1.3 million parameters (5.3 MB of float32) with random
data: one process alone (no communication), all-reduce on 2 ranks, and a parameter
server with 1 server and 2 trainers, sync and async. It prints the median time per
step, the samples per second of the whole job, and the bytes each trainer and the
busiest process move per step (from the model's size, by the formulas above). Run::

    python examples/lessons/allreduce_vs_ps.py [--quick]

``--quick`` (CI) times fewer steps, of all-reduce and the sync parameter server only.
The ranks' output goes to their logs in a temporary directory, printed when a launch
fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

BATCH = 64  # per trainer
WARMUP = 3  # untimed steps (connections, allocator, DDP's buckets)


def make_model() -> Any:
    """The same seeded MLP on every rank: 256 -> 1024 -> 1024 -> 10 (1.3 M parameters).

    Every rank computes with one thread, alone too: a rank stands for one core, and on a
    shared machine threads that wait for each other at every layer cost more than they
    give (the launcher would give a rank alone both cores' threads)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


def batches(seed: int, steps: int) -> list[tuple[Any, Any]]:
    """``steps`` random batches of this trainer's own (the data does not matter here)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, 256, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
        for _ in range(steps)
    ]


def rank_allreduce(steps: int, out: Path) -> None:
    """One rank of DDP: forward, backward (the all-reduce overlaps it), step."""
    import torch

    import paralela.distributed as pd

    ctx = pd.init()
    model = make_model()
    ddp = pd.data_parallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    times = []
    for i, (x, y) in enumerate(batches(ctx.rank, WARMUP + steps)):
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    record = {"rank": ctx.rank, "world": ctx.world_size, "step_s": times}
    (out / f"rank-{ctx.rank}.json").write_text(json.dumps(record))


def rank_parameter_server(steps: int, mode: Literal["sync", "async"], out: Path) -> None:
    """One rank of a parameter server: rank 0 serves, the others train."""
    import torch

    from paralela.distributed import parameter_server

    model = make_model()
    with parameter_server(model, lambda params: torch.optim.SGD(params, lr=0.01), mode=mode) as ps:
        if ps.is_server:
            ps.serve()
            stats = ps.stats
            record: dict[str, Any] = {
                "rank": ps.rank,
                "server": True,
                "pushes": stats.pushes,
                "updates": stats.updates,
            }
        else:
            times = []
            for i, (x, y) in enumerate(batches(ps.rank, WARMUP + steps)):
                start = time.perf_counter()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                ps.push()
                ps.pull()
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
            ps.finish()
            stats = ps.stats
            record = {
                "rank": ps.rank,
                "server": False,
                "step_s": times,
                "pushes": stats.pushes,
                "pulls": stats.pulls,
                "staleness": stats.histogram(),
            }
    (out / f"rank-{record['rank']}.json").write_text(json.dumps(record))


def launch(role: str, nproc: int, steps: int, workdir: Path) -> list[dict[str, Any]]:
    """Start ``nproc`` ranks of this script in ``role``; their JSON records."""
    import paralela

    out = workdir / role
    out.mkdir()
    program = [__file__, "--role", role, "--steps", str(steps), "--out", str(out)]
    logs = workdir / f"logs-{role}"
    try:
        with open(os.devnull, "wb") as quiet:
            paralela.launch(program, nproc=nproc, log_dir=logs, console=quiet, local=True)
    except paralela.ParalelaError:
        for log in sorted(logs.glob("rank-*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-20:]))
        raise
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def model_bytes() -> int:
    """The bytes of the model's parameters (= of its gradients)."""
    return sum(p.numel() * p.element_size() for p in make_model().parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--role", help=argparse.SUPPRESS)  # set for the ranks
    parser.add_argument("--steps", type=int, default=40, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        if args.role.startswith("ps-"):
            mode: Literal["sync", "async"] = "async" if args.role == "ps-async" else "sync"
            rank_parameter_server(args.steps, mode, args.out)
        else:
            rank_allreduce(args.steps, args.out)
        return 0

    steps = 8 if args.quick else 40
    size = model_bytes()
    print(
        f"MLP of {size / 4 / 1e6:.2f} M parameters ({size / 1e6:.1f} MB float32), "
        f"batch {BATCH} per trainer, {steps} timed steps after {WARMUP} warm-up steps"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="lesson-allreduce-") as tmp:
        workdir = Path(tmp)
        variants = [
            ("1 process alone (no communication)", "alone", 1),
            ("all-reduce (DDP, gloo), 2 ranks", "allreduce", 2),
            ("parameter server, sync, 1 server + 2 trainers", "ps-sync", 3),
            ("parameter server, async, 1 server + 2 trainers", "ps-async", 3),
        ]
        if args.quick:  # CI: the two ways to combine gradients; each launch costs seconds
            variants = [v for v in variants if v[1] in ("allreduce", "ps-sync")]
        for title, role, nproc in variants:
            records = launch(role, nproc, steps, workdir)
            trainers = [r for r in records if not r.get("server")]
            n = len(trainers)
            step = statistics.median(t for r in trainers for t in r["step_s"])
            if role.startswith("ps-"):
                # each step: one push of the gradients, one pull of the parameters
                per_trainer = 2 * size
                busiest = 2 * size * n  # the server: every trainer's push and pull
            elif n > 1:
                # ring all-reduce: 2 (n-1)/n of the gradients sent, as much received
                per_trainer = 4 * (n - 1) * size // n
                busiest = per_trainer
            else:
                per_trainer = busiest = 0
            rows.append((role, title, n, step, n * BATCH / step, per_trainer, busiest, trainers))

    print()
    print(
        "| variant | trainers | step ms (median) | samples/s "
        "| MB in + out per trainer per step | MB in + out of the busiest process per step |"
    )
    print("|---|---|---|---|---|---|")
    for _, title, n, step, rate, per_trainer, busiest, _ in rows:
        print(
            f"| {title} | {n} | {step * 1e3:.1f} | {rate:,.0f} | {per_trainer / 1e6:.1f} | "
            f"{busiest / 1e6:.1f} |"
        )
    print("\nAs the job grows (the same formulas, MB in + out per step):")
    print("| trainers N | a ring rank: 4 (N-1)/N x model | one server: 2 N x model |")
    print("|---|---|---|")
    for n in (2, 4, 8, 16, 64):
        print(f"| {n} | {4 * (n - 1) / n * size / 1e6:.1f} | {2 * n * size / 1e6:.0f} |")

    by_role = {row[0]: row for row in rows}
    if "ps-async" in by_role:
        stale = by_role["ps-async"][7][0]["staleness"]
        print(f"\nasync: staleness of the first trainer's pushes {{staleness: pushes}}: {stale}")

    allreduce, sync = by_role["allreduce"], by_role["ps-sync"]
    alone = f"alone {by_role['alone'][3] * 1e3:.1f} ms, " if "alone" in by_role else ""
    print(
        f"\nRESULT: step time: {alone}all-reduce {allreduce[3] * 1e3:.1f} ms, parameter server "
        f"(sync) {sync[3] * 1e3:.1f} ms ({sync[3] / allreduce[3]:.1f}x all-reduce); the busiest "
        f"process moves {sync[6] / 1e6:.0f} MB a step (the server), {allreduce[6] / 1e6:.0f} MB "
        "(a ring rank)"
    )
    print(
        "Conclusion: a server carries every trainer's push and pull, so its traffic grows "
        "with the trainers; a ring rank's stays under 4x the model at any size."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
