"""A rank program for the data-parallel tests: a few epochs of a small regression.

--mode ddp     run as one rank of ``paralela launch`` (data_parallel + shard);
--mode single  one process on the combined batches of every rank, for comparison.

With --checkpoint it saves at every epoch's end and resumes from it; with --die-at S,
rank 1 of the first attempt kills itself with SIGKILL at global step S.
Rank 0 saves the final weights to --out.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch.utils.data import DistributedSampler, TensorDataset

import paralela.distributed as pd

SAMPLES, FEATURES = 256, 8


def build() -> tuple[TensorDataset, torch.nn.Module, torch.optim.Optimizer]:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    y = (x @ torch.randn(FEATURES, 1, generator=gen)).tanh() + 0.1 * torch.randn(
        SAMPLES, 1, generator=gen
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return TensorDataset(x, y), model, opt


def run_ddp(args: argparse.Namespace) -> None:
    data, model, opt = build()
    ctx = pd.init()
    ddp = pd.data_parallel(model)
    loader = pd.shard(data, batch_size=args.batch, seed=0)
    first_epoch = 0
    state = pd.load_checkpoint(args.checkpoint) if args.checkpoint else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first_epoch = state["epoch"] + 1
        print(f"resumed after epoch {state['epoch']}", flush=True)
    restart = int(os.environ.get("PARALELA_RESTART_COUNT", "0"))
    step = first_epoch * len(loader)
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)
        for xb, yb in loader:
            if ctx.rank == 1 and restart == 0 and step == args.die_at:
                print(f"rank 1 kills itself at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(xb), yb).backward()
            opt.step()
            step += 1
        if args.checkpoint:
            pd.save_checkpoint(
                {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                args.checkpoint,
            )
    if ctx.is_main:
        torch.save(model.state_dict(), args.out)


def run_single(args: argparse.Namespace) -> None:
    data, model, opt = build()
    ranks = args.world
    for epoch in range(args.epochs):
        orders = []
        for r in range(ranks):
            sampler = DistributedSampler(data, num_replicas=ranks, rank=r, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        for start in range(0, len(orders[0]), args.batch):
            idx = [i for order in orders for i in order[start : start + args.batch]]
            xb, yb = data[idx]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    torch.save(model.state_dict(), args.out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "single"], default="ddp")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--die-at", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    (run_ddp if args.mode == "ddp" else run_single)(args)


if __name__ == "__main__":
    main()
