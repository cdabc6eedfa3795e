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
Spark carries that message to the driver inside a Py4J/JVM error; ``unship`` finds
the markers and the driver raises the plain paralela error, as the local engine does,
instead of Spark's 200-line trace.

Functions travel by value when their module is the user's own (a script, ``job.py``, a
test file: not installed), so executors on other machines need not import it; the
driver's ``sys.path`` travels too, for what they import by name. The executors' side
(the map and reduce tasks, the errors' wording and shipping) is :mod:`._spark_tasks`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any, cast

from paralela.errors import MapReduceError, UnpicklableError
from paralela.mapreduce._pickling import spark_unpicklable_error
from paralela.mapreduce._result import MapReduceResult, MapReduceSummary
from paralela.mapreduce._spark_tasks import (
    Counters,
    SparkJob,
    map_partition,
    partition_of_key,
    reduce_partition,
    unship,
)

__all__ = ["run_spark"]

#: Partitions per core of the cluster by default, as the local engine's per worker.
PARTITIONS_PER_CORE = 2
#: How a Python worker's failure to pickle a pair reads in Spark's error.
_PICKLING = re.compile(r"PicklingError|[Cc]an(no|')t pickle|not picklable")


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
        diagnose = functools.partial(spark_unpicklable_error, mapper, splits)
        return _run(sc, payload, splits, n, out_dir, output_format, summary, started, diagnose)


def _run(
    sc: Any,
    payload: bytes,
    splits: list[Any],
    partitions: int,
    out_dir: Path | None,
    output_format: str,
    summary: MapReduceSummary,
    started: float,
    diagnose: Callable[[], MapReduceError | None],
) -> MapReduceResult:
    from pyspark import StorageLevel

    from paralela.mapreduce._hashing import order
    from paralela.mapreduce._output import claim_output_dir, remove_stale_parts, write_success

    path = list(sys.path)
    counters = Counters(sc)
    mapped = sc.parallelize(splits, max(1, len(splits))).mapPartitions(
        functools.partial(map_partition, payload, path, counters)
    )
    shuffled = mapped.repartitionAndSortWithinPartitions(
        partitions, functools.partial(partition_of_key, partitions), True, order
    )
    reduced = shuffled.mapPartitionsWithIndex(
        functools.partial(reduce_partition, payload, path), preservesPartitioning=True
    )
    reduced.setName("paralela mapreduce").persist(StorageLevel.MEMORY_AND_DISK)
    temporary = None if out_dir is not None else tempfile.mkdtemp(prefix="paralela-mapreduce-")
    done = False
    try:
        t_job = time.time()
        _spark_call(reduced.count, diagnose)  # every task runs here; so do the user's errors
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
        if out_dir is not None:  # lists the parts as paralela's before the first is written
            claim_output_dir(out_dir, partitions, fmt)
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
    from paralela.files import plan_splits

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


def _spark_call(
    call: Callable[[], Any], diagnose: Callable[[], MapReduceError | None] | None = None
) -> Any:
    """``call()``, with a task's shipped error raised as paralela's, and Spark's other
    failures as a :class:`MapReduceError` that keeps their first lines; a failure to
    pickle what the mapper yielded (Spark pickles the pairs, out of the task's reach) as
    ``diagnose()`` names it, when it finds the record."""
    try:
        return call()
    except (MapReduceError, KeyboardInterrupt):
        raise
    except Exception as exc:
        failed = unship(exc)
        if failed is not None:
            raise failed.reraise()  # noqa: B904  (its __cause__ is the user's exception)
        found = diagnose() if diagnose is not None and _PICKLING.search(str(exc)) else None
        if found is not None:
            raise found from found.__cause__
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
