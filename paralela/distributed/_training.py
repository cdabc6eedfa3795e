"""Inside a rank: join the process group, wrap the model, shard the data (PyTorch).

``init()`` reads what ``paralela launch`` (or torchrun, or Slurm through the launcher)
put in the environment; run without a launcher, it makes a group of one, so the same
script also runs as plain ``python train.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from paralela.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = [
    "DistContext",
    "ShardedLoader",
    "barrier",
    "data_parallel",
    "init",
    "is_main",
    "rank",
    "shard",
    "world_size",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = timedelta(minutes=10)  # torch's own default for collectives
EXIT_BARRIER_S = 30  # how long a finished rank waits for its peers at exit


def _torch() -> Any:
    try:
        import torch
        import torch.distributed
    except ImportError as exc:
        raise MissingExtraError("torch", "torch", "paralela.distributed") from exc
    return torch


@dataclass(frozen=True)
class DistContext:
    """The process group this rank joined.

    Attributes:
        rank: global rank.
        world_size: number of ranks.
        local_rank: rank on this host.
        device: where this rank's tensors go (``cuda:N`` on a GPU rank, else ``cpu``).
        backend: ``"nccl"`` or ``"gloo"``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that writes files and prints)."""
        return self.rank == 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    if not value.strip().isdigit():
        raise ConfigError(f"{name}={value!r} is not a whole number; paralela launch sets it.")
    return int(value)


def init(backend: str | None = None, *, timeout: timedelta = DEFAULT_TIMEOUT) -> DistContext:
    """Join the process group described by the environment (once; later calls return it).

    Uses NCCL when this rank has a GPU, gloo otherwise (or ``backend``). A GPU rank
    gets its device set: ``cuda:0`` when the launcher pinned one GPU per rank, else
    ``cuda:LOCAL_RANK``. Without ``RANK``/``WORLD_SIZE`` (a plain ``python train.py``)
    it makes a group of one on 127.0.0.1.

    Args:
        backend: ``"gloo"``, ``"nccl"``; default by device.
        timeout: how long collectives wait for a missing peer before failing.

    Raises:
        ConfigError: malformed ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``.
        MissingExtraError: torch is not installed.
    """
    torch = _torch()
    dist = torch.distributed
    if dist.is_initialized():
        return _context(torch)
    world = _env_int("WORLD_SIZE")
    rank_ = _env_int("RANK")
    if world is None or rank_ is None:
        from paralela.distributed._env import free_ports

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_ports(1)[0]))
        world, rank_ = 1, 0
    local = _env_int("LOCAL_RANK") or 0
    device = torch.device("cpu")
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        index = 0 if torch.cuda.device_count() == 1 else local % torch.cuda.device_count()
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    chosen = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(
        chosen,
        rank=rank_,
        world_size=world,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    # A group still alive when the interpreter exits can abort the process from gloo's
    # or NCCL's threads ("terminate called without an active exception"): end it first.
    atexit.register(_destroy_group)
    return _context(torch)


def _destroy_group() -> None:
    """At exit: wait (briefly) for the other ranks, then end the group.

    Without it, gloo's threads still hold work when the interpreter is torn down and the
    process can die with SIGABRT; and a rank that ends its group while a peer still
    talks to rank 0's store can make that peer abort. A peer that is gone already does
    not hold the exit up for long: the barrier gives up after EXIT_BARRIER_S.
    """
    dist = _torch().distributed
    if not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # exiting anyway: a peer may be gone already
        if dist.get_world_size() > 1:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=EXIT_BARRIER_S))
            else:
                dist.barrier()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _context(torch: Any) -> DistContext:
    dist = torch.distributed
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available() and torch.cuda.device_count()
        else torch.device("cpu")
    )
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=_env_int("LOCAL_RANK") or 0,
        device=device,
        backend=str(dist.get_backend()),
    )


def rank() -> int:
    """This rank (0 before :func:`init`, or in a plain single process)."""
    dist = _torch().distributed
    return int(dist.get_rank()) if dist.is_initialized() else (_env_int("RANK") or 0)


def world_size() -> int:
    """Number of ranks (1 before :func:`init`, or in a plain single process)."""
    dist = _torch().distributed
    return int(dist.get_world_size()) if dist.is_initialized() else (_env_int("WORLD_SIZE") or 1)


def is_main() -> bool:
    """Whether this is rank 0."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing to wait for outside a process group)."""
    dist = _torch().distributed
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def data_parallel(model: torch.nn.Module, **ddp_options: Any) -> torch.nn.Module:
    """Mirror ``model`` on every rank; gradients are averaged with all-reduce (DDP).

    Joins the process group first if needed (:func:`init`), moves the model to this
    rank's device and wraps it in ``DistributedDataParallel``. Every rank must build
    the same model; DDP copies rank 0's weights to the others at the start.

    Args:
        model: the module to train.
        ddp_options: passed to ``DistributedDataParallel`` (``find_unused_parameters``...).
    """
    _torch()
    from torch.nn.parallel import DistributedDataParallel

    ctx = init()
    model = model.to(ctx.device)
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **ddp_options)


class ShardedLoader(Generic[T]):
    """A data loader over this rank's share of the data set, reshuffled every epoch.

    Each ``for batch in loader`` is one epoch: the shuffle of epoch ``e`` is the same
    on every rank (seeded with ``seed + e``), and the ranks' shares never overlap.
    Resuming from a checkpoint: call :meth:`set_epoch` with the epoch to run next.
    """

    def __init__(self, loader: DataLoader[T], sampler: DistributedSampler[T]) -> None:
        self.loader = loader
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (its shuffle order)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[T]:
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def shard(
    dataset: Dataset[T],
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    **loader_options: Any,
) -> ShardedLoader[T]:
    """Split ``dataset`` over the ranks: each rank loads its own part, in batches.

    Args:
        dataset: a map-style data set (``len`` and indexing).
        batch_size: examples per batch *on each rank*; the global batch is
            ``batch_size * world_size``.
        shuffle: a new order each epoch, the same on every rank.
        seed: the shuffle's seed.
        drop_last: drop the tail that does not split evenly over the ranks (else
            ``DistributedSampler`` pads it with repeated examples).
        loader_options: passed to ``DataLoader`` (``num_workers``, ``pin_memory``...).

    Raises:
        ConfigError: ``batch_size`` < 1, or ``sampler``/``shuffle`` in
            ``loader_options`` (the sampler is what shards).
    """
    _torch()
    from torch.utils.data import DataLoader, DistributedSampler

    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
    for name in ("sampler", "batch_sampler"):
        if name in loader_options:
            raise ConfigError(f"shard() makes the sampler itself; leave out {name}=.")
    sampler: DistributedSampler[T] = DistributedSampler(
        dataset,
        num_replicas=world_size(),
        rank=rank(),
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    loader: DataLoader[T] = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, **loader_options
    )
    return ShardedLoader(loader, sampler)
