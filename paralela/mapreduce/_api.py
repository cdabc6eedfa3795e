"""``paralela.mapreduce``: map, combine, shuffle by key, reduce; on local processes, on
Slurm, or on Apache Spark.

The Spark engine (``engine="spark"``) lives in ``paralela/mapreduce/_spark.py`` and is
imported only when asked for. This module calls it as::

    from paralela.mapreduce._spark import run_spark
    return run_spark(
        mapper=mapper,            # the user's functions, unchanged
        reducer=reducer,
        combiner=combiner,        # None: no map-side combining
        splits=splits,            # list[Split] from _inputs.plan_splits (already planned)
        partitions=partitions,    # int, or None: the Spark engine's own default
        master=master,            # None: "local[*]"; "spark://host:7077", "yarn", ...
        output=output,            # None, or the output directory as a str
        output_format=output_format,  # "jsonl" | "parquet" (used when output is given)
        spark_conf=spark_conf,    # dict[str, str] of extra Spark settings, or None
    )  # -> MapReduceResult (summary.engine == "spark")
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from paralela._config import UNSET, resolve
from paralela.backends import Backend
from paralela.errors import ConfigError
from paralela.files import check_mode, parse_size
from paralela.mapreduce._output import FORMATS
from paralela.mapreduce._result import MapReduceResult, MapReduceSummary

__all__ = ["DEFAULT_MEMORY_SHARE", "ENGINES", "mapreduce", "parse_size"]

ENGINES = ("local", "spark")
#: The default ``memory_limit``: this share of the allocation's memory (the cgroup limit,
#: else the node's total, as ``paralela info`` shows it), divided among the workers. A
#: quarter leaves room for the Python objects behind the buffer's estimate, the reduce
#: side and everything else running here.
DEFAULT_MEMORY_SHARE = 0.25
#: The default on backends whose tasks run on other hosts (Slurm): per map task.
DEFAULT_REMOTE_MEMORY = 512 << 20
#: No buffer smaller than this: below it, spill files multiply for no saving.
MIN_MEMORY_LIMIT = 1 << 20
#: Partitions per worker by default: two, so that a worker done with its first partition
#: takes a second while a slow one (a partition holding a very frequent key) finishes,
#: and there are still few output files.
PARTITIONS_PER_WORKER = 2
#: Splits per worker at least, where the input allows (files are cut finer than
#: ``split_bytes`` to get them): with one split per worker, 3 equal files on 2 workers
#: leave a worker idle a third of the time; with two, it is 6 splits, 3 each. More cost
#: a little: each map task writes its own combined pairs (a 50 MB Zipf word count: 4 splits
#: 1.69 s, 8 splits 1.81 s, on 2 workers).
SPLITS_PER_WORKER = 2


def default_memory_limit(workers: int) -> int:
    """:data:`DEFAULT_MEMORY_SHARE` of this allocation's memory, divided among ``workers``."""
    from paralela.resources import detect_memory

    share = int(detect_memory().limit * DEFAULT_MEMORY_SHARE) // max(1, workers)
    return max(MIN_MEMORY_LIMIT, share)


def _commands(
    mapper: Any, reducer: Any, combiner: Any, batched: Any, engine: str
) -> tuple[Any, Any, Any, Any]:
    """The functions, with command lines (``str``) made into Hadoop Streaming commands
    (see ``_streaming``): a mapper command maps whole batches of lines, a combiner
    command runs on each batch's output, a reducer command reduces whole partitions.

    Raises:
        ConfigError: a command on Spark, a combiner command without a mapper command, a
            command that cannot be split or whose program is not found.
    """
    if not any(isinstance(fn, str) for fn in (mapper, reducer, combiner)):
        return mapper, reducer, combiner, batched
    if engine == "spark":
        raise ConfigError(
            "Commands as mapper, combiner or reducer run on the local engine; on Spark, "
            "give Python functions."
        )
    from paralela.mapreduce._streaming import Command, CommandMapper, CommandReducer

    if isinstance(combiner, str) and not isinstance(mapper, str):
        raise ConfigError(
            "A combiner command runs on a mapper command's output; with a Python mapper, "
            "give the combiner as a function combiner(key, values)."
        )
    if isinstance(mapper, str):
        command_combiner = None
        if isinstance(combiner, str):
            command_combiner, combiner = Command(combiner, "combiner"), None
        mapper, batched = CommandMapper(Command(mapper, "mapper"), command_combiner), True
    if isinstance(reducer, str):
        reducer = CommandReducer(Command(reducer, "reducer"))
    return mapper, reducer, combiner, batched


