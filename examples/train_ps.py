"""Train a small MLP on scikit-learn's digits with a parameter server.

Run it as three ranks, one server and two trainers::

    paralela launch --nproc 3 examples/train_ps.py [--mode async] [--servers 1] [--epochs 5]

(``torchrun --nproc-per-node 3 examples/train_ps.py`` works too: the script only reads
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.) Rank 0 holds the
parameters and the optimizer (SGD with momentum); each trainer trains on its own share
of the 1,437 training images, pushes its gradients after every batch of 32 and pulls
the new parameters. In sync mode every step averages the two trainers' gradients, as
all-reduce data parallelism would; in async mode each push is applied as it arrives.

When every trainer has finished, the first trainer prints ``final accuracy X`` on the
360 held-out images (about 0.95 after 5 epochs), and the server prints what it did:
pushes, optimizer steps and the staleness of the pushes. Started without those
variables, the script says how to start it and exits with status 2. Needs torch and
scikit-learn; takes a few seconds.
"""

from __future__ import annotations

import argparse
import sys

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from paralela.distributed import parameter_server
from paralela.errors import ConfigError


def make_model() -> torch.nn.Module:
    """The same seeded MLP on every rank: 64 pixels, 32 hidden units, 10 digits."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits scaled to [0, 1], split 80/20 the same way on every rank."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)
    return (
        torch.tensor(x_train, dtype=torch.float32),
        torch.tensor(y_train),
        torch.tensor(x_test, dtype=torch.float32),
        torch.tensor(y_test),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    model = make_model()
    try:
        ps = parameter_server(
            model,
            lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            mode=args.mode,
            servers=args.servers,
        )
    except ConfigError as exc:
        print(f"train_ps.py: {exc}", file=sys.stderr)
        return 2
    with ps:
        if ps.is_server:
            ps.serve()
            stats = ps.stats
            print(
                f"server rank {ps.rank}: {stats.pushes} pushes, {stats.updates} optimizer "
                f"steps, staleness {stats.histogram()}"
            )
            return 0
        x_train, y_train, x_test, y_test = load_data()
        me, n_trainers = ps.rank - ps.servers, len(ps.trainers)
        x_mine, y_mine = x_train[me::n_trainers], y_train[me::n_trainers]
        generator = torch.Generator().manual_seed(me)
        loss_fn = torch.nn.CrossEntropyLoss()
        for _ in range(args.epochs):
            order = torch.randperm(len(x_mine), generator=generator)
            for start in range(0, len(order), args.batch_size):
                batch = order[start : start + args.batch_size]
                loss_fn(model(x_mine[batch]), y_mine[batch]).backward()
                ps.push()  # sends the gradients and clears them
                ps.pull()
        ps.finish()  # waits for the other trainers, then pulls the final parameters
        if ps.rank == ps.servers:
            with torch.no_grad():
                accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
            print(f"final accuracy {accuracy:.3f} ({len(y_test)} held-out images, {args.mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
