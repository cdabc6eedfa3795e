"""The Spark engine: the same mapper, combiner and reducer as the local engine, on PySpark.

::

    driver                                   executors (Python workers)
    ──────                                   ──────────────────────────
    splits ──sc.parallelize(splits, len)──>  one partition per split
                                             map task: read_split ─record─> mapper ─pairs─>
                                               combiner (a dict of key -> values, squeezed
                                               every COMBINE_EVERY values of a key)
           ──repartitionAndSortWithinPartitions(P, partition_of, keyfunc=order)──>
                                             reduce task: sorted pairs ─groupby key─>
                                               reducer(key, iterator of values) ─> batches
    persist + count() (every reduce task at once, the errors surface here)
    toLocalIterator ──> write_part per partition on the driver (pickle in a temporary
    directory, or JSONL / Parquet under output=) ──> _SUCCESS ──> MapReduceResult

Why not ``reduceByKey`` or ``combineByKey``: they take binary merge functions, while
paralela's combiner and reducer take ``(key, iterator of values)``; adapting them through
lists (``createCombiner=[v]``, ``mergeValue=append``) is what the map task above does, but
in one place where a failure still knows the file and line of the record. The shuffle is
Spark's own: the same stable ``partition_of`` as the local engine (Python's ``hash`` of
``str`` differs between executors) and the same key ``order``, so each partition holds the
same keys in the same order on both engines, and Spark's external sorter spills to disk
when a partition outgrows ``spark.python.worker.memory``.

Errors: a map or reduce task that fails wraps its :class:`UserFunctionError` or
:class:`InputError` (with the user's exception and traceback) in a ``TaskFailed``,
pickled and base64-encoded between markers in the message of the exception it raises.
Spark carries that message to the driver inside a Py4J/JVM error; :func:`_unship` finds
the markers and the driver raises the plain paralela error, as the local engine does,
instead of Spark's 200-line trace.

Functions travel by value when their module is the user's own (a script, ``job.py``, a
test file: not installed), so executors on other machines need not import it; the
driver's ``sys.path`` travels too, for what they import by name.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import itertools
import os
import pickle
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, cast

from paralela.errors import InputError, MapReduceError, UnpicklableError, UserFunctionError
from paralela.mapreduce._result import MapReduceResult, MapReduceSummary

__all__ = ["run_spark"]

#: A key's buffered values on the map side are combined into one every this many values:
#: often enough that a frequent key holds little memory, rarely enough that calling the
#: combiner costs little next to the mapper.
COMBINE_EVERY = 64
#: Distinct keys a map task buffers before it sends them all on (combined): bounds its
#: memory when keys hardly repeat (the combiner then saves little anyway).
MAX_BUFFERED_KEYS = 1 << 18
#: Pairs per batch a reduce task sends to the driver.
BATCH = 4096
#: Partitions per core of the cluster by default, as the local engine's per worker.
PARTITIONS_PER_CORE = 2
_MARK = "PARALELA-TASK-FAILED"
_SHIPPED = re.compile(_MARK + r"\[([A-Za-z0-9+/=]+)\]")


@dataclass(frozen=True)
class SparkJob:
    """The user's functions, pickled once on the driver (see :func:`_payload`)."""

    mapper: Callable[[Any], Any]
    reducer: Callable[[Any, Iterator[Any]], Any]
    combiner: Callable[[Any, Iterator[Any]], Any] | None


