"""Options, environment and layout of a parameter server, checked before any rpc.

Also :class:`ParameterServerStats`, what :attr:`ParameterServer.stats` returns.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from paralela.errors import ConfigError

__all__ = [
    "Layout",
    "ParameterServerStats",
    "check_layout",
    "default_optimizer",
    "shard_parameters",
]

Mode = Literal["sync", "async"]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class ParameterServerStats:
    """What one rank did, as counted on that rank.

    Attributes:
        role: ``"server"`` or ``"trainer"``.
        pushes: on a server, the pushes it received; on a trainer, the pushes it sent.
        pulls: on a server, the pulls it answered; on a trainer, the pulls it made.
        updates: on a server, the optimizer steps it applied (sync: one per round;
            async: one per push); on a trainer, 0.
        staleness: one entry per push, in order. On a server: its version (optimizer
            steps applied) when it applied the push, minus the version the trainer had
            pulled. On a trainer: the largest of those over the servers. Always 0 in
            sync mode when the trainer pulls after every push.
    """

    role: Literal["server", "trainer"]
    pushes: int
    pulls: int
    updates: int
    staleness: tuple[int, ...] = field(default=())

    def histogram(self) -> dict[int, int]:
        """How many pushes had each staleness, ``{staleness: count}``, by staleness."""
        return dict(sorted(Counter(self.staleness).items()))


def default_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def shard_parameters(sizes: Sequence[int], servers: int) -> list[list[int]]:
    """Split parameter indices over ``servers``: the largest first, each to the lightest.

    Returns one sorted index list per server. Every rank computes the same split from
    the same model. Raises :class:`ConfigError` when a server would get nothing.
    """
    if servers > len(sizes):
        raise ConfigError(
            f"servers={servers}, but the model has only {len(sizes)} parameter tensor(s), "
            f"so some server would hold nothing: use servers={len(sizes)} or fewer."
        )
    load = [0] * servers
    shards: list[list[int]] = [[] for _ in range(servers)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(servers), key=lambda s: (load[s], s))
        shards[target].append(index)
        load[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def _env_int(name: str, given: int | None) -> int:
    if given is not None:
        value: object = given
    else:
        raw = os.environ.get(name)
        if raw is None:
            raise ConfigError(
                f"{name} is not set: run the script under 'paralela launch --nproc N' "
                f"(or torchrun), or pass {name.lower()}= to parameter_server()."
            )
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}.") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name.lower()} must be a non-negative integer, got {value!r}.")
    return value


@dataclass(frozen=True)
class Layout:
    rank: int
    world_size: int
    servers: int
    shards: list[list[int]]

    @property
    def trainers(self) -> list[int]:
        return list(range(self.servers, self.world_size))


def check_layout(
    model: torch.nn.Module,
    optimizer: OptimizerFactory,
    mode: str,
    servers: int,
    timeout: float,
    rank: int | None,
    world_size: int | None,
) -> Layout:
    """Check every option and the environment before any process is contacted."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if not callable(optimizer):
        raise ConfigError(
            "optimizer must be a function from a list of parameters to an optimizer, "
            f"e.g. lambda params: torch.optim.SGD(params, lr=0.1); got {optimizer!r}."
        )
    if mode not in ("sync", "async"):
        raise ConfigError(
            f"mode must be 'sync' (average every trainer's gradients, then one step) or "
            f"'async' (apply each push on arrival), got {mode!r}."
        )
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"servers must be a positive integer, got {servers!r}.")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    the_rank = _env_int("RANK", rank)
    size = _env_int("WORLD_SIZE", world_size)
    if size <= servers:
        raise ConfigError(
            f"WORLD_SIZE={size} with servers={servers} leaves no trainer rank: start at "
            f"least {servers + 1} ranks (e.g. paralela launch --nproc {servers + 2}) "
            "or use fewer servers."
        )
    if the_rank >= size:
        raise ConfigError(f"RANK={the_rank} is not below WORLD_SIZE={size}.")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ConfigError(
                f"{name} is not set: run the script under 'paralela launch --nproc N' "
                "(or torchrun), which sets it."
            )
    sizes = [p.numel() for p in model.parameters()]
    if not sizes:
        raise ConfigError("The model has no parameters: there is nothing to serve.")
    return Layout(the_rank, size, servers, shard_parameters(sizes, servers))