def _check_function(name: str, fn: Any, optional: bool = False) -> None:
    if fn is None and optional:
        return
    if not callable(fn):
        raise ConfigError(
            f"{name} must be a function (or a command line, a str), got "
            f"{type(fn).__name__}; see docs/mapreduce.md for what it takes and returns."
        )


def _check_partitions(partitions: Any) -> int | None:
    if partitions is None:
        return None
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be a positive integer or None, got {partitions!r}.")
    return partitions


def mapreduce(
    mapper: Callable[[Any], Any] | str,
    reducer: Callable[[Any, Iterator[Any]], Any] | str,
    inputs: Any,
    *,
    combiner: Callable[[Any, Iterator[Any]], Any] | str | None = None,
    partitions: int | None = None,
    engine: str = "local",
    workers: int | Any | None = UNSET,
    backend: str | Backend | Any = UNSET,
    memory_limit: int | str | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str] | None = None,
    output_format: str = "jsonl",
    mode: str = "errorifexists",
    input_format: str | None = None,
    encoding: str = "utf-8",
    split_bytes: int | str = 64 << 20,
    records_per_split: int = 10_000,
    retries: int | Any = UNSET,
    progress: bool | Any | None = UNSET,
    backend_options: Mapping[str, Any] | None = None,
    master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    batched: bool = False,
) -> MapReduceResult:
    """Run a MapReduce job: ``mapper`` over every input record, pairs grouped by key,
    ``reducer`` over each key's values.

    Args:
        mapper: ``mapper(record)`` yields ``(key, value)`` pairs, or returns an iterable
            of pairs (a list, a generator), or a mapping (its items are the pairs).
            A record is a line of a text file (without its newline), a parsed JSON
            object of a JSONL file, a dict per CSV or Parquet row, or an item of an
            iterable input. Keys must be hashable and picklable; keys equal under
            ``==`` are one key (``1``, ``1.0``, ``True``), and types may be mixed.
            The first record decides how results are read: a mapping first means
            mappings (their items) from every record. A ``str`` is a command line
            run as Hadoop Streaming runs its mapper (lines on stdin, ``key<TAB>value``
            lines out); so for ``reducer`` and ``combiner`` (docs/mapreduce.md).
        reducer: ``reducer(key, values)`` returns the value for ``key``; ``values`` is
            an iterator, streamed from the spill files (never all in memory).
        inputs: a path, glob (``"corpus/*.txt"``), directory, a list of those, or any
            iterable of records. Text (``.txt``, gzip), JSONL, CSV and Parquet files;
            a large file is split by byte ranges on line boundaries.
        combiner: ``combiner(key, values)`` -> one value, applied on the map side to
            each key's values before they are written (and again as spills merge).
            It must give the same result however values are grouped: a sum, a max, a
            set union. Often the reducer itself.
        partitions: reduce tasks, each writing one part; default 2 x workers.
        engine: ``"local"`` (processes, threads, sequential, Slurm) or ``"spark"``.
        workers: workers of the backend (default: the CPUs this process may use).
        backend: ``"processes"`` (default), ``"threads"``, ``"sequential"`` (a plain
            loop, pdb works), ``"slurm"`` (array jobs; needs ``run_dir``), or a Backend.
        memory_limit: the map-side buffer of each map task, in bytes or as ``"512MB"``;
            a task spills its buffer to a sorted file when it is full. Default: a
            quarter of this allocation's memory divided among the workers (512 MiB per
            task on Slurm).
        run_dir: a directory that keeps the job's state (spill files, finished tasks);
            running again with it resumes. Default: a temporary directory, removed at
            the end (without ``output``, when the result is garbage-collected).
        output: a directory for the result as ``part-NNNNN.jsonl`` (or ``.parquet``)
            files and a ``_SUCCESS`` manifest, each written atomically.
        output_format: ``"jsonl"``, ``"parquet"`` or ``"text"`` (``key<TAB>value``
            lines), for ``output``.
        mode: what to do when ``output`` holds files paralela did not write (another
            tool's output, a user's file): ``"errorifexists"`` refuses them with a
            :class:`ConfigError` naming a few, as Spark's default save mode does;
            ``"overwrite"`` deletes them first. Either way, a run into paralela's own
            earlier output replaces only the files paralela recorded there as its own
            (its parts, ``_SUCCESS``), which a rerun with ``run_dir`` resumes from.
        input_format: ``"text"``, ``"jsonl"``, ``"csv"`` or ``"parquet"``; default from
            each file's extension.
        encoding: of text, JSONL and CSV inputs (invalid bytes are an error).
        split_bytes: the most bytes of a file per map task (int or ``"64MB"``); ``0``:
            one split per file (a CSV file with quoted fields that span lines needs it).
        records_per_split: records of an iterable input per map task.
        retries: times a task is run again when its worker dies (default 2).
        progress: progress bars for each phase (default: on a terminal).
        backend_options: options of a backend given by name (Slurm's, see docs/slurm.md).
        master: Spark master URL (``engine="spark"``): ``local[2]``, ``spark://host:7077``.
        spark_conf: extra Spark settings (``engine="spark"``).
        batched: ``mapper(records)`` takes a list of records (about 1 MiB of lines, or
            the records of a Parquet batch) and returns pairs or a mapping, like Spark's
            ``mapPartitions``: a word count can then count a batch with
            ``Counter`` in C and hand one pair per distinct word to the shuffle instead
            of one per token (about twice as fast; see docs/mapreduce.md). Errors name
            the batch's first and last line. Local engine only.

    Returns:
        A lazy, re-iterable :class:`MapReduceResult` of ``(key, value)`` pairs with a
        ``summary``; with ``output``, it reads the written files.

    Raises:
        ConfigError: a bad option, or ``output`` holds files paralela did not write
            (with ``mode="errorifexists"``), before work starts.
        InputError: an input is missing, unreadable or not valid (names file and line).
        UserFunctionError: the mapper, combiner or reducer raised (the user's exception
            is its ``__cause__``; it names the file and line, the record or the key), or
            the mapper yielded something other than a pair.
        WorkerDiedError: a task's worker died more often than ``retries`` allows.
        FingerprintMismatchError: ``run_dir`` was made for another job (names what changed).

    A task whose worker dies (killed, out of memory) is run again from its input. On
    Ctrl-C or an error, the tasks in flight are stopped and temporary files removed;
    a ``run_dir`` keeps every finished task for the next run.
    """
    started = time.perf_counter()
    mapper, reducer, combiner, batched = _commands(mapper, reducer, combiner, batched, engine)
    n_partitions = _check_job(mapper, reducer, combiner, partitions, engine, output_format, inputs)
    split_size, limit, out_dir = _check_sizes_and_output(
        split_bytes, memory_limit, output, mode, batched, engine
    )
    _check_engine_options(engine, master, spark_conf, backend, backend_options, workers,
                          memory_limit, run_dir, retries)  # fmt: skip
    _check_output(out_dir, mode)
    if engine == "spark":
        return _run_spark(
            mapper, reducer, combiner, inputs, n_partitions, master, out_dir, output_format,
            spark_conf, input_format, encoding, split_size, records_per_split,
        )  # fmt: skip
    return _run_local(
        mapper, reducer, combiner, inputs, n_partitions, workers, backend, backend_options,
        limit, run_dir, out_dir, output_format, input_format, encoding, split_size,
        records_per_split, retries, progress, started, batched,
    )  # fmt: skip


