"""The reduce side of the shuffle: a k-way merge of sorted segments, grouped by key.

    segment 0 ─records─> entries (key, [values]) ─┐
    segment 1 ─records─> entries                  ├─ heapq.merge by key order ─> group equal
    ...                                           │   keys ─> reducer(key, values iterator)
    segment S ─records─> entries ─────────────────┘              └─> yield (key, result)

    more than MERGE_FACTOR segments: merge them MERGE_FACTOR at a time into temporary
    temporary merge files (``_files.TMP_PREFIX`` + ``merge-``) next to the first
    segment first (deleted when done)

Memory is bounded whatever the data size: at most ``MERGE_FACTOR`` segments are open at
once, each with a ``READ_BUFFER`` (64 KiB) buffer and one decoded record (about
``RECORD_BYTES``, 256 KiB, of pickle, 2 to 5 times that as Python objects, or a single
value when one value is larger), and the reducer's values iterator pulls entries from
the merge as it goes, so a key with millions of values is never held at once. That is
about 1 MiB per open segment: under ~64 MiB with 64 open, and a few MiB for the usual
handful. The reducer's own results are the caller's to hold or stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from paralela import _files
from paralela.errors import MapReduceError, UserFunctionError
from paralela.mapreduce._segments import (
    MERGE_FACTOR,
    Merged,
    Segment,
    combine,
    merge_files,
    read_segment,
    remove,
    short,
)

__all__ = ["read_segment", "reduce_partition"]


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
    generator closes the files and deletes its temporary merge files. Memory is bounded
    as the module docstring says.

    Raises:
        UserFunctionError: the reducer raised (function="reducer", ``where`` the key's
            repr, the user's exception as ``__cause__``) or the combiner did.
        OSError: a spill file cannot be opened (``FileNotFoundError`` when it is gone),
            or a temporary merge file cannot be written.
        MapReduceError: a segment is damaged (the message names the file).
    """
    return _reduce(list(segments), reducer, combiner)


def _reduce(
    segments: list[Segment],
    reducer: Callable[[Any, Iterator[Any]], Any],
    combiner: Callable[[Any, Iterator[Any]], Any] | None,
) -> Iterator[tuple[Any, Any]]:
    temporary: list[str] = []
    try:
        while len(segments) > MERGE_FACTOR:  # merge in passes: bounded open files
            merged_pass: list[Segment] = []
            for i in range(0, len(segments), MERGE_FACTOR):
                group = segments[i : i + MERGE_FACTOR]
                if len(group) == 1:
                    merged_pass.extend(group)
                    continue
                path = _files.temp_path(Path(group[0][0]), prefix=_files.TMP_PREFIX + "merge-")
                temporary.append(str(path))
                written, _ = merge_files([{0: s} for s in group], path, None, temporary=True)
                merged_pass.append(written[0])
            segments = merged_pass
        merged = Merged(segments)
        try:
            groups = merged.groups()
            if combiner is not None:
                groups = _combined(groups, combiner)
            for key, values in groups:
                try:
                    result = reducer(key, values)
                except MapReduceError:
                    raise
                except Exception as exc:
                    raise UserFunctionError(
                        f"The reducer raised {type(exc).__name__}: {exc}\n  for key {short(key)}",
                        function="reducer",
                        where=repr(key)[:200],
                    ) from exc
                yield key, result
        finally:
            merged.close()
    finally:
        remove(temporary)


def _combined(
    groups: Iterator[tuple[Any, Iterator[Any]]], combiner: Callable[[Any, Iterator[Any]], Any]
) -> Iterator[tuple[Any, Iterator[Any]]]:
    """Each group's values with every run of up to 1024 values combined to one value."""
    for key, values in groups:
        yield key, _chunks_combined(key, values, combiner)


def _chunks_combined(
    key: Any, values: Iterator[Any], combiner: Callable[[Any, Iterator[Any]], Any]
) -> Iterator[Any]:
    from itertools import islice

    while True:
        chunk = list(islice(values, 1024))
        if not chunk:
            return
        yield combine(combiner, key, iter(chunk)) if len(chunk) > 1 else chunk[0]