def run_spark(
    *,
    mapper: Callable[[Any], Any],
    reducer: Callable[[Any, Iterator[Any]], Any],
    combiner: Callable[[Any, Iterator[Any]], Any] | None,
    splits: list[Any],
    partitions: int | None,
    master: str | None,
    output: str | None,
    output_format: str,
    spark_conf: Mapping[str, str] | None,
) -> MapReduceResult:
    """Run a MapReduce job on Spark (see the module docstring); called by
    :func:`paralela.mapreduce` with ``engine="spark"``.

    ``master``: None runs on the SparkSession already running in this process (left
    running), else on a session started for the job (and stopped after it, however it
    ends) on ``$PARALELA_SPARK_MASTER`` or ``local[*]``. ``partitions``: None gives
    :data:`PARTITIONS_PER_CORE` per core of the cluster (``defaultParallelism``).

    Raises:
        MissingExtraError: pyspark is not installed.
        ConfigError: a session is running with another master or other settings, or
            ``output`` holds other files.
        UnpicklableError: a function cannot be sent to the executors.
        UserFunctionError: the mapper, combiner or reducer raised (the user's exception
            is ``__cause__``; names the file and line, or the key), or the mapper
            yielded something other than a pair.
        InputError: an input cannot be read (names the file and line).
        MapReduceError: Spark failed for another reason (its first line is kept).
    """
    from paralela.mapreduce._output import check_output_dir
    from paralela.mapreduce._spark_session import import_pyspark, spark_context

    started = time.perf_counter()
    import_pyspark()
    payload = _payload(SparkJob(mapper, reducer, combiner))
    out_dir = None if output is None else check_output_dir(output)
    with spark_context(master, spark_conf) as (sc, _started):
        splits = _spread(splits, sc.defaultParallelism)
        summary = MapReduceSummary(
            engine="spark",
            splits=len(splits),
            workers=sc.defaultParallelism,
            plan_seconds=time.perf_counter() - started,
        )
        summary.extra.update(master=sc.master, spark_version=sc.version)
        n = partitions or PARTITIONS_PER_CORE * max(1, sc.defaultParallelism)
        return _run(sc, payload, splits, n, out_dir, output_format, summary, started)


def _run(
    sc: Any,
    payload: bytes,
    splits: list[Any],
    partitions: int,
    out_dir: Path | None,
    output_format: str,
    summary: MapReduceSummary,
    started: float,
) -> MapReduceResult:
    from pyspark import StorageLevel

    from paralela.mapreduce._hashing import order
    from paralela.mapreduce._output import remove_stale_parts, write_success

    path = list(sys.path)
    counters = _Counters(sc)
    mapped = sc.parallelize(splits, max(1, len(splits))).mapPartitions(
        functools.partial(_map_partition, payload, path, counters)
    )
    shuffled = mapped.repartitionAndSortWithinPartitions(
        partitions, functools.partial(_partition_of, partitions), True, order
    )
    reduced = shuffled.mapPartitionsWithIndex(
        functools.partial(_reduce_partition, payload, path), preservesPartitioning=True
    )
    reduced.setName("paralela mapreduce").persist(StorageLevel.MEMORY_AND_DISK)
    temporary = None if out_dir is not None else tempfile.mkdtemp(prefix="paralela-mapreduce-")
    done = False
    try:
        t_job = time.time()
        _spark_call(reduced.count)  # every task runs here; the user's errors surface here
        map_end = counters.map_end.value or t_job
        summary.map_seconds = max(0.0, map_end - t_job)
        summary.reduce_seconds = max(0.0, time.time() - map_end)
        summary.map_tasks, summary.reduce_tasks = len(splits), partitions
        summary.records = counters.records.value
        summary.pairs_emitted = counters.pairs_in.value
        summary.pairs_after_combining = counters.pairs_out.value
        t_write = time.perf_counter()
        parts_dir = out_dir if out_dir is not None else Path(str(temporary))
        fmt = output_format if out_dir is not None else "pickle"
        parts = _spark_call(lambda: _write_parts(reduced, str(parts_dir), fmt))
        summary.extra["write_seconds"] = time.perf_counter() - t_write
        summary.keys = sum(p.pairs for p in parts)
        if out_dir is not None:
            remove_stale_parts(out_dir, [p.path for p in parts])
            write_success(out_dir, parts)
        summary.wall_seconds = time.perf_counter() - started
        done = True
        return MapReduceResult(parts, summary, output=out_dir is not None, cleanup_dir=temporary)
    finally:
        with contextlib.suppress(Exception):  # a stopped context (Ctrl-C) has nothing to free
            reduced.unpersist()
        if temporary is not None and not done:
            shutil.rmtree(temporary, ignore_errors=True)


