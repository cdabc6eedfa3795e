"""A key or value the shuffle cannot pickle, traced back to the record that yielded it.

::

    spill: pickle.dumps(record of entries) fails ──> NotPicklable(key, part) (._segments)
    run_map_task ──> unpicklable_error: run the mapper over the task's records again,
      pickling each pair, up to the first that does not pickle
        found     ──> UserFunctionError(mapper): the record (file and line) and the key
        not found ──> UserFunctionError(combiner): its combined value for that key

The pairs are long gone when a spill pickles them (at the task's end, or at a spill many
records later), and pickling each pair as it is added would cost the hot loop more than
the whole shuffle; so the record is found again, only on this failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paralela.errors import UserFunctionError
from paralela.mapreduce._batches import RECORD_REPR, batch_blocks, describe, gathered
from paralela.mapreduce._segments import NotPicklable, pickle_error
from paralela.tasks import short_repr

if TYPE_CHECKING:
    from paralela.mapreduce._tasks import MapJob

__all__ = ["spark_unpicklable_error", "unpicklable_error"]


_HOW = (
    "the shuffle writes keys and values to disk with pickle, so they must be plain data "
    "(numbers, strings, tuples, lists, dicts, arrays): yield what you need of the object "
    "(its fields, its text), not the object (a lock, an open file, a connection)"
)


def unpicklable_error(job: MapJob, splits: tuple[Any, ...], exc: NotPicklable) -> UserFunctionError:
    """The error for a key or value that a spill could not pickle: it names the mapper,
    the first record (file and line) whose pairs hold a key or value that does not pickle,
    and that key; or, when every pair the mapper yields pickles, the combiner and the key
    whose combined value does not. Runs the mapper over the task's records again, up to
    that record (only on this failure: the pairs are long gone by the time a spill
    pickles them)."""
    error = _mapper_error(job.mapper, job.batched, job.memory_limit, splits)
    if error is not None:
        return error
    cause = exc.__cause__
    reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
    if job.combiner is not None:
        error = UserFunctionError(
            f"The combiner returned the value {exc.value_repr} for key {exc.key_repr}, "
            f"which cannot be pickled ({reason}); {_HOW}.",
            function="combiner",
            where=exc.key_repr,
        )
    else:
        error = UserFunctionError(
            f"The mapper yielded the {exc.part} {exc.value_repr} for key {exc.key_repr}, "
            f"which cannot be pickled ({reason}); {_HOW}.\n  in the map task of "
            f"{describe(splits)}",
            function="mapper",
            where=describe(splits),
        )
    error.__cause__ = cause
    return error


def spark_unpicklable_error(mapper: Any, splits: list[Any]) -> UserFunctionError | None:
    """For a Spark job that failed pickling a pair (Spark pickles them after the mapper
    yields them, out of paralela's reach): the error :func:`unpicklable_error` gives for
    the first record whose pairs do not pickle, found by mapping the splits again here,
    in the driver (which planned them, so it can read them); None when none is found."""
    return _mapper_error(mapper, False, 0, tuple(splits))


def _mapper_error(
    mapper: Any, batched: bool, memory_limit: int, splits: tuple[Any, ...]
) -> UserFunctionError | None:
    try:
        found = _first_unpicklable(mapper, batched, memory_limit, splits)
    except Exception:  # the mapper fails differently when run again: say what we know
        return None
    if found is None:
        return None
    where, tail, key, value, part, why = found
    what = f"the key {short_repr(key, RECORD_REPR)}"
    if part == "value":
        what = f"the value {short_repr(value, RECORD_REPR)} for key " + short_repr(key, RECORD_REPR)
    error = UserFunctionError(
        f"The mapper yielded {what}, which cannot be pickled "
        f"({type(why).__name__}: {why}); {_HOW}.\n  {tail}",
        function="mapper",
        where=where,
    )
    error.__cause__ = why
    return error


def _first_unpicklable(
    mapper: Any, batched: bool, memory_limit: int, splits: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    """``(where, "at WHERE, record R", key, value, "key" or "value", the pickling error)``
    for the first record of ``splits`` (a batch, for a batched mapper) whose pairs hold a
    key or value that does not pickle; None when every pair pickles."""
    from paralela.files import locate, read_split_batches

    for split in splits:
        done = 0
        batches = read_split_batches(split)
        if batched:
            batches = gathered(batches, split.format, batch_blocks(memory_limit))
        for batch in batches:
            calls = [(batch, 0)] if batched else [([r], i) for i, r in enumerate(batch)]
            for records, offset in calls:
                pairs = mapper(records if batched else records[0])
                for key, value in pairs.items() if isinstance(pairs, Mapping) else pairs:
                    for part, obj in (("key", key), ("value", value)):
                        why = pickle_error(obj)
                        if why is None:
                            continue
                        first = locate(split, done + offset)
                        if batched:
                            last = locate(split, done + len(batch) - 1)
                            where = first if len(batch) == 1 else f"{first} to {last}"
                            tail = f"on the batch of {len(batch)} record(s) from {where}"
                        else:
                            where = first
                            tail = f"at {where}, record {short_repr(records[0], RECORD_REPR)}"
                        return where, tail, key, value, part, why
            done += len(batch)
    return None