def _check_job(
    mapper: Any,
    reducer: Any,
    combiner: Any,
    partitions: Any,
    engine: str,
    output_format: str,
    inputs: Any,
) -> int | None:
    """Check the functions, ``partitions``, ``engine``, ``output_format`` and the kind
    of ``inputs``; the number of partitions (``None``: the default)."""
    _check_function("mapper", mapper)
    _check_function("reducer", reducer)
    _check_function("combiner", combiner, optional=True)
    n_partitions = _check_partitions(partitions)
    if engine not in ENGINES:
        raise ConfigError(f"Unknown engine {engine!r}; valid engines are: {', '.join(ENGINES)}.")
    if output_format not in FORMATS:
        raise ConfigError(
            f"Unknown output_format {output_format!r}; valid formats are: {', '.join(FORMATS)}."
        )
    if not isinstance(inputs, (str, os.PathLike, Iterable)):
        raise ConfigError(
            f"inputs must be a path, a glob, a list of them, or an iterable of records; "
            f"got {type(inputs).__name__}."
        )
    return n_partitions


def _check_sizes_and_output(
    split_bytes: int | str,
    memory_limit: int | str | None,
    output: str | os.PathLike[str] | None,
    mode: str,
    batched: Any,
    engine: str,
) -> tuple[int, int | None, Path | None]:
    """``split_bytes`` and ``memory_limit`` in bytes and ``output`` as a path, once
    ``mode`` and ``batched`` are checked too."""
    from paralela.files import parse_split_bytes

    split_size = parse_split_bytes(split_bytes)
    limit = None if memory_limit is None else parse_size(memory_limit)
    out_dir = None if output is None else Path(output)
    check_mode(mode)
    if not isinstance(batched, bool):
        raise ConfigError(f"batched must be True or False; got {batched!r}.")
    if engine == "spark" and batched:
        raise ConfigError(
            "batched=True runs on the local engine only; on Spark, give a mapper of one "
            "record (Spark combines each partition's pairs itself)."
        )
    return split_size, limit, out_dir