def _spread(splits: list[Any], cores: int) -> list[Any]:
    """``splits`` planned again into at least ``cores`` splits (a map task per core) when
    there are fewer: they were planned before the session existed, without knowing how
    many cores it has. Only for uncompressed text or JSONL files and Parquet files of one
    format and encoding (any byte range of those reads the same records); CSV (a quoted
    field may span lines), gzip and in-memory records keep their plan.

    Raises:
        InputError: a file is gone or changed since it was planned.
    """
    if not splits or len(splits) >= cores:
        return splits
    kinds = {(s.format, s.encoding) for s in splits}
    if len(kinds) != 1 or any(s.compression or s.path is None for s in splits):
        return splits
    fmt, encoding = kinds.pop()
    if fmt not in ("text", "jsonl", "parquet"):
        return splits
    from paralela.mapreduce._inputs import plan_splits

    paths = list(dict.fromkeys(s.path for s in splits))
    biggest = max(s.size for s in splits)  # within split_bytes, which is not known here
    return list(
        plan_splits(
            paths, format=fmt, split_bytes=max(1, biggest), min_splits=cores, encoding=encoding
        )
    )


def _write_parts(reduced: Any, directory: str, fmt: str) -> list[Any]:
    """Stream the reduce tasks' batches to the driver, one partition at a time, into one
    part file each (every partition sends at least one batch, so empty ones get a file)."""
    from paralela.mapreduce._output import write_part

    parts = []
    stream = reduced.toLocalIterator(prefetchPartitions=True)
    for partition, batches in itertools.groupby(stream, key=itemgetter(0)):
        pairs = itertools.chain.from_iterable(batch for _, batch in batches)
        parts.append(write_part(pairs, directory, partition, fmt))
    return parts


class _Counters:
    """Spark accumulators for the summary. A task Spark runs twice (a retry) may count
    twice; the numbers are those of the tasks' attempts."""

    def __init__(self, sc: Any) -> None:
        from pyspark.accumulators import AccumulatorParam

        class Latest(AccumulatorParam[float]):
            def zero(self, value: float) -> float:
                return 0.0

            def addInPlace(self, a: float, b: float) -> float:
                return max(a, b)

        self.records = sc.accumulator(0)
        self.pairs_in = sc.accumulator(0)
        self.pairs_out = sc.accumulator(0)
        self.map_end = sc.accumulator(0.0, Latest())


def _partition_of(partitions: int, key: Any) -> int:
    from paralela.mapreduce._hashing import partition_of

    return partition_of(key, partitions)


# ── pickling the job ────────────────────────────────────────────────────────────────────


def _user_module(fn: Any) -> Any:
    """The module of ``fn`` when it is the user's own code (not installed, not the
    standard library, not paralela): it travels by value."""
    name = getattr(fn, "__module__", None)
    if not isinstance(name, str) or name == "__main__" or name.split(".")[0] == "paralela":
        return None
    module = sys.modules.get(name)
    filename = getattr(module, "__file__", None)
    if module is None or not filename:
        return None
    path = os.path.realpath(filename)
    installed = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if any(path.startswith(os.path.realpath(p) + os.sep) for p in installed):
        return None
    return module


