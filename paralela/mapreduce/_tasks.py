"""What runs inside a worker: one map task (a split) or one reduce task (a partition).

::

    map task:    read_split_batches(split) ─batch of records─> map(mapper, batch), chained
                 ─pairs─> MapOutput.add_all, one call per batch
                   (buffer, combine, spill sorted runs per partition under memory_limit)
                 ──> MapTaskResult: the spill segments per partition, and counters
    reduce task: reduce_partition(segments of one partition from every map task, reducer)
                 ──> write_part (atomic) ──> ReduceTaskResult: the part file, counters

A task that fails raises :class:`paralela.tasks.TaskFailed` (a :class:`UserFunctionError`
or an :class:`InputError` inside), which carries the user's own exception and its
traceback across the process boundary; the driver raises ``failed.reraise()``: the plain
error with the user's exception as ``__cause__``.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from paralela.errors import InputError, MapReduceError, UserFunctionError
from paralela.mapreduce._batches import RECORD_REPR, batch_blocks, describe, gathered
from paralela.mapreduce._output import Part, write_part
from paralela.mapreduce._segments import NotPicklable
from paralela.tasks import carry, short_repr

__all__ = [
    "MapJob",
    "MapTaskResult",
    "ReduceJob",
    "ReduceTask",
    "ReduceTaskResult",
    "run_map_task",
    "run_reduce_task",
]

Segment = tuple[str, int, int]
chain_all = itertools.chain.from_iterable
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class MapJob:
    """What every map task of a job shares (sent to each worker once)."""

    mapper: Any
    combiner: Any
    partitions: int
    spill_dir: str
    memory_limit: int
    batched: bool = False  # the mapper takes a list of records (a batch), not one record


@dataclass(frozen=True)
class ReduceJob:
    """What every reduce task of a job shares."""

    reducer: Any
    combiner: Any  # applied again to each chunk of values read (see reduce_partition)
    output_dir: str
    output_format: str


@dataclass(frozen=True)
class ReduceTask:
    """One partition: its number and its segments from every map task."""

    partition: int
    segments: tuple[Segment, ...]


@dataclass
class MapTaskResult:
    """What a finished map task reports: where its pairs are, and its counters."""

    split: int  # the index of the task's first split
    segments: dict[int, list[Segment]]
    records: int
    pairs_in: int
    pairs_out: int
    spills: int
    bytes_spilled: int
    peak_buffer_bytes: int
    seconds: float
    splits: int = 1  # splits the task covered


@dataclass
class ReduceTaskResult:
    """What a finished reduce task reports: its part file and its counters."""

    part: Part
    bytes_read: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def run_map_task(job: MapJob, task: Any) -> MapTaskResult:
    """Run the mapper over one map task's splits (a tuple of them, or one split) and
    spill their pairs, combined together; see the module docstring.

    Raises:
        TaskFailed: the mapper (or combiner) raised or yielded something that is not a
            pair (a :class:`UserFunctionError` naming the file and line and the record),
            or a split cannot be read (an :class:`InputError`).
        MapReduceError: spill files cannot be written (a full disk), naming the directory.
    """
    from paralela.mapreduce._shuffle import MapOutput

    splits = tuple(task) if isinstance(task, (tuple, list)) else (task,)
    started = time.perf_counter()
    token = os.urandom(4).hex()  # each attempt writes files of its own
    out = MapOutput(
        job.partitions,
        job.spill_dir,
        combiner=job.combiner,
        memory_limit=job.memory_limit,
        name=f"map-{splits[0].index:06d}-{token}",
    )
    map_split = _map_batched if job.batched else _map_split
    try:
        records = sum(map_split(job, split, out) for split in splits)
        segments = out.close()
    except NotPicklable as exc:  # found at a spill, maybe long after the mapper yielded it
        from paralela.mapreduce._pickling import unpicklable_error

        raise carry(unpicklable_error(job, splits, exc), exc.__cause__) from None
    except Exception as exc:  # the last spill: a combiner that raises, a full disk
        error = _map_failure(exc, job, splits[-1], -1, None, describe(splits))
        if error is exc:
            raise
        raise error from error.__cause__
    return _result(splits, out, segments, records, started)


def _map_split(job: MapJob, split: Any, out: Any) -> int:
    """Add the pairs of every record of ``split`` to ``out``; the records read."""
    from paralela.files import read_split_batches

    mapper = job.mapper
    add_all = out.add_all
    fn: Any = None  # the mapper, or a wrapper giving the items of the mappings it returns
    done = 0  # records in the batches before the current one
    batch: list[Any] = []
    rest: Iterator[Any] = iter(batch)
    reading = True
    try:
        # The hot loop: per batch of records (~1 MiB of lines), one add_all over every
        # pair of the batch, chained in C; no Python code of ours runs per record or pair.
        for batch in read_split_batches(split):
            reading = False
            rest = iter(batch)
            if fn is None:  # the first record decides: pairs, or a mapping
                for record in rest:
                    pairs = mapper(record)
                    fn = mapper
                    if isinstance(pairs, Mapping):
                        fn = functools.partial(_items, mapper)
                        pairs = pairs.items()
                    add_all(pairs)
                    break
            add_all(chain_all(map(fn, rest)))
            done += len(batch)
            reading = True
    except InputError as exc:
        raise carry(exc, exc.__cause__) from None
    except NotPicklable:
        raise  # run_map_task finds the record
    except Exception as exc:
        if reading:  # an error of the reader that is not an InputError (a bug)
            raise
        # Which record: map() has pulled it from ``rest`` when it fails (none: a
        # combiner's error while the buffer was compacted between batches).
        offset = len(batch) - operator.length_hint(rest) - 1
        if batch and offset >= 0:
            error = _map_failure(exc, job, split, done + offset, batch[offset])
        else:
            error = _map_failure(exc, job, split, -1, None)
        if error is exc:
            raise
        raise error from error.__cause__
    return done


def _result(
    splits: tuple[Any, ...], out: Any, segments: Any, records: int, started: float
) -> MapTaskResult:
    stats = out.stats
    return MapTaskResult(
        splits[0].index,
        segments,
        records,
        stats.pairs_in,
        stats.pairs_out,
        stats.spills,
        stats.bytes_spilled,
        stats.peak_buffer_bytes,
        time.perf_counter() - started,
        len(splits),
    )


def _map_batched(job: MapJob, split: Any, out: Any) -> int:
    """:func:`_map_split` for a mapper of whole batches of records (``batched=True``):
    one call per batch (up to 16 MiB of lines, see BATCH_SHARE), so a mapper can count
    with C code (``Counter``) and hand over one pair per distinct key, not one per token."""
    from paralela.files import locate, read_split_batches

    done = 0
    batch: list[Any] = []
    try:
        blocks = batch_blocks(job.memory_limit)
        for batch in gathered(read_split_batches(split), split.format, blocks):
            pairs = job.mapper(batch)
            if isinstance(pairs, Mapping):
                out.add_mapping(pairs)
            else:
                out.add_all(pairs)
            done += len(batch)
    except InputError as exc:
        raise carry(exc, exc.__cause__) from None
    except NotPicklable:
        raise  # run_map_task finds the batch
    except Exception as exc:
        if isinstance(exc, UserFunctionError) and exc.function == "combiner":
            raise carry(exc, exc.__cause__) from None
        if not batch:  # the reader failed before its first batch: a bug, not the user's
            raise
        first, last = locate(split, done), locate(split, done + len(batch) - 1)
        where = first if len(batch) == 1 else f"{first} to {last}"
        batch_text = f"the batch of {len(batch)} record(s) from {where}"
        usage = (
            "with batched=True a mapper takes a list of records and returns (key, value) "
            "pairs or a mapping"
        )
        cause: BaseException | None = exc
        if isinstance(exc, UserFunctionError):  # what it returned is not pairs
            message = f"{exc}\n  ({usage}), for {batch_text}"
            cause = exc.__cause__
        elif isinstance(exc, TypeError) and not _raised_in_user_code(exc):
            message = (
                f"The batched mapper did not return pairs ({exc}); {usage}.\n  for {batch_text}"
            )
        else:
            message = f"The mapper raised {type(exc).__name__}: {exc}\n  on {batch_text}"
        error = UserFunctionError(message, function="mapper", where=where)
        raise carry(error, cause) from None
    return done


def _items(mapper: Callable[[Any], Any], record: Any) -> Any:
    """A mapper returning a mapping: its items are the pairs (any other return as is)."""
    pairs = mapper(record)
    return pairs.items() if isinstance(pairs, Mapping) else pairs


def _map_failure(
    exc: Exception, job: MapJob, split: Any, index: int, record: Any, task: str | None = None
) -> BaseException:
    """The error to raise for ``exc`` in a map task, ``index`` its record in the split
    (``-1``: after the last record, while the last spill was written; ``task`` then says
    what the task covers, default the split)."""
    from paralela.files import locate

    if isinstance(exc, UserFunctionError):
        if exc.function == "combiner" or index < 0:  # no record to blame: say which split
            error = UserFunctionError(
                f"{exc}\n  in the map task of {task or split.describe()}",
                function=exc.function,
                where=exc.where,
            )
            return carry(error, exc.__cause__)
        where = locate(split, index)
        return carry(_with_record(exc, where, record), exc.__cause__)
    if isinstance(exc, OSError) and _under(getattr(exc, "filename", None), job.spill_dir):
        spill_error = MapReduceError(
            f"Spill files cannot be written in {job.spill_dir}: {exc}. Free space "
            "there, or pass run_dir= on a larger filesystem."
        )
        spill_error.__cause__ = exc
        return spill_error
    if index < 0:
        return exc  # not the user's: ours, with its own traceback
    return carry(_mapper_error(exc, split, index, record), exc)


def _under(filename: Any, directory: str) -> bool:
    if not isinstance(filename, str):
        return False
    return os.path.abspath(filename).startswith(os.path.abspath(directory) + os.sep)


def _mapper_error(exc: BaseException, split: Any, index: int, record: Any) -> UserFunctionError:
    from paralela.files import locate

    if index < 0:  # raised before the first record: reading the split failed
        where = split.describe()
        return UserFunctionError(
            f"Reading {where} failed: {type(exc).__name__}: {exc}",
            function="mapper",
            where=where,
        )
    where = locate(split, index)
    if isinstance(exc, TypeError) and not _raised_in_user_code(exc):
        # Raised by iterating what the mapper returned (None, a number), not in it.
        return UserFunctionError(
            f"The mapper returned something that is not an iterable of (key, value) "
            f"pairs ({exc}); a mapper yields pairs, or returns a list or a mapping of "
            f"them.\n  at {where}, record {short_repr(record, RECORD_REPR)}",
            function="mapper",
            where=where,
        )
    return UserFunctionError(
        f"The mapper raised {type(exc).__name__}: {exc}\n  at {where}, record "
        f"{short_repr(record, RECORD_REPR)}",
        function="mapper",
        where=where,
    )


def _raised_in_user_code(exc: BaseException) -> bool:
    """Whether the innermost Python frame of ``exc``'s traceback is outside paralela."""
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def _with_record(exc: UserFunctionError, where: str, record: Any) -> UserFunctionError:
    return UserFunctionError(
        f"{exc}\n  at {where}, record {short_repr(record, RECORD_REPR)}",
        function=exc.function,
        where=where,
    )


