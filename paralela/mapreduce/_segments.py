"""Shuffle segments on disk: writing them, reading them, merging many into one.

    spill file  DIR/NAME-spill-0000   (written through paralela._files.replacing)
    ┌─ segment of partition 0 ────────────────────────────┬─ partition 3 ─┬─ ...
    │ header  pickle ("paralela-shuffle", 1, str_only)     │ header        │
    │ record  pickle [(key, [v, v, ...]), (key, [v]), ...] │ record ...    │
    │ record  ...   (entries sorted by key order)          │               │
    └──────────────────────────────────────────────────────┴───────────────┴─
    Segment = (path, offset, length): one partition's bytes inside one file.

Entries are sorted by :func:`~._hashing.order`, or by plain ``str`` order when the header
says ``str_only`` (every key a ``str``), which lets a merge compare keys directly. A key
with many values is written as consecutive entries of at most ``CHUNK_VALUES`` values,
and a record holds entries up to about ``RECORD_BYTES`` of pickle, so a reader holds one
record per segment, never a whole key.

:func:`merge_files` merges up to ``MERGE_FACTOR`` files into one, partition by
partition (Hadoop's ``io.sort.factor``): a map task with many spills leaves one file, and
a reduce task with more segments than that merges them in passes, so the number of files
open at once, and the memory their buffers take, stays bounded.
"""

from __future__ import annotations

import contextlib
import heapq
import operator
import os
import pickle
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO

from paralela.errors import MapReduceError, UserFunctionError

__all__ = [
    "CHUNK_VALUES",
    "FORMAT",
    "MERGE_FACTOR",
    "RECORD_BYTES",
    "Merged",
    "NotPicklable",
    "Segment",
    "SegmentWriter",
    "combine",
    "combiner_error",
    "merge_files",
    "pickle_error",
    "read_segment",
    "remove",
    "short",
]

Segment = tuple[str, int, int]
FORMAT = ("paralela-shuffle", 1)
# Most values one entry carries; a key with more is written as several entries.
CHUNK_VALUES = 1024
# Target size of one pickled record; a writer puts fewer values in a record after one
# came out larger (large values), so a reader's record stays near this size.
RECORD_BYTES = 256 * 1024
# Read buffer per open segment: a record is a few reads, and hundreds of segments fit.
READ_BUFFER = 64 * 1024
# Most segments merged at once: 64 x (64 KiB buffer + one ~256 KiB record, 2-5x that
# as objects) stays under ~100 MiB, and far under the usual 1024 open files.
MERGE_FACTOR = 64
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_END: Any = object()
_first = itemgetter(0)


def short(obj: Any) -> str:
    """``repr(obj)``, cut to 200 characters."""
    text = repr(obj)
    return text if len(text) <= 200 else text[:197] + "..."


def combine(combiner: Callable[[Any, Iterator[Any]], Any], key: Any, values: Iterator[Any]) -> Any:
    """``combiner(key, values)``; its exception becomes a UserFunctionError(function="combiner")."""
    try:
        return combiner(key, values)
    except MapReduceError:
        raise
    except Exception as exc:
        raise combiner_error(exc, key) from exc


def combiner_error(exc: Exception, key: Any) -> UserFunctionError:
    """The error for the combiner's exception ``exc`` on ``key`` (raise it ``from exc``)."""
    return UserFunctionError(
        f"The combiner raised {type(exc).__name__}: {exc}\n  for key {short(key)}",
        function="combiner",
        where=repr(key)[:200],
    )


class NotPicklable(MapReduceError):
    """A key or value of the shuffle cannot be pickled into a spill file. Raised and
    caught inside a map task (which finds the record that yielded it, see
    ``_tasks.unpicklable_error``); pickles as text only, its ``key`` dropped.

    Attributes:
        key: the key (``None`` once pickled); ``key_repr``, ``value_repr`` their reprs.
        part: ``"key"`` or ``"value"``, the one that cannot be pickled.
    """

    def __init__(self, key: Any, key_repr: str, value_repr: str, part: str) -> None:
        super().__init__(f"the {part} for key {key_repr} cannot be pickled ({value_repr})")
        self.key = key
        self.key_repr = key_repr
        self.value_repr = value_repr
        self.part = part

    def __reduce__(self) -> Any:
        return (NotPicklable, (None, self.key_repr, self.value_repr, self.part))


