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
from typing import Any

from paralela.errors import UserFunctionError
from paralela.mapping._task import short_repr
from paralela.mapreduce._segments import NotPicklable, pickle_error
from paralela.mapreduce._tasks import RECORD_REPR, MapJob, batch_blocks, describe, gathered

__all__ = ["unpicklable_error"]


def unpicklable_error(job: MapJob, splits: tuple[Any, ...], exc: NotPicklable) -> UserFunctionError:
    """The error for a key or value that a spill could not pickle: it names the mapper,
    the first record (file and line) whose pairs hold a key or value that does not pickle,
    and that key; or, when every pair the mapper yields pickles, the combiner and the key
    whose combined value does not. Runs the mapper over the task's records again, up to
    that record (only on this failure: the pairs are long gone by the time a spill
    pickles them)."""
    how = (
        "the shuffle writes keys and values to disk with pickle, so they must be plain "
        "data (numbers, strings, tuples, lists, dicts, arrays): yield what you need of the "
        "object (its fields, its text), not the object (a lock, an open file, a connection)"
    )
    try:
        found = _first_unpicklable(job, splits)
    except Exception:  # the mapper fails differently when run again: say what we know
        found = None
    if found is not None:
        where, tail, key, value, part, why = found
        what = f"the key {short_repr(key, RECORD_REPR)}"
        if part == "value":
            what = f"the value {short_repr(value, RECORD_REPR)} for key " + short_repr(
                key, RECORD_REPR
            )
        error = UserFunctionError(
            f"The mapper yielded {what}, which cannot be pickled "
            f"({type(why).__name__}: {why}); {how}.\n  {tail}",
            function="mapper",
            where=where,
        )
    elif job.combiner is not None:
        error = UserFunctionError(
            f"The combiner returned the value {exc.value_repr} for key {exc.key_repr}, "
            f"which cannot be pickled ({_cause_text(exc)}); {how}.",
            function="combiner",
            where=exc.key_repr,
        )
    else:
        error = UserFunctionError(
            f"The mapper yielded the {exc.part} {exc.value_repr} for key {exc.key_repr}, "
            f"which cannot be pickled ({_cause_text(exc)}); {how}.\n  in the map task of "
            f"{describe(splits)}",
            function="mapper",
            where=describe(splits),
        )
    error.__cause__ = exc.__cause__
    return error


def _cause_text(exc: BaseException) -> str:
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def _first_unpicklable(job: MapJob, splits: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``(where, "at WHERE, record R", key, value, "key" or "value", the pickling error)`` for the
    first record of ``splits`` (a batch, for a batched mapper) whose pairs hold a key or
    value that does not pickle; None when every pair pickles."""
    from paralela.mapreduce._inputs import locate, read_split_batches

    for split in splits:
        done = 0
        batches = read_split_batches(split)
        if job.batched:
            batches = gathered(batches, split.format, batch_blocks(job.memory_limit))
        for batch in batches:
            calls = [(batch, 0)] if job.batched else [([r], i) for i, r in enumerate(batch)]
            for records, offset in calls:
                pairs = job.mapper(records if job.batched else records[0])
                for key, value in pairs.items() if isinstance(pairs, Mapping) else pairs:
                    for part, obj in (("key", key), ("value", value)):
                        why = pickle_error(obj)
                        if why is None:
                            continue
                        first = locate(split, done + offset)
                        if job.batched:
                            last = locate(split, done + len(batch) - 1)
                            where = first if len(batch) == 1 else f"{first} to {last}"
                            tail = f"on the batch of {len(batch)} record(s) from {where}"
                        else:
                            where = first
                            tail = f"at {where}, record {short_repr(records[0], RECORD_REPR)}"
                        return where, tail, key, value, part, why
            done += len(batch)
    return None