def run_reduce_task(job: ReduceJob, task: ReduceTask) -> ReduceTaskResult:
    """Merge one partition's segments through the reducer and write its part file.

    Raises:
        TaskFailed: the reducer raised (a :class:`UserFunctionError` naming the key), or
            a value cannot be written in the output format.
        MapReduceError: a spill file is missing or the part file cannot be written.
    """
    from paralela.mapreduce._shuffle import reduce_partition
    from paralela.mapreduce._streaming import CommandReducer, stream_reduce

    started = time.perf_counter()
    try:
        segments, combiner = list(task.segments), job.combiner
        if isinstance(job.reducer, CommandReducer):  # a command reduces the whole partition
            pairs: Any = stream_reduce(job.reducer, segments, combiner, task.partition)
        else:
            pairs = reduce_partition(segments, job.reducer, combiner=combiner)
        part = write_part(pairs, job.output_dir, task.partition, job.output_format)
    except UserFunctionError as exc:
        raise carry(exc, exc.__cause__) from None
    except OSError as exc:
        raise MapReduceError(
            f"Partition {task.partition} cannot be reduced: {exc}. If a spill file is "
            "missing, the job's directory was changed behind its back (a finished job's "
            "spills/ are removed): delete the run directory and run again. If the output "
            "cannot be written, free space or pass another output directory."
        ) from exc
    return ReduceTaskResult(
        part, sum(length for _, _, length in task.segments), time.perf_counter() - started
    )
