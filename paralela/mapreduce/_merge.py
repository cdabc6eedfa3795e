"""The reduce side of the shuffle: a k-way merge of sorted segments, grouped by key.

    segment 0 ─records─> entries (key, [values]) ─┐
    segment 1 ─records─> entries                  ├─ heapq.merge by key order ─> group equal
    ...                                           │   keys ─> reducer(key, values iterator)
    segment S ─records─> entries ─────────────────┘              └─> yield (key, result)

Memory is bounded whatever the data size: each segment holds one open file with a
``READ_BUFFER`` buffer and one decoded record (about ``RECORD_BYTES`` of pickle, or a
single value when one value is larger), and the reducer's values iterator pulls entries
from the merge as it goes, so a key with millions of values is never held at once. The
bound is about ``S x (READ_BUFFER + RECORD_BYTES x expansion)``, S the number of
segments and expansion the ratio of Python objects to pickle bytes (2 to 5 for small
strings and ints): about 1 MiB per segment, 100 MiB for 100 map tasks x 1 spill each.
"""

from __future__ import annotations

import heapq
import pickle
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from operator import itemgetter
from typing import Any

from paralela.errors import MapReduceError, UserFunctionError
from paralela.mapreduce._hashing import order
from paralela.mapreduce._spill import FORMAT, Segment, _combine, _short

__all__ = ["read_segment", "reduce_partition"]

# Read buffer per open segment: large enough that a record is a few reads, small enough
# that hundreds of segments fit in memory together.
READ_BUFFER = 64 * 1024
_END: Any = object()
_first = itemgetter(0)


def _order_entry(entry: tuple[Any, list[Any]]) -> Any:
    return order(entry[0])


class _Reader:
    """One segment opened: its header read, its entries streamed record by record."""

    def __init__(self, segment: Segment) -> None:
        self.path, self.offset, self.length = segment
        self._file = open(self.path, "rb", buffering=READ_BUFFER)  # noqa: SIM115
        try:
            self._file.seek(self.offset)
            header = self._load()
            if not (isinstance(header, tuple) and header[:2] == FORMAT and len(header) == 3):
                raise self._corrupt(f"its header is {_short(header)}, not {FORMAT!r}")
            self.str_only: bool = bool(header[2])
        except BaseException:
            self._file.close()
            raise

    def _load(self) -> Any:
        try:
            return pickle.load(self._file)
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise self._corrupt(f"{type(exc).__name__}: {exc}") from exc

    def _corrupt(self, why: str) -> MapReduceError:
        return MapReduceError(
            f"Spill file {self.path} is damaged at bytes {self.offset}..."
            f"{self.offset + self.length}: {why}. It was changed or truncated after its "
            "map task finished; re-run the job (the map task rewrites it)."
        )

    def entries(self) -> Generator[tuple[Any, list[Any]], None, None]:
        end = self.offset + self.length
        f = self._file
        try:
            while f.tell() < end:
                yield from self._load()
        finally:
            f.close()


def read_segment(segment: Segment) -> Iterator[tuple[Any, list[Any]]]:
    """The ``(key, values chunk)`` entries of one segment, in key order; a key with many
    values comes as several consecutive entries.

    Raises:
        OSError: the spill file cannot be opened (``FileNotFoundError`` when it is gone).
        MapReduceError: the segment is not a shuffle segment or is damaged (names the file).
    """
    return _Reader(segment).entries()


def reduce_partition(
    segments: Sequence[Segment],
    reducer: Callable[[Any, Iterator[Any]], Any],
    *,
    combiner: Callable[[Any, Iterator[Any]], Any] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Merge the sorted ``segments`` of one partition and reduce each key.

    Calls ``reducer(key, values)`` once per distinct key, in the partition's key order
    (see :mod:`._hashing`), ``values`` an iterator that streams across segments and
    chunks; yields ``(key, result)``. The iterator is valid only during the call: what
    the reducer leaves unread is skipped. With ``combiner``, each chunk of values read
    is first combined to one value (a smaller stream, same result for an associative
    combiner). Nothing is opened until the first item is asked for; closing the returned
    generator closes the files. Memory is bounded as the module docstring says.

    Raises:
        UserFunctionError: the reducer raised (function="reducer", ``where`` the key's
            repr, the user's exception as ``__cause__``) or the combiner did.
        OSError, MapReduceError: as :func:`read_segment`.
    """
    return _reduce(list(segments), reducer, combiner)


def _reduce(
    segments: list[Segment],
    reducer: Callable[[Any, Iterator[Any]], Any],
    combiner: Callable[[Any, Iterator[Any]], Any] | None,
) -> Iterator[tuple[Any, Any]]:
    readers: list[_Reader] = []
    try:
        for segment in segments:
            readers.append(_Reader(segment))
    except BaseException:
        for reader in readers:
            reader._file.close()
        raise
    streams = [reader.entries() for reader in readers]
    if all(reader.str_only for reader in readers):
        merged: Iterator[tuple[Any, list[Any]]] = heapq.merge(*streams, key=_first)
    else:
        merged = heapq.merge(*streams, key=_order_entry)
    if combiner is not None:
        merged = _combined(merged, combiner)
    following: list[Any] = [_END]
    try:
        entry = next(merged, _END)
        while entry is not _END:
            key = entry[0]
            values = _values(key, entry[1], merged, following)
            try:
                result = reducer(key, values)
            except MapReduceError:
                raise
            except Exception as exc:
                raise UserFunctionError(
                    f"The reducer raised {type(exc).__name__}: {exc}\n  for key {_short(key)}",
                    function="reducer",
                    where=repr(key)[:200],
                ) from exc
            deque(values, maxlen=0)  # skip what the reducer left unread
            entry = following[0]
            yield key, result
    finally:
        for stream in streams:
            stream.close()


def _values(
    key: Any, first: list[Any], merged: Iterator[tuple[Any, list[Any]]], following: list[Any]
) -> Iterator[Any]:
    """The values of ``key``; leaves the next key's first entry in ``following[0]``."""
    yield from first
    for entry in merged:
        if entry[0] == key:
            yield from entry[1]
        else:
            following[0] = entry
            return
    following[0] = _END


def _combined(
    merged: Iterator[tuple[Any, list[Any]]], combiner: Callable[[Any, Iterator[Any]], Any]
) -> Iterator[tuple[Any, list[Any]]]:
    for key, values in merged:
        yield (key, [_combine(combiner, key, values)] if len(values) > 1 else values)
