"""``paralela.data.Pipeline``: an input pipeline described once, run by a plain ``for``.

::

    Pipeline.from_files("shards/*.rec")                     a step per method; nothing runs
      .interleave(read_records, cycle_length=4)             until iterated
      .map(decode, kind="process")                          workers="auto": tuned
      .shuffle(1000, seed=0).batch(32).prefetch(2)
    for batch in pipeline:  ──> PipelineIterator: builds the stages (threads, processes),
                                hands out elements, measures the consumer's stall;
                                break / an exception / Ctrl-C / the end ──> close(): every
                                thread and process of the run stops
    pipeline.stats()        ──> PipelineStats of the last run (str(): the bottleneck)

Each iteration is a new run; a pipeline object can be iterated again (a new epoch) as
long as its source can (a list, files, ``range``; not a one-shot generator). Runs are
counted as epochs (:meth:`Pipeline.set_epoch` sets the next one): a seeded ``shuffle``
draws a new order every epoch, the same sequence of orders in every program run.
"""

from __future__ import annotations

import glob
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

from paralela.data._cache import RUN_COLLATE, Cache, SourceId, file_identity, source_digest
from paralela.data._inline import Batch, Filter, Repeat, Shuffle, Source, Take
from paralela.data._parallel import Interleave, Map, Prefetch, Stage
from paralela.data._run import PipelineIterator, _Run, _Step
from paralela.data._stats import PipelineStats, StageStats
from paralela.errors import ConfigError

__all__ = ["Pipeline", "PipelineIterator"]

#: Threads a stage may tune up to per CPU: threads that wait on I/O use little CPU (the
#: tuner counts what they do use), so an I/O stage needs many to hide its latency.
THREADS_PER_CPU = 8
MAX_THREADS = 64


