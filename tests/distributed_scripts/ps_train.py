"""One rank of a parameter-server run, for tests/test_distributed_ps.py.

    python ps_train.py OUT_DIR MODE SERVERS STEPS [--convex] [--device D] [--fail-rank R]

Every rank builds the same small model (seeded) and calls ``parameter_server``; trainer
number ``i`` (0-based among the trainers) trains on rows ``i*B..(i+1)*B`` of each step's
batch of ``B * trainers`` rows (``ps_data`` below, shared with the test's reference).
Each rank writes ``OUT_DIR/rank{R}.json`` with its stats, its shards and the error it
got calling the other role's method (``role_error``), plus, on trainers,
``OUT_DIR/rank{R}.pt`` with the final parameters and the full-data loss before/after.
With ``--convex`` the model is linear and the optimizer plain SGD: least squares.
``--device cuda`` puts the model and the data on the GPU, on every rank.
With ``--fail-rank R`` trainer rank R raises at its third step; every rank then writes
the error it saw instead of failing, so the test can check how the failure spread.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from paralela.distributed._ps import parameter_server
from paralela.errors import ConfigError

BATCH = 8  # rows per trainer per step


def ps_model(convex: bool = False) -> torch.nn.Module:
    """A small MLP, or with ``convex`` a linear model (least squares is then convex)."""
    torch.manual_seed(0)
    if convex:
        return torch.nn.Linear(4, 1)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def ps_data(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(rows, 1, generator=gen)
    return x, y


def ps_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def convex_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # plain SGD with lr * curvature ~ 0.1: stable even with pushes several steps stale
    return torch.optim.SGD(params, lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("mode")
    parser.add_argument("servers", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--convex", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model = ps_model(args.convex).to(args.device)
    optimizer = convex_optimizer if args.convex else ps_optimizer
    loss_fn = torch.nn.MSELoss()
    report: dict[str, object] = {}
    try:
        with parameter_server(
            model, optimizer, mode=args.mode, servers=args.servers, timeout=60
        ) as ps:
            report["shards"] = ps.shards
            n_trainers = ps.world_size - ps.servers
            x, y = (t.to(args.device) for t in ps_data(BATCH * n_trainers * args.steps))
            try:  # the other role's call is refused, before anything else happens
                ps.push() if ps.is_server else ps.serve()
            except ConfigError as exc:
                report["role_error"] = str(exc)
            if ps.is_server:
                ps.serve()
            else:
                me = ps.rank - ps.servers
                with torch.no_grad():
                    before = loss_fn(model(x), y).item()
                for step in range(args.steps):
                    if ps.rank == args.fail_rank and step == 2:
                        raise ValueError("trainer broke on purpose")
                    lo = (step * n_trainers + me) * BATCH
                    loss_fn(model(x[lo : lo + BATCH]), y[lo : lo + BATCH]).backward()
                    ps.push()
                    ps.pull()
                ps.finish()
                with torch.no_grad():
                    after = loss_fn(model(x), y).item()
                torch.save(
                    {
                        "params": [p.detach() for p in model.parameters()],
                        "before": before,
                        "after": after,
                    },
                    args.out / f"rank{ps.rank}.pt",
                )
            stats = ps.stats
        report["stats"] = {
            "role": stats.role,
            "pushes": stats.pushes,
            "pulls": stats.pulls,
            "updates": stats.updates,
            "staleness": list(stats.staleness),
            "histogram": {str(k): v for k, v in stats.histogram().items()},
        }
    except Exception as exc:
        if args.fail_rank < 0:
            raise
        report["error"] = f"{type(exc).__name__}: {exc}"
    (args.out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