def _check_engine_options(
    engine: str,
    master: str | None,
    spark_conf: Mapping[str, str] | None,
    backend: Any,
    backend_options: Mapping[str, Any] | None,
    workers: Any,
    memory_limit: int | str | None,
    run_dir: str | os.PathLike[str] | None,
    retries: Any,
) -> None:
    """Refuse the options of the other engine: the local engine's on Spark, Spark's
    on the local engine."""
    if engine != "spark":
        if master is not None or spark_conf:
            raise ConfigError("master= and spark_conf= are options of engine='spark'.")
        return
    local_only = {
        "backend": backend is not UNSET,
        "backend_options": bool(backend_options),
        "workers": workers is not UNSET,
        "memory_limit": memory_limit is not None,
        "run_dir": run_dir is not None,
        "retries": retries is not UNSET,
    }
    given = [name for name, is_given in local_only.items() if is_given]
    if given:
        raise ConfigError(
            f"{', '.join(f'{n}=' for n in given)} belong to the local engine; with "
            "engine='spark' the cluster is chosen by master= ('local[4]' for 4 cores "
            "here) and tuned by spark_conf= (e.g. spark.executor.memory, "
            "spark.task.maxFailures); Spark recomputes lost tasks itself."
        )


def _check_output(output: Path | None, mode: str) -> None:
    """Refuse (or, with ``mode="overwrite"``, empty) an ``output`` directory holding
    files paralela did not write, once every option is checked and before any work."""
    if output is not None:
        from paralela.mapreduce._output import check_output_dir

        check_output_dir(output, mode)


