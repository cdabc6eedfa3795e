"""The program every rank runs in the launch benchmark, under ``paralela launch`` and
under ``torchrun`` alike (plain ``torch.distributed``, gloo, rank and world size from the
environment both launchers set)::

    python bench/_launch_work.py startup --stamps DIR
    python bench/_launch_work.py train --stamps DIR --train digits=1500,wide=300 --warmup 30
    python bench/_launch_work.py restart --stamps DIR

Each rank appends one JSON line per event to ``DIR/rank-<RANK>.jsonl``. Event ``ready``:
the wall clock (``time.time()``) at the program's first line (``started``, before torch
is imported) and just after its first all-reduce (``t``), with the attempt
(``TORCHELASTIC_RESTART_COUNT``), torch's thread count and the CPU affinity. ``train``
then adds one ``train_<model>`` line per model with its steps/s. ``restart``: attempt 0
writes its line and then waits (the benchmark SIGKILLs a rank and the launcher stops the
other); the next attempt writes its line and exits 0.

Models (``train``), each a data-parallel (DDP) MLP trained with SGD, 32 images per rank
and step, on scikit-learn's digits (the data of ``paralela/demos/_digits.py``)::

    digits  64 -> 64 -> 10, the digits demo's MLP (4,810 parameters, 19 KB of gradients)
    wide    64 -> 1024 -> 1024 -> 10 (1.12 M parameters, 4.5 MB of gradients)

Steps/s is measured between two barriers, after ``--warmup`` untimed steps.
"""

from __future__ import annotations

import time

STARTED = time.time()  # the program's first line: before anything is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

BATCH_PER_RANK = 32
WIDE = 1024
MODELS = ("digits", "wide")


def _stamp(stamps: Path, **fields: Any) -> None:
    rank = os.environ["RANK"]
    line = json.dumps({"rank": int(rank), "pid": os.getpid(), **fields}) + "\n"
    with open(stamps / f"rank-{rank}.jsonl", "a") as f:
        f.write(line)


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _first_all_reduce(stamps: Path) -> None:
    """Join the group, all-reduce one tensor, then write the time."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    done = time.time()
    if t.item() != dist.get_world_size():
        raise RuntimeError(f"all_reduce gave {t.item()}, expected {dist.get_world_size()}")
    _stamp(
        stamps,
        event="ready",
        started=STARTED,
        t=done,
        attempt=_attempt(),
        threads=torch.get_num_threads(),
        omp=os.environ.get("OMP_NUM_THREADS"),
        cpus=sorted(os.sched_getaffinity(0)),
    )


def _model(name: str) -> Any:
    import torch

    from paralela.demos._digits import DEFAULT_PARAMS

    if name == "digits":
        hidden = DEFAULT_PARAMS["hidden"]
        return torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
        )
    return torch.nn.Sequential(
        torch.nn.Linear(64, WIDE),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDE, WIDE),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDE, 10),
    )


def _train(stamps: Path, name: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn import functional
    from torch.nn.parallel import DistributedDataParallel

    from paralela.demos._digits import _data

    x_train, y_train, _, _ = _data()
    torch.manual_seed(0)
    model = _model(name)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(dist.get_rank())
    n = len(y_train)

    def step() -> None:
        batch = torch.randint(0, n, (BATCH_PER_RANK,), generator=generator)
        optimizer.zero_grad()
        loss = functional.cross_entropy(ddp(x_train[batch]), y_train[batch])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    _stamp(
        stamps,
        event=f"train_{name}",
        steps=steps,
        seconds=elapsed,
        steps_per_s=steps / elapsed,
        grad_bytes=grad_bytes,
    )


def _steps(spec: str) -> dict[str, int]:
    """``digits=1500,wide=300`` -> ``{"digits": 1500, "wide": 300}``."""
    steps = {}
    for part in spec.split(","):
        name, _, count = part.partition("=")
        if name not in MODELS or not count.isdigit():
            raise SystemExit(f"--train: expected MODEL=STEPS with MODEL in {MODELS}, got {part!r}")
        steps[name] = int(count)
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one rank of the launch benchmark")
    ap.add_argument("mode", choices=("startup", "train", "restart"))
    ap.add_argument("--stamps", type=Path, required=True)
    ap.add_argument("--train", default="digits=1500,wide=300", help="MODEL=STEPS,...")
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args(argv)

    import torch.distributed as dist

    _first_all_reduce(args.stamps)
    if args.mode == "train":
        for name, steps in _steps(args.train).items():
            _train(args.stamps, name, steps, args.warmup)
    elif args.mode == "restart" and _attempt() == 0:
        while True:  # until the benchmark kills a rank and the launcher stops this one
            time.sleep(60)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