def pickle_error(obj: Any) -> Exception | None:
    """Why ``obj`` cannot be pickled as the shuffle pickles it, or None when it can."""
    try:
        pickle.dumps(obj, protocol=_PROTOCOL)
    except Exception as exc:  # TypeError, PicklingError, AttributeError (local classes)...
        return exc
    return None


def not_picklable(entries: Sequence[tuple[Any, list[Any]]]) -> NotPicklable | None:
    """The :class:`NotPicklable` for the first key or value of ``entries`` that does not
    pickle, its cause that key's or value's error; None when each pickles."""
    for key, values in entries:
        why = pickle_error(key)
        if why is not None:
            error = NotPicklable(key, short(key), short(key), "key")
            error.__cause__ = why
            return error
        for value in values:
            why = pickle_error(value)
            if why is not None:
                error = NotPicklable(key, short(key), short(value), "value")
                error.__cause__ = why
                return error
    return None


class SegmentWriter:
    """Writes one segment at the current position of ``f``: a header, then entries given
    in key order, batched into records. ``values`` counts the values written."""

    def __init__(self, f: BinaryIO, str_only: bool, record_values: int = 4096) -> None:
        self._f = f
        self._record: list[tuple[Any, list[Any]]] = []
        self._weight = 0
        self.record_values = record_values  # entry budget of a record, adapted to sizes
        self.values = 0
        self.start = f.tell()
        f.write(pickle.dumps((*FORMAT, str_only), protocol=_PROTOCOL))

    def add(self, key: Any, values: list[Any]) -> None:
        """Write ``key``'s ``values`` (a list), split into chunks when it is long."""
        self.values += len(values)
        chunk = min(CHUNK_VALUES, self.record_values)
        if len(values) <= chunk:
            self._record.append((key, values))
            self._weight += len(values) + 1
        else:
            for i in range(0, len(values), chunk):
                self._record.append((key, values[i : i + chunk]))
                self._weight += chunk + 1
                if self._weight >= self.record_values:
                    self._flush()
        if self._weight >= self.record_values:
            self._flush()

    def add_sorted(self, keys: list[Any], lists: Mapping[Any, list[Any]]) -> None:
        """:meth:`add` for every key of ``keys`` (in key order) with ``lists[key]``."""
        add = self.add
        record = self._record
        for key in keys:
            values = lists[key]
            n = len(values)
            if n > 1 or self._weight + 2 >= self.record_values:
                add(key, values)  # the general case: chunking, flushing
                record = self._record
            else:  # one value (or none), the record has room: the inlined fast path
                record.append((key, values))
                self.values += n
                self._weight += n + 1

    def add_single(self, keys: list[Any], lists: Mapping[Any, list[Any]]) -> None:
        """:meth:`add_sorted` where every list of ``lists`` holds exactly one value (the
        caller has checked): the same records, each filled by one ``extend`` in C."""
        record_values = self.record_values
        start, end = 0, len(keys)
        while start < end:
            # keys (weight 2 each) until the record reaches its budget, as add() flushes
            room = max(1, (record_values - self._weight + 1) // 2)
            chunk = keys[start : start + room]
            self._record.extend(zip(chunk, map(lists.__getitem__, chunk), strict=True))
            self._weight += 2 * len(chunk)
            self.values += len(chunk)
            start += len(chunk)
            if self._weight >= record_values:
                self._flush()
                record_values = self.record_values

    def _flush(self) -> None:
        try:
            data = pickle.dumps(self._record, protocol=_PROTOCOL)
        except Exception:
            error = not_picklable(self._record)  # a key or value that does not pickle
            if error is None:
                raise
            raise error from error.__cause__
        self._f.write(data)
        if len(data) > RECORD_BYTES:  # values are large: fewer per record from now on
            self.record_values = max(1, self.record_values * RECORD_BYTES // len(data))
        self._record = []
        self._weight = 0

    def close(self) -> int:
        """Write what is batched; the segment's length in bytes."""
        if self._record:
            self._flush()
        return self._f.tell() - self.start


class _Reader:
    """One segment opened: its header read, its entries streamed record by record."""

    def __init__(self, segment: Segment) -> None:
        self.path, self.offset, self.length = segment
        self._file = open(self.path, "rb", buffering=READ_BUFFER)  # noqa: SIM115
        try:
            self._file.seek(self.offset)
            header = self._load()
            if not (isinstance(header, tuple) and header[:2] == FORMAT and len(header) == 3):
                raise self._corrupt(f"its header is {short(header)}, not {FORMAT!r}")
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

    def close(self) -> None:
        self._file.close()

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


class Merged:
    """The entries of several sorted segments as one sorted stream (``heapq.merge``);
    ``str_only`` when every segment is. Opens every segment at once: a caller merges at
    most ``MERGE_FACTOR`` (see :func:`merge_files`). ``close()`` closes the files."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        from paralela.mapreduce._hashing import order

        readers: list[_Reader] = []
        try:
            for segment in segments:
                readers.append(_Reader(segment))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        self._streams = [reader.entries() for reader in readers]
        self.str_only = all(reader.str_only for reader in readers)
        if self.str_only:
            self.entries: Iterator[tuple[Any, list[Any]]] = heapq.merge(*self._streams, key=_first)
        else:
            self.entries = heapq.merge(*self._streams, key=lambda entry: order(entry[0]))

    def close(self) -> None:
        for stream in self._streams:
            stream.close()

    def groups(self) -> Iterator[tuple[Any, Iterator[Any]]]:
        """``(key, values)`` per distinct key; ``values`` streams the key's values and is
        valid until the next group is asked for (what is left unread is skipped)."""
        from paralela.mapreduce._hashing import same_key

        entries = self.entries
        same = operator.eq if self.str_only else same_key
        following: list[Any] = [_END]
        entry = next(entries, _END)
        while entry is not _END:
            key = entry[0]
            values = _values(key, entry[1], entries, following, same)
            yield key, values
            deque(values, maxlen=0)  # skip what the caller left unread
            entry = following[0]


def _values(
    key: Any,
    first: list[Any],
    entries: Iterator[tuple[Any, list[Any]]],
    following: list[Any],
    same: Callable[[Any, Any], bool],
) -> Iterator[Any]:
    """The values of ``key``; leaves the next key's first entry in ``following[0]``."""
    yield from first
    for entry in entries:
        if entry[0] is key or same(entry[0], key):
            yield from entry[1]
        else:
            following[0] = entry
            return
    following[0] = _END


def merge_files(
    files: Sequence[dict[int, Segment]],
    path: Path,
    combiner: Callable[[Any, Iterator[Any]], Any] | None,
    *,
    temporary: bool = False,
) -> tuple[dict[int, Segment], int]:
    """Merge the segments of ``files`` (each a dict partition -> segment of one file)
    into one new file at ``path``, partition by partition; its segments and the number
    of values written. With
    ``combiner``, each key's values are combined to one value on the way.

    The file is written through :func:`paralela._files.replacing` (complete or absent),
    or, when ``temporary``, created with ``O_EXCL`` under a name the caller chose to be
    ignored by readers (``_files.TMP_PREFIX``) and deletes on any error.

    Raises:
        UserFunctionError: the combiner raised.
        MapReduceError, OSError: a segment cannot be read, or the file cannot be written.
    """
    from paralela import _files

    partitions = sorted({p for file in files for p in file})
    written: dict[int, Segment] = {}
    values = 0
    if temporary:
        try:
            with _files.open_new(path) as f:
                values = _merge_into(f, files, partitions, combiner, written, str(path))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    else:
        with _files.replacing(path) as f:
            values = _merge_into(f, files, partitions, combiner, written, str(path))
    return written, values


def _merge_into(
    f: BinaryIO,
    files: Sequence[dict[int, Segment]],
    partitions: list[int],
    combiner: Callable[[Any, Iterator[Any]], Any] | None,
    written: dict[int, Segment],
    name: str,
) -> int:
    total = 0
    for partition in partitions:
        merged = Merged([file[partition] for file in files if partition in file])
        try:
            writer = SegmentWriter(f, merged.str_only)
            if combiner is None:
                for key, chunk in merged.entries:
                    writer.add(key, chunk)
            else:
                for key, values in merged.groups():
                    writer.add(key, [combine(combiner, key, values)])
            written[partition] = (name, writer.start, writer.close())
            total += writer.values
        finally:
            merged.close()
    return total


def remove(paths: Sequence[str]) -> None:
    """Delete files that are no longer needed (a missing one is fine)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