def _plan(
    inputs: Any,
    input_format: str | None,
    encoding: str,
    split_bytes: int,
    min_splits: int,
    records_per_split: int,
) -> Iterator[Any]:
    """The splits: files are planned now (missing ones raise here), an iterable of
    records lazily, one split at a time as the map phase pulls them."""
    from paralela.files import plan_splits

    return plan_splits(
        inputs,
        format=input_format,
        split_bytes=split_bytes,
        min_splits=min_splits,
        records_per_split=records_per_split,
        encoding=encoding,
    )


def _run_local(
    mapper: Any,
    reducer: Any,
    combiner: Any,
    inputs: Any,
    partitions: int | None,
    workers: Any,
    backend: Any,
    backend_options: Mapping[str, Any] | None,
    memory_limit: int | None,
    run_dir: str | os.PathLike[str] | None,
    output: Path | None,
    output_format: str,
    input_format: str | None,
    encoding: str,
    split_bytes: int,
    records_per_split: int,
    retries: Any,
    progress: Any,
    started: float,
    batched: bool,
) -> MapReduceResult:
    from paralela.files import group_splits
    from paralela.mapping import check_picklable, choose_backend
    from paralela.mapreduce._engine import LocalJob, require_shared_run_dir, run_local

    backend_obj, owns = choose_backend(backend, workers, backend_options)
    try:
        n_workers = backend_obj.effective_workers()
        run_path = None if run_dir is None else Path(run_dir)
        require_shared_run_dir(backend_obj, run_path)
        if backend_obj.capabilities.needs_pickling:
            for name, fn in (("mapper", mapper), ("reducer", reducer), ("combiner", combiner)):
                if fn is not None:
                    check_picklable(name, fn)
        if memory_limit is None:
            remote = backend_obj.capabilities.packs_tasks
            memory_limit = DEFAULT_REMOTE_MEMORY if remote else default_memory_limit(n_workers)
        min_splits = SPLITS_PER_WORKER * n_workers
        splits = _plan(inputs, input_format, encoding, split_bytes, min_splits, records_per_split)
        tasks = group_splits(splits, split_bytes, min_splits)
        summary = MapReduceSummary(
            engine="local",
            workers=n_workers,
            memory_limit=memory_limit,
            plan_seconds=time.perf_counter() - started,
        )
        job = LocalJob(
            mapper=mapper,
            reducer=reducer,
            combiner=combiner,
            tasks=tasks,
            partitions=partitions or PARTITIONS_PER_WORKER * n_workers,
            backend=backend_obj,
            memory_limit=memory_limit,
            run_dir=run_path,
            output=output,
            output_format=output_format,
            retries=resolve("retries", retries, 2),
            progress=progress,
            summary=summary,
            started=started,
            batched=batched,
        )
        return run_local(job)
    finally:
        if owns:
            backend_obj.shutdown(wait=False, cancel_futures=True)


def _run_spark(
    mapper: Any,
    reducer: Any,
    combiner: Any,
    inputs: Any,
    partitions: int | None,
    master: str | None,
    output: Path | None,
    output_format: str,
    spark_conf: Mapping[str, str] | None,
    input_format: str | None,
    encoding: str,
    split_bytes: int,
    records_per_split: int,
) -> MapReduceResult:
    import importlib

    # Imported by name: the Spark engine (and pyspark) load only when asked for.
    run_spark = importlib.import_module("paralela.mapreduce._spark").run_spark
    splits = list(_plan(inputs, input_format, encoding, split_bytes, 1, records_per_split))
    result: MapReduceResult = run_spark(
        mapper=mapper,
        reducer=reducer,
        combiner=combiner,
        splits=splits,
        partitions=partitions,
        master=master,
        output=None if output is None else str(output),
        output_format=output_format,
        spark_conf=None if spark_conf is None else dict(spark_conf),
    )
    return result
