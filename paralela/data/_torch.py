"""``TorchIterable``: a pipeline as a torch ``IterableDataset``, sharded by rank and by
DataLoader worker.

::

    DataLoader(TorchIterable(pipeline), batch_size=None, num_workers=K)
      rank r of W (RANK/WORLD_SIZE, as paralela launch and torchrun set them)
        loader worker k of K (get_worker_info())
          runs its own copy of the pipeline, whose source keeps element i only when
          i % (W*K) == r*K + k            (before any map: the skipped elements cost
                                           nothing but the source's own next())
          with a CPU budget of the rank's CPUs / (local ranks x K)

Each (rank, worker) pair gets a disjoint part of the source; together they get all of it.
As a DataLoader over a map-style dataset: batches are torch's ``default_collate``, ``len()``
is known when the source's length is, and every epoch is shuffled anew.
"""

from __future__ import annotations

import io
import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from paralela.data._cache import Cache, source_digest
from paralela.data._parallel import _END, Stage
from paralela.data._pipeline import Pipeline
from paralela.data._run import PipelineIterator, _Run, _Step
from paralela.data._stats import StageStats
from paralela.errors import ConfigError, MissingExtraError

try:
    import torch.distributed
    import torch.utils.data
except ImportError as exc:  # pragma: no cover - torch is in the dev environment
    raise MissingExtraError("torch", "torch", "paralela.data.TorchIterable") from exc

__all__ = ["TorchIterable", "shard_pipeline"]