def _payload(job: SparkJob) -> bytes:
    """``job`` pickled with pyspark's cloudpickle (executors have it): the user's modules
    by value, or, where that fails (a function refers to a module-level object that does
    not pickle), by name, for executors that import them from the driver's ``sys.path``.

    Raises:
        UnpicklableError: a function cannot be pickled either way (names it).
    """
    import pyspark.cloudpickle

    cloudpickle: Any = pyspark.cloudpickle
    modules = {m for fn in (job.mapper, job.reducer, job.combiner) if (m := _user_module(fn))}
    registered = []
    try:
        for module in modules:
            if module.__name__ not in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.register_pickle_by_value(module)
                registered.append(module)
        try:
            return cast(bytes, cloudpickle.dumps(job))
        except Exception:
            if not registered:
                raise
    except Exception:
        pass
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
    for name in ("mapper", "combiner", "reducer"):
        fn = getattr(job, name)
        try:
            cloudpickle.dumps(fn)
        except Exception as exc:
            raise UnpicklableError(
                f"The {name} ({getattr(fn, '__qualname__', type(fn).__name__)}) cannot be "
                f"sent to Spark's executors: {exc}. Define it at module level (or as a "
                "lambda) and let it open files, connections or models itself."
            ) from exc
    return cast(bytes, cloudpickle.dumps(job))


# ── executor side ───────────────────────────────────────────────────────────────────────

_LOADED: dict[bytes, SparkJob] = {}


def _load(payload: bytes, path: list[str]) -> SparkJob:
    """The job, unpickled once per Python worker (pyspark reuses workers), after the
    driver's ``sys.path`` entries that exist here are added (for modules the functions
    import by name)."""
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    job = _LOADED.get(digest)
    if job is None:
        for entry in path:
            if entry not in sys.path and (entry == "" or os.path.isdir(entry)):
                sys.path.append(entry)
        job = pickle.loads(payload)
        _LOADED.clear()
        _LOADED[digest] = job
    return job


class ShippedError(RuntimeError):
    """Raised on an executor to carry a failed task's paralela error to the driver (in its
    message, between markers); never reaches users: see :func:`_unship`."""


def _ship(error: MapReduceError, cause: BaseException | None) -> ShippedError:
    from paralela.mapreduce._tasks import _failed

    failed = _failed(error, cause)
    blob = base64.b64encode(pickle.dumps(failed)).decode("ascii")
    return ShippedError(f"{str(error).splitlines()[0][:300]} {_MARK}[{blob}]")


def _unship(exc: BaseException) -> Any:
    """The ``TaskFailed`` a task shipped inside Spark's error ``exc``, or None."""
    try:
        text = str(exc)
    except Exception:
        return None
    found = _SHIPPED.search(text)
    if found is None:
        return None
    try:
        return pickle.loads(base64.b64decode(found.group(1)))
    except Exception:
        return None


def _spark_call(call: Callable[[], Any]) -> Any:
    """``call()``, with a task's shipped error raised as paralela's, and Spark's other
    failures as a :class:`MapReduceError` that keeps their first lines."""
    from paralela.mapreduce._tasks import reraise

    try:
        return call()
    except (MapReduceError, KeyboardInterrupt):
        raise
    except Exception as exc:
        failed = _unship(exc)
        if failed is not None:
            raise reraise(failed)  # noqa: B904  (its __cause__ is the user's exception)
        raise MapReduceError(_spark_failure(exc)) from exc


def _spark_failure(exc: BaseException) -> str:
    text = str(exc)
    if "No module named 'paralela'" in text:
        return (
            "Spark's executors cannot import paralela: they run another Python than this "
            "one. Install paralela there, or set PYSPARK_PYTHON (or spark.pyspark.python "
            "in spark_conf=) to a Python that has it."
        )
    reason = next(
        (line.strip() for line in text.splitlines() if "Exception" in line or "Error" in line),
        text.strip().splitlines()[0] if text.strip() else type(exc).__name__,
    )
    return f"The Spark job failed: {reason[:800]}"


def _map_partition(
    payload: bytes, path: list[str], counters: _Counters, splits: Iterable[Any]
) -> Iterator[tuple[Any, Any]]:
    """A map task: every split of this partition (one) through the mapper and combiner."""
    job = _load(payload, path)
    for split in splits:
        yield from _map_split(job, split, counters)
    counters.map_end.add(time.time())


