"""What the Spark engine runs on the executors: its map and reduce tasks, and how their
errors reach the driver (the driver's side is :mod:`._spark`).

::

    map task (one split):  read_split ─record─> mapper ─pairs─> combiner: a dict of
                           key -> values, combined every COMBINE_EVERY values of a key,
                           sent on when the split ends (or past MAX_BUFFERED_KEYS keys)
    reduce task:           sorted pairs ─groupby key order─> reducer(key, values) ─> batches
    a failure:             UserFunctionError / InputError + the user's exception and its
                           traceback ─TaskFailed─pickle─base64─> "... PARALELA-TASK-FAILED[...]"
                           in the message of a ShippedError; Spark carries the message to
                           the driver, where :func:`unship` finds it in Spark's error

The errors read as the local engine's (:mod:`._tasks`, :mod:`._spill`, :mod:`._merge`
word them), which ``tests/test_mapreduce_spark.py`` checks by running both engines.
The user's functions arrive pickled (:class:`SparkJob`) and are unpickled once per Python
worker, after the driver's ``sys.path`` is added for the modules they import by name.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from paralela.errors import InputError, MapReduceError, UserFunctionError

__all__ = [
    "BATCH",
    "COMBINE_EVERY",
    "MAX_BUFFERED_KEYS",
    "Counters",
    "ShippedError",
    "SparkJob",
    "map_partition",
    "partition_of_key",
    "reduce_partition",
    "unship",
]

#: A key's buffered values on the map side are combined into one every this many values:
#: often enough that a frequent key holds little memory, rarely enough that calling the
#: combiner costs little next to the mapper.
COMBINE_EVERY = 64
#: Distinct keys a map task buffers before it sends them all on (combined): bounds its
#: memory when keys hardly repeat (the combiner then saves little anyway).
MAX_BUFFERED_KEYS = 1 << 18
#: Pairs per batch a reduce task sends to the driver.
BATCH = 4096
_MARK = "PARALELA-TASK-FAILED"
_SHIPPED = re.compile(_MARK + r"\[([A-Za-z0-9+/=]+)\]")


@dataclass(frozen=True)
class SparkJob:
    """The user's functions, pickled once on the driver (see ``_spark._payload``)."""

    mapper: Callable[[Any], Any]
    reducer: Callable[[Any, Iterator[Any]], Any]
    combiner: Callable[[Any, Iterator[Any]], Any] | None


class Counters:
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


def partition_of_key(partitions: int, key: Any) -> int:
    """:func:`~._hashing.partition_of`, arguments swapped for ``functools.partial``."""
    from paralela.mapreduce._hashing import partition_of

    return partition_of(key, partitions)


_LOADED: dict[bytes, SparkJob] = {}


def load(payload: bytes, path: list[str]) -> SparkJob:
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
    message, between markers); never reaches users: see :func:`unship`."""


def _ship(error: MapReduceError, cause: BaseException | None) -> ShippedError:
    from paralela.tasks import carry

    failed = carry(error, cause)
    blob = base64.b64encode(pickle.dumps(failed)).decode("ascii")
    return ShippedError(f"{str(error).splitlines()[0][:300]} {_MARK}[{blob}]")


def unship(exc: BaseException) -> Any:
    """The ``paralela.tasks.TaskFailed`` a task shipped inside Spark's error ``exc``, or None."""
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


def map_partition(
    payload: bytes, path: list[str], counters: Counters, splits: Iterable[Any]
) -> Iterator[tuple[Any, Any]]:
    """A map task: every split of this partition (one) through the mapper and combiner."""
    job = load(payload, path)
    for split in splits:
        yield from _map_split(job, split, counters)
    counters.map_end.add(time.time())


def _map_split(job: SparkJob, split: Any, counters: Counters) -> Iterator[tuple[Any, Any]]:
    """One split through the mapper (and the combiner); the errors as the local engine's
    map task words them (:mod:`._tasks`), shipped to the driver."""
    from paralela.files import locate, read_split

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
    from paralela.files import locate

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
    from paralela.tasks import short_repr

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


def reduce_partition(
    payload: bytes, path: list[str], partition: int, pairs: Iterable[tuple[Any, Any]]
) -> Iterator[tuple[int, list[tuple[Any, Any]]]]:
    """A reduce task: the partition's pairs, sorted by key order, grouped by key, each
    group through the reducer; sent on in batches of :data:`BATCH` pairs."""
    from paralela.mapreduce._hashing import order

    reducer = load(payload, path).reducer
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