class TorchIterable(torch.utils.data.IterableDataset[Any]):
    """A pipeline as a torch ``IterableDataset``, for
    ``DataLoader(TorchIterable(pipeline), batch_size=None, num_workers=K)`` (batch in the
    pipeline; ``batch_size=None`` keeps the DataLoader from batching again).

    Every rank and every DataLoader worker of a rank iterates its own copy of the
    pipeline, sharded at the source: element ``i`` of the source goes to the pair
    (rank ``r``, worker ``k``) with ``i % (W * K) == r * K + k``. The pairs' parts are
    disjoint and together make the whole source, and the stages after the source (a
    ``map`` that decodes) run only on the pair's own elements. Shuffling and batching
    happen within a pair's part. The DataLoader hands out its workers' elements in
    turn.

    Rank and world size come from ``RANK``/``WORLD_SIZE`` (set by ``paralela launch``
    and torchrun), else from an initialised ``torch.distributed``, else 0 and 1.

    CPUs: ``workers="auto"`` stages of each copy tune within the CPUs of this process
    divided by the local ranks (``LOCAL_WORLD_SIZE``) and the DataLoader workers, so that
    all copies together stay within the allocation; ``pipeline.with_options(cpus=n)``
    sets each copy's budget instead.

    In DDP every rank must take the same number of steps: parts differ by at most one
    element, so choose a source that splits evenly, batch with ``drop_last=True``, or
    use ``torch.distributed.algorithms.Join``.

    A loop written for a ``DataLoader`` runs unchanged: ``batch()`` steps without a
    ``collate`` make their batches with torch's ``default_collate`` (numbers and arrays
    become tensors: ``target.to(device)`` works), ``len()`` is the number of elements this
    rank's part gives when the source's length is known (see :meth:`Pipeline.length`),
    and each ``iter(loader)`` is a new epoch whose shuffles draw a new order: the epoch
    given to :meth:`set_epoch`, else a seed drawn from torch's generator (the loader's
    per-epoch seed in its workers), so that ``torch.manual_seed`` makes the orders
    reproducible, as with DataLoader's ``shuffle=True``.

    With ``num_workers=K > 1`` and a pipeline that batches, each worker batches its own
    part: up to ``K - 1`` more (partial) batches than ``len()``, which counts the rank's
    part as one (DataLoader warns when more come than ``len()`` said); batch in the
    DataLoader (``batch_size=n``) for an exact ``len(loader)``.

    Args:
        pipeline: a :class:`Pipeline`, or a function of the epoch (see
            :meth:`set_epoch`) that returns one, e.g. ``lambda epoch:
            base.shuffle(1000, seed=epoch).batch(32)``.

    Failure and shutdown: an error in a stage is raised by the DataLoader in the main
    process (torch re-raises a worker's exception); when the loader's iterator is left,
    each worker's run is closed, stopping its threads and processes.

    Raises:
        ConfigError: malformed ``RANK``/``WORLD_SIZE``, or a pipeline with
            ``cache(path)`` split into several parts (each part would write the same
            file): cache in memory, or build each part's path from the rank in a
            function.
        MissingExtraError: torch is not installed (on import).
    """

    def __init__(self, pipeline: Pipeline | Callable[[int], Pipeline]) -> None:
        super().__init__()
        if not isinstance(pipeline, Pipeline) and not callable(pipeline):
            raise ConfigError(
                f"TorchIterable needs a Pipeline or a function of the epoch that returns "
                f"one; got {type(pipeline).__name__}."
            )
        self.pipeline = pipeline
        self.epoch = 0
        self._set = False  # set_epoch called: its epoch seeds the shuffles
        self._runs = 0  # iterations of this copy of the dataset

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next ``iter(loader)``: it seeds the pipeline's shuffles (epoch
        ``e`` shuffles the same way in every program run, so a resumed training sees the
        orders it would have seen) and is passed to a pipeline function. Call it before
        each epoch, as ``DistributedSampler.set_epoch``. DataLoader workers see it when
        they start: not with ``persistent_workers=True``, whose workers keep the epoch
        they started with."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be a whole number of at least 0, got {epoch!r}.")
        self.epoch = epoch
        self._set = True

    def shard(self) -> tuple[int, int]:
        """``(count, index)``: how many parts the source is split into, and this one's."""
        rank, world = rank_and_world_size()
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return world * workers, rank * workers + worker

    def __iter__(self) -> Iterator[Any]:
        count, index = self.shard()
        part = shard_pipeline(self._pipeline(), count, index)
        info = torch.utils.data.get_worker_info()
        if part._cpus is None:
            copies = (_env_int("LOCAL_WORLD_SIZE") or 1) * (1 if info is None else info.num_workers)
            part = part.with_options(cpus=max(1, _usable_cpus() // copies))
        runs, self._runs = self._runs, self._runs + 1
        epoch: int | str = self.epoch
        if not self._set and info is not None:
            # The loader's seed, drawn from torch's generator at every iter(loader) (and
            # the runs, for persistent workers, which keep theirs).
            epoch = f"{info.seed - info.id}.{runs}"
        elif not self._set:  # drawn from torch's generator, as RandomSampler does
            epoch = str(int(torch.empty((), dtype=torch.int64).random_().item()))
        return PipelineIterator(part, epoch=epoch, collate=torch.utils.data.default_collate)

    def __len__(self) -> int:
        """The elements this rank's part gives (batches, where the pipeline batches).

        Raises:
            TypeError: not known before running (see :meth:`Pipeline.length`).
        """
        count, index = self.shard()
        return shard_pipeline(self._pipeline(), count, index).length()

    def _pipeline(self) -> Pipeline:
        if isinstance(self.pipeline, Pipeline):
            return self.pipeline
        pipeline = self.pipeline(self.epoch)
        if not isinstance(pipeline, Pipeline):
            raise ConfigError(
                f"TorchIterable's function returned {type(pipeline).__name__}, not a Pipeline."
            )
        return pipeline

    def __getstate__(self) -> dict[str, Any]:
        # Spawned and forkserver DataLoader workers (the default from Python 3.14) get the
        # dataset pickled: cloudpickle carries a pipeline's lambdas and closures.
        buffer = io.BytesIO()
        _Pickler(buffer).dump(self.pipeline)
        return {
            "pickled": buffer.getvalue(),
            "epoch": self.epoch,
            "set": self._set,
            "runs": self._runs,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pipeline = pickle.loads(state["pickled"])
        self.epoch = state["epoch"]
        self._set = state["set"]
        self._runs = state["runs"]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """Pickles a pipeline without its last run (a weakref to a running iterator), also
    where a pipeline function's closure holds one."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Pipeline):
            state = (obj._steps, obj._cpus, obj._deterministic, obj._run_dir)
            return _unpickle_pipeline, state
        return super().reducer_override(obj)


def _unpickle_pipeline(
    steps: tuple[_Step, ...],
    cpus: int | None,
    deterministic: bool,
    run_dir: str | None,
) -> Pipeline:
    return Pipeline(steps, cpus=cpus, deterministic=deterministic, run_dir=run_dir)


def shard_pipeline(pipeline: Pipeline, count: int, index: int) -> Pipeline:
    """``pipeline`` with a source that keeps element ``i`` only when ``i % count ==
    index``: the stages after it see only this part.

    Raises:
        ConfigError: ``index`` not in ``range(count)``, or ``cache(path)`` in a pipeline
            split into several parts.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"count must be a positive integer, got {count!r}.")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ConfigError(f"index must be an integer in range({count}), got {index!r}.")
    if count == 1:
        return pipeline
    for step in pipeline._steps:
        # Only a cache's step name says where it writes: "cache(memory)" or "cache(PATH)".
        if step.name.startswith("cache(") and step.name != "cache(memory)":
            raise ConfigError(
                f"{step.name} in a pipeline split into {count} parts: every part would "
                "write the same file. Cache in memory (cache()), or pass TorchIterable a "
                "function that builds the pipeline with a path of its rank and worker."
            )
    # A part caches its own elements, not the whole pipeline's: an in-memory cache gets a
    # store of its own, kept in the cache's (so later epochs of the part read it).
    source = pipeline._steps[0]
    steps = [
        _part_cache(step, step.store.setdefault(("part", count, index), {}), source)
        if step.store is not None
        else step
        for step in pipeline._steps
    ]

    def make(run: _Run, stats: StageStats, upstream: Any) -> Stage:
        inner = source.make(run, StageStats(source.name, source.kind), upstream)
        return _Part(inner, stats, count, index)

    whole = source.length
    length = None if whole is None else (lambda _: len(range(index, whole(0), count)))
    name = f"{source.name}[{index}::{count}]"
    identity = (count, index, *source.identity)
    return Pipeline(
        (_Step(name, source.kind, make, length=length, identity=identity), *steps[1:]),
        cpus=pipeline._cpus,
        deterministic=pipeline._deterministic,
        run_dir=pipeline._run_dir,
    )


def _part_cache(step: _Step, store: dict[str, Any], source: _Step) -> _Step:
    def make(run: _Run, stats: StageStats, build: Callable[[], Stage]) -> Stage:
        return Cache(stats, build, store, None, source_digest([source]))

    return _Step(step.name, step.kind, make, rebuilds=True, length=step.length, store=store)


class _Part(Stage):
    """Elements ``index``, ``index + count``, ... of the source below."""

    def __init__(self, source: Stage, stats: StageStats, count: int, index: int) -> None:
        super().__init__(source, stats)
        self.count = count
        self.index = index
        self.position = 0

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            while True:
                element = self.pull()
                if element is _END:
                    raise StopIteration
                position, self.position = self.position, self.position + 1
                if position % self.count == self.index:
                    self.stats.elements += 1
                    return element
        finally:
            self.stats.busy_seconds += time.perf_counter() - started


def rank_and_world_size() -> tuple[int, int]:
    """This rank and the number of ranks: ``RANK``/``WORLD_SIZE``, else an initialised
    torch.distributed, else 0 and 1.

    Raises:
        ConfigError: malformed or inconsistent values.
    """
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
        else:
            rank, world = 0, 1
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"RANK={rank} and WORLD_SIZE={world}: the rank must be in range(WORLD_SIZE); "
            "paralela launch and torchrun set both."
        )
    return rank, world


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ConfigError(f"{name}={value!r} is not a whole number; paralela launch sets it.")
    return int(value)


def _usable_cpus() -> int:
    from paralela.backends import usable_cpus

    return usable_cpus()