def _map_split(job: SparkJob, split: Any, counters: _Counters) -> Iterator[tuple[Any, Any]]:
    """One split through the mapper (and the combiner); the errors as the local engine's
    map task words them (:mod:`._tasks`), shipped to the driver."""
    from paralela.mapreduce._inputs import locate, read_split

    mapper, combiner = job.mapper, job.combiner
    pair: Any = None
    index = -1
    records = 0
    record: Any = None
    pairs_in = pairs_out = 0
    buffer: dict[Any, list[Any]] = {}
    try:
        for index, record in enumerate(read_split(split)):  # noqa: B007
            out = mapper(record)
            if isinstance(out, Mapping):
                out = out.items()
            for pair in _iterate(out):
                pairs_in += 1
                if type(pair) is not tuple or len(pair) != 2:
                    pair = _as_pair(pair)
                if combiner is None:
                    hash(pair[0])  # an unhashable key: TypeError, reported by _as_pair
                    pairs_out += 1
                    yield pair
                    continue
                key, value = pair
                values = buffer.get(key)
                if values is None:
                    buffer[key] = [value]
                    if len(buffer) > MAX_BUFFERED_KEYS:
                        for item in _drain(buffer, combiner):
                            pairs_out += 1
                            yield item
                elif len(values) < COMBINE_EVERY:
                    values.append(value)
                else:
                    values.append(value)
                    buffer[key] = [_combine(combiner, key, values)]
        records = index + 1
        index = -2  # past the last record: only the combiner runs below
        for item in _drain(buffer, combiner):
            pairs_out += 1
            yield item
    except ShippedError:
        raise
    except InputError as exc:
        raise _ship(exc, exc.__cause__) from None
    except UserFunctionError as exc:  # a bad pair, or the combiner raised
        if exc.function == "combiner" or index < 0:  # no record to blame: say which split
            error = UserFunctionError(
                f"{exc}\n  in the map task of {split.describe()}",
                function=exc.function,
                where=exc.where,
            )
        else:
            error = _with_record(exc, locate(split, index), record)
        raise _ship(error, exc.__cause__) from None
    except TypeError as exc:
        problem = _unhashable(exc, pair if index >= 0 else None)
        if problem is not None:
            raise _ship(_with_record(problem, locate(split, index), record), None) from None
        raise _ship(_mapper_error(exc, split, index, record), exc) from None
    except Exception as exc:
        raise _ship(_mapper_error(exc, split, index, record), exc) from None
    counters.records.add(records)
    counters.pairs_in.add(pairs_in)
    counters.pairs_out.add(pairs_out)


def _iterate(out: Any) -> Iterator[Any]:
    """The mapper's pairs; a mapper that returned something not iterable is an error."""
    try:
        return iter(out)
    except TypeError:
        raise UserFunctionError(
            f"The mapper returned {_short(out)} (type {type(out).__name__}), which is not "
            "iterable; a mapper yields (key, value) pairs or returns a list of them.",
            function="mapper",
        ) from None


def _as_pair(item: Any) -> tuple[Any, Any]:
    """``item`` as a ``(key, value)`` tuple (a 2-list is one, as in the local engine)."""
    problem = _pair_problem(item)
    if problem is not None:
        raise UserFunctionError(problem, function="mapper")
    return item[0], item[1]


def _unhashable(exc: TypeError, pair: Any) -> UserFunctionError | None:
    """The error for a pair with an unhashable key (``exc`` raised hashing it), or None
    when ``exc`` came from elsewhere (the mapper)."""
    if pair is None or "unhashable" not in str(exc) or exc.__traceback__ is None:
        return None
    if exc.__traceback__.tb_next is not None:  # raised deeper: in the user's code
        return None
    problem = _pair_problem(pair)
    return None if problem is None else UserFunctionError(problem, function="mapper")