class Pipeline:
    """An input pipeline. Build it with the ``from_*`` class methods and chain stages;
    iterate it with ``for``. See the module docstring and ``docs/data.md``."""

    def __init__(
        self,
        steps: tuple[_Step, ...],
        *,
        cpus: int | None = None,
        deterministic: bool = True,
        run_dir: str | None = None,
    ) -> None:
        self._steps = steps
        self._cpus = cpus
        self._deterministic = deterministic
        self._run_dir = run_dir
        # The last run: weakly, so that leaving a loop collects (and closes) its iterator;
        # its stats are kept when it closes.
        self._last: weakref.ref[PipelineIterator] | None = None
        self._last_stats: PipelineStats | None = None
        self._epoch = 0  # of the next run

    # -- sources ------------------------------------------------------------------

    @classmethod
    def from_iterable(cls, iterable: Iterable[Any]) -> Pipeline:
        """The elements of ``iterable``. A one-shot iterator (a generator) runs once."""
        name = f"from_iterable({type(iterable).__name__})"
        sized = isinstance(iterable, Sized) and not isinstance(iterable, Iterator)
        return cls(
            (
                _Step(
                    name,
                    "inline",
                    lambda run, stats, _: Source(stats, lambda: iterable),
                    length=(lambda _: len(iterable)) if sized else None,  # type: ignore[arg-type]
                    identity=(SourceId("iterable", iterable),),
                ),
            )
        )

    @classmethod
    def from_files(
        cls, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    ) -> Pipeline:
        """The paths of files, sorted: a glob (``"shards/*.rec"``), a directory (its files,
        skipping hidden ones), a file, or a list of these.

        Raises:
            ConfigError: a pattern or path matches no file.
        """
        files = _expand(paths)
        return cls(
            (
                _Step(
                    f"from_files({len(files)} files)",
                    "inline",
                    lambda run, stats, _: Source(stats, lambda: files),
                    length=lambda _: len(files),
                    identity=(SourceId("files", files),),
                ),
            )
        )

    @classmethod
    def from_map_style(
        cls, dataset: Any, *, workers: int | str = "auto", kind: str = "thread"
    ) -> Pipeline:
        """``dataset[0]``, ``dataset[1]``... up to ``len(dataset)`` (a map-style dataset,
        as torch's), read ``workers`` at a time."""
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(
                f"from_map_style needs a dataset with __len__ and __getitem__; got "
                f"{type(dataset).__name__}. Use from_iterable for an iterable."
            )
        return cls.from_iterable(range(len(dataset))).map(
            dataset.__getitem__, workers=workers, kind=kind
        )

    # -- stages -------------------------------------------------------------------

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        workers: int | str = "auto",
        kind: str = "thread",
        deterministic: bool | None = None,
    ) -> Pipeline:
        """``fn`` over every element, in parallel.

        Args:
            fn: a function of one element. For ``kind="process"`` it is pickled
                (cloudpickle: lambdas and closures work) and numpy arrays travel through
                shared memory.
            workers: ``"auto"`` (tuned at run time within the CPU budget) or a number.
            kind: ``"thread"`` for I/O and code that releases the GIL (numpy, torch,
                decoders in C), ``"process"`` for pure-Python CPU work.
            deterministic: hand elements out in input order (default: the pipeline's).
        """
        if kind not in ("thread", "process"):
            raise ConfigError(f"kind must be 'thread' or 'process', got {kind!r}.")
        fixed = _workers(workers)
        name = f"map({_name(fn)})"

        def make(run: _Run, stats: StageStats, upstream: Stage) -> Stage:
            cpus = run.tuner.cpus
            maximum = cpus if kind == "process" else min(MAX_THREADS, THREADS_PER_CPU * cpus)
            order = run.deterministic if deterministic is None else deterministic
            return Map(
                upstream,
                stats,
                fn,
                workers=fixed,
                kind=kind,
                deterministic=order,
                tuner=run.tuner,
                maximum=maximum,
            )

        return self._then(_Step(name, kind, make, length=_same, identity=(fn,)))

    def interleave(
        self,
        fn: Callable[[Any], Iterable[Any]],
        *,
        cycle_length: int = 4,
        block_length: int = 1,
        parallel: bool = True,
        deterministic: bool | None = None,
    ) -> Pipeline:
        """Open ``fn(element)`` (an iterable: a file's records) for ``cycle_length``
        elements at once and hand out ``block_length`` records of each in turn, as
        tf.data's ``interleave``; ``parallel``: each read ahead by a thread of its own
        (I/O-bound sources)."""
        length = _positive("cycle_length", cycle_length)
        block = _positive("block_length", block_length)

        def make(run: _Run, stats: StageStats, upstream: Stage) -> Stage:
            order = run.deterministic if deterministic is None else deterministic
            return Interleave(
                upstream,
                stats,
                fn,
                cycle_length=length,
                block_length=block,
                parallel=parallel,
                deterministic=order,
            )

        kind = "thread" if parallel else "inline"
        name = f"interleave({_name(fn)}, {length})"
        identity = (fn, length, block, deterministic)
        return self._then(_Step(name, kind, make, identity=identity))

    def filter(self, predicate: Callable[[Any], Any]) -> Pipeline:
        """The elements for which ``predicate`` is true."""
        return self._then(
            _Step(
                f"filter({_name(predicate)})",
                "inline",
                lambda run, stats, up: Filter(up, stats, predicate),
                identity=(predicate,),
            )
        )

    def shuffle(self, buffer: int, *, seed: int | None = 0) -> Pipeline:
        """Shuffle through a buffer of ``buffer`` elements, in a new order every epoch
        (each run of the pipeline, each pass of a ``repeat`` after it), as tf.data's
        ``reshuffle_each_iteration``. ``seed`` fixes the sequence of orders: epoch ``e``
        of a pipeline shuffles the same way in every program run (see :meth:`set_epoch`);
        ``None``: different orders in every program run too."""
        size = _positive("buffer", buffer)

        def make(run: _Run, stats: StageStats, upstream: Stage) -> Stage:
            pass_ = run.pass_of(stats)
            # A string seeds Random the same way in every process (no hash randomisation).
            drawn = None if seed is None else f"paralela.shuffle:{seed}:{run.epoch}:{pass_}"
            return Shuffle(upstream, stats, size, drawn)

        return self._then(
            _Step(f"shuffle({size})", "inline", make, length=_same, identity=(size, seed))
        )

    def batch(
        self,
        size: int,
        *,
        drop_last: bool = False,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> Pipeline:
        """Groups of ``size`` elements, made one by ``collate`` (default: stacked tensors
        or arrays, tuples and dicts field by field, else a list; under
        :class:`TorchIterable`, torch's ``default_collate``, as a DataLoader batches)."""
        n = _positive("size", size)
        return self._then(
            _Step(
                f"batch({n})",
                "inline",
                lambda run, stats, up: Batch(up, stats, n, drop_last, collate or run.collate),
                length=(lambda m: m // n) if drop_last else (lambda m: -(-m // n)),
                identity=(n, drop_last, collate or RUN_COLLATE),
            )
        )

    def prefetch(self, n: int = 2) -> Pipeline:
        """Keep the next ``n`` elements ready, made by a thread beside the consumer."""
        size = _positive("n", n)
        return self._then(
            _Step(
                f"prefetch({size})",
                "thread",
                lambda run, stats, up: Prefetch(up, stats, size),
                length=_same,
            )
        )

    def take(self, count: int) -> Pipeline:
        """The first ``count`` elements."""
        n = _positive("count", count, minimum=0)
        return self._then(
            _Step(
                f"take({n})",
                "inline",
                lambda run, stats, up: Take(up, stats, n),
                length=lambda m: min(m, n),
                identity=(n,),
            )
        )

    def repeat(self, count: int | None = None) -> Pipeline:
        """Run everything above ``count`` times (None: forever), each run anew."""
        n = None if count is None else _positive("count", count)
        return self._then(
            _Step(
                f"repeat({n})",
                "inline",
                lambda run, stats, build: Repeat(stats, build, n),
                rebuilds=True,
                length=None if n is None else (lambda m: m * n),
                identity=(n,),
            )
        )

    def cache(
        self, path: str | os.PathLike[str] | None = None, *, fingerprint: str | None = None
    ) -> Pipeline:
        """Keep the elements of the first complete run (in memory, or in the file
        ``path``); later runs, and epochs under ``repeat``, read them instead.

        A cache never gives the elements of other stages or another source. A cache file
        records the fingerprint of the steps above it and of the source (map's
        fingerprints: functions by their code and what they read, parameters by value,
        a list by its elements, files by path, size and modification time, a generator
        by its code and arguments); a file made by other steps or another source is
        refused, naming what changed, and left as it is: delete it to rebuild it. A cache
        in memory belongs to this step (not to pipelines built from the same base) and is
        filled anew when the source's elements changed (a list that grew).

        Args:
            path: the cache file (default: in memory). A file that paralela did not
                write is neither read nor replaced.
            fingerprint: the cache file's identity, in place of the computed one: a key
                of your own, to change when the source or the stages change (needed for
                a source that cannot be identified before it runs, e.g. ``iter(...)``).

        Raises:
            ConfigError: (when iterated) ``path`` is not a paralela cache file, or the
                source cannot be identified and no ``fingerprint`` was given.
            FingerprintMismatchError: (when iterated) ``path`` holds the elements of
                other steps or another source.
        """
        where = None if path is None else os.fspath(path)
        if fingerprint is not None and (where is None or not isinstance(fingerprint, str)):
            raise ConfigError(
                "fingerprint= names a cache file's contents: pass it as a string with a "
                f"path (cache(path, fingerprint='v1')); got {fingerprint!r}"
                + (" without a path." if where is None else ".")
            )
        above = self._steps
        store: dict[Any, Any] = {}

        def make(run: _Run, stats: StageStats, build: Callable[[], Stage]) -> Stage:
            identity = run.identities.get(id(stats))
            if identity is None:  # once a run: repeat passes read the same
                identity = run.identities[id(stats)] = (
                    source_digest(above)
                    if where is None
                    else file_identity(above, run, fingerprint)
                )
            return Cache(stats, build, store, where, identity)

        name = f"cache({where or 'memory'})"
        return self._then(_Step(name, "inline", make, rebuilds=True, length=_same, store=store))

    def with_options(
        self,
        *,
        cpus: int | None = None,
        deterministic: bool | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> Pipeline:
        """The same pipeline with other options.

        Args:
            cpus: the CPU budget of ``workers="auto"`` (default: the CPUs this process
                may use: its affinity and cgroup quota, as a Slurm job's allocation).
            deterministic: False hands elements out as they are ready.
            run_dir: each run writes its stats there (``pipeline.json``) when it ends,
                for ``paralela report``.
        """
        if cpus is not None:
            _positive("cpus", cpus)
        return Pipeline(
            self._steps,
            cpus=cpus if cpus is not None else self._cpus,
            deterministic=self._deterministic if deterministic is None else deterministic,
            run_dir=os.fspath(run_dir) if run_dir is not None else self._run_dir,
        )

    # -- running ------------------------------------------------------------------

    def __iter__(self) -> PipelineIterator:
        epoch, self._epoch = self._epoch, self._epoch + 1
        iterator = PipelineIterator(self, epoch=epoch)
        self._last = weakref.ref(iterator)
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next run (later runs count on from it), as
        ``DistributedSampler.set_epoch``: a seeded ``shuffle`` draws epoch ``e``'s order
        the same way in every program run, so a resumed training sees the orders it would
        have seen. Without it, the runs of this pipeline object count from 0."""
        self._epoch = _positive("epoch", epoch, minimum=0)

    def length(self) -> int:
        """How many elements a run gives, from the source's ``len()`` through the steps.

        Raises:
            TypeError: not known before running: a source without ``len()`` (a
                generator), a ``filter`` or ``interleave``, or ``repeat()`` forever.
        """
        n = 0
        for step in self._steps:
            if step.length is None:
                why = "repeats forever" if step.name == "repeat(None)" else "has no known length"
                raise TypeError(
                    f"{self!r} gives an unknown number of elements: {step.name} {why}. "
                    "Lengths are known through map, shuffle, batch, take, repeat(n), cache "
                    "and prefetch from a source with len() (a list, range, files)."
                )
            n = step.length(n)
        return n

    def stats(self) -> PipelineStats:
        """The counters of the last (or current) run.

        Raises:
            ConfigError: the pipeline was never iterated.
        """
        running = self._last() if self._last is not None else None
        if running is not None:
            return running.stats()
        if self._last_stats is None:
            raise ConfigError("stats() describes a run: iterate the pipeline first.")
        return self._last_stats

    def __getstate__(self) -> dict[str, Any]:
        """A pipeline travels (to spawned DataLoader workers, to processes) without its
        last run, which belongs to the process that ran it."""
        state = self.__dict__.copy()
        state["_last"] = None
        return state

    def __repr__(self) -> str:
        return "Pipeline(" + " | ".join(s.name for s in self._steps) + ")"

    def _then(self, step: _Step) -> Pipeline:
        return Pipeline(
            (*self._steps, step),
            cpus=self._cpus,
            deterministic=self._deterministic,
            run_dir=self._run_dir,
        )

    def _build(self, run: _Run, count: int | None = None) -> Stage:
        """The stages of the first ``count`` steps (all). A step that rebuilds (repeat,
        cache) builds the steps above it itself, when it needs them: they are not built
        here (a cache that is read never starts their threads and processes)."""
        steps = self._steps if count is None else self._steps[:count]
        start = max((i for i, step in enumerate(steps) if step.rebuilds), default=0)
        stage: Any = None
        for index in range(start, len(steps)):
            step = steps[index]
            stats = run.stage_stats(index, step.name, step.kind)
            if step.rebuilds:
                stage = step.make(run, stats, lambda i=index: self._build(run, i))
            else:
                stage = step.make(run, stats, stage)
        assert stage is not None
        return stage  # type: ignore[no-any-return]


def _expand(paths: Any) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[str] = []
    for item in items:
        text = os.fspath(item)
        if os.path.isdir(text):
            found = sorted(
                os.path.join(text, n)
                for n in os.listdir(text)
                if not n.startswith(".") and os.path.isfile(os.path.join(text, n))
            )
        elif any(c in text for c in "*?["):
            found = sorted(glob.glob(text))
        else:
            found = [text] if os.path.isfile(text) else []
        if not found:
            raise ConfigError(f"from_files: {text!r} matches no file; check the path or pattern.")
        files.extend(found)
    return files


def _same(n: int) -> int:
    return n


def _name(fn: Any) -> str:
    return str(
        getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    )


def _workers(workers: int | str) -> int | None:
    if workers == "auto":
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be 'auto' or a positive integer, got {workers!r}.")
    return workers


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer of at least {minimum}, got {value!r}.")
    return value