# The local engine's wording (paralela.mapreduce._spill and _merge), kept in step by
# tests/test_mapreduce_spark.py, which compares the errors of both engines.


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 200 else text[:197] + "..."


def _pair_problem(item: Any) -> str | None:
    """Why ``item`` is not a usable pair, or None when it is one."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        kind = type(item).__name__
        length = f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""
        return (
            f"The mapper yielded {_short(item)} (a {kind}{length}), not a (key, value) "
            "pair; a mapper yields 2-tuples, e.g. `yield word, 1`, or returns a list of them."
        )
    try:
        hash(item[0])
    except TypeError:
        return (
            f"The mapper yielded a pair whose key {_short(item[0])} is unhashable (type "
            f"{type(item[0]).__name__}); keys must be hashable: use a tuple instead of a "
            "list, a frozenset instead of a set."
        )
    return None


def _mapper_error(exc: BaseException, split: Any, index: int, record: Any) -> UserFunctionError:
    from paralela.mapreduce._inputs import locate

    if index == -1:  # raised before the first record: reading the split failed
        where = split.describe()
        return UserFunctionError(
            f"Reading {where} failed: {type(exc).__name__}: {exc}", function="mapper", where=where
        )
    where = locate(split, index) if index >= 0 else split.describe()
    return UserFunctionError(
        f"The mapper raised {type(exc).__name__}: {exc}\n  at {where}, record "
        f"{_short_record(record)}",
        function="mapper",
        where=where,
    )


def _with_record(exc: UserFunctionError, where: str, record: Any) -> UserFunctionError:
    return UserFunctionError(
        f"{exc}\n  at {where}, record {_short_record(record)}",
        function=exc.function,
        where=where,
    )


def _short_record(record: Any) -> str:
    from paralela.mapping._task import short_repr

    return short_repr(record, 200)


def _combine(combiner: Callable[[Any, Iterator[Any]], Any], key: Any, values: list[Any]) -> Any:
    try:
        return combiner(key, iter(values))
    except Exception as exc:
        raise UserFunctionError(
            f"The combiner raised {type(exc).__name__}: {exc}\n  for key {_short(key)} "
            f"(over {len(values)} values)",
            function="combiner",
            where=repr(key)[:200],
        ) from exc


def _drain(
    buffer: dict[Any, list[Any]], combiner: Callable[[Any, Iterator[Any]], Any] | None
) -> Iterator[tuple[Any, Any]]:
    """Every buffered key with its values combined into one, the buffer emptied."""
    if combiner is None:
        return
    items = list(buffer.items())
    buffer.clear()
    for key, values in items:
        yield key, (values[0] if len(values) == 1 else _combine(combiner, key, values))


def _reduce_partition(
    payload: bytes, path: list[str], partition: int, pairs: Iterable[tuple[Any, Any]]
) -> Iterator[tuple[int, list[tuple[Any, Any]]]]:
    """A reduce task: the partition's pairs, sorted by key order, grouped by key, each
    group through the reducer; sent on in batches of :data:`BATCH` pairs."""
    from paralela.mapreduce._hashing import order

    reducer = _load(payload, path).reducer
    batch: list[tuple[Any, Any]] = []
    key: Any = None
    second = itemgetter(1)
    try:
        for _, group in itertools.groupby(pairs, key=lambda kv: order(kv[0])):
            key, first = next(group)
            values = itertools.chain((first,), map(second, group))  # noqa: B031  (once)
            batch.append((key, reducer(key, values)))
            if len(batch) >= BATCH:
                yield partition, batch
                batch = []
    except Exception as exc:
        raise _ship(_reducer_error(exc, key), exc) from None
    yield partition, batch


def _reducer_error(exc: BaseException, key: Any) -> UserFunctionError:
    return UserFunctionError(
        f"The reducer raised {type(exc).__name__}: {exc}\n  for key {_short(key)}",
        function="reducer",
        where=repr(key)[:200],
    )
