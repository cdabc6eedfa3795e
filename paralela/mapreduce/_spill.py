"""The map side of the shuffle: buffer pairs by key, combine, spill sorted runs to disk.

    add / add_all ──> buffer: dict key -> [values]          (one dict lookup per pair)
                        │ every 16..CHECK_EVERY pairs: estimate bytes (sampled sizes x counts)
                        │   a combiner, and COMBINE_AVERAGE values per key, or over
                        │   memory_limit?          combine every list to one value in place
                        │   over memory_limit (half of it after combining)?      spill
                        ▼
    spill:  keys ─partition_of─> P lists ─sort by key order─> one spill file, a segment
            per partition (format in ._segments)
    close:  last spill; more than MAP_FILES spill files are merged (with the combiner)
            into one, so a reduce task opens at most MAP_FILES segments per map task

The combiner may run zero, one or several times on a key's values (while buffering,
at each spill): it must accept its own results as values, as Hadoop's and Spark's do.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn

from paralela import _files
from paralela.errors import MapReduceError, UserFunctionError
from paralela.mapreduce._hashing import order, partition_of
from paralela.mapreduce._segments import (
    MERGE_FACTOR,
    Segment,
    SegmentWriter,
    combiner_error,
    merge_files,
    not_picklable,
    remove,
    short,
)

__all__ = ["MapOutput", "Segment", "ShuffleStats"]

# How often (in pairs) the buffer's size is estimated, at most. add_all runs up to that
# many pairs in one tight loop between checks (a check costs about a microsecond: two
# getsizeof samples and a multiplication), so checks cost < 0.1 % of the loop. Fewer
# pairs when they are large: the next check comes when half the room left under
# memory_limit would be filled at the sampled size of a pair (a new key and its value),
# but never sooner than MIN_CHECK_EVERY pairs; the first check comes after
# MIN_CHECK_EVERY pairs. So the buffer passes memory_limit by about MIN_CHECK_EVERY
# pairs larger than any sampled before at most.
CHECK_EVERY = 8192
MIN_CHECK_EVERY = 16
# With a combiner, the buffer is combined in place (each list of 2+ values to one value)
# when it holds more than COMBINE_AVERAGE values per key on average: a sweep costs one
# pass over the keys, so at most 1/COMBINE_AVERAGE of a key visit per pair added.
# Measured: 10M (word, 1) pairs, Zipf over 50k words, prebuilt in a list, one add_all
# call, combiner=sum, memory_limit=512 MiB, on this project's 2-core VM shared with
# other jobs (best of 2): no sweeps 5.0-5.4M pairs/s with an 89 MB buffer; 8: 5.8M/s,
# 12 MB; 32: 5.7M/s, 21 MB; 128: 5.6M/s, 60 MB. Short lists are faster (appends stay
# in cache) and far smaller; 16 sits between 8 and 32. With 16, later, under a load of
# 5 on 2 cores (best of 3, add_all + close): 5.4M pairs/s for the list; 2.7M pairs/s
# when each 10-word line goes through add_all(mapper(line)), mapper a generator that
# yields (word, 1), against 3.4M tokens/s for Counter.update(line.split()) measured in
# the same run. A per-pair dict append in Python costs ~100-150 ns, so ~10M pairs/s
# per core is out of reach this way; the generator mapper alone costs ~100 ns a pair.
COMBINE_AVERAGE = 16
# Most spill files a map task leaves; close() merges more into one. Each costs the
# reduce side an open segment; merging costs a read and a write of the spilled bytes.
MAP_FILES = 4
# Bytes a buffered key costs beyond its own object: dict slot and index (~40 with the
# table's spare room), its list object (56) and the list's spare capacity.
_KEY_OVERHEAD = 120
# A sampled value referenced from this many places is shared (small ints, interned
# strings): it costs its list slot, not another copy of itself.
_SHARED_REFS = 16
_LIST_SLOT = 8
_NOTHING: Any = object()
_crc32 = zlib.crc32


@dataclass
class ShuffleStats:
    """What a :class:`MapOutput` did. Attributes, or ``stats["pairs_in"]`` alike.

    Attributes:
        pairs_in: pairs added.
        pairs_out: values in the files close() leaves, after combining.
        spills: spill files written (before any merge).
        merges: files written by merging spills at close (see MAP_FILES).
        bytes_spilled: bytes of the files close() leaves: what the reduce side reads.
        peak_buffer_bytes: the largest estimated size of the in-memory buffer.
    """

    pairs_in: int = 0
    pairs_out: int = 0
    spills: int = 0
    merges: int = 0
    bytes_spilled: int = 0
    peak_buffer_bytes: int = 0

    def __getitem__(self, name: str) -> int:
        value: int = getattr(self, name)
        return value

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return asdict(self)


class MapOutput:
    """The pairs of one map task, partitioned, combined, sorted and spilled to files.

    Args:
        partitions: number of reduce partitions (at least 1).
        directory: where spill files go (it must exist); names start with ``name``.
        combiner: ``combiner(key, values_iterator) -> value`` run on the map side, or None.
        memory_limit: bytes the buffer may hold (estimated) before it spills.
        name: prefix of the spill files, e.g. ``"map-00012"``.

    On failure (a bad pair, a combiner that raises, a full disk) nothing is cleaned up
    here: spill files written so far stay complete, and a spill in progress leaves only
    a temporary file (``_files.TMP_PREFIX``) that readers ignore; the task's caller
    deletes or reuses them.
    """

    def __init__(
        self,
        partitions: int,
        directory: str | os.PathLike[str],
        *,
        combiner: Callable[[Any, Iterator[Any]], Any] | None,
        memory_limit: int,
        name: str,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions!r}")
        if memory_limit < 1:
            raise ValueError(
                f"memory_limit must be a positive number of bytes, not {memory_limit!r}"
            )
        self._partitions = partitions
        self._directory = Path(directory)
        self._combiner = combiner
        self._limit = memory_limit
        self._name = name
        self._buf: defaultdict[Any, list[Any]] = defaultdict(list)
        self._values = 0  # values in the buffer as of the last check
        self._pending = 0  # pairs added since the last check
        self._every = MIN_CHECK_EVERY  # pairs between checks, set by each check
        self._key_size = 64.0 + _KEY_OVERHEAD  # running estimates, refined by sampling
        self._value_size = 32.0 + _LIST_SLOT
        self._record_values = 4096
        self._files: list[dict[int, Segment]] = []  # the segments of each spill file
        self._file_values: list[int] = []  # and the values in it
        self._closed = False
        self.stats = ShuffleStats()

    # -- adding pairs -------------------------------------------------------------------

    def add(self, key: Any, value: Any) -> None:
        """Add one pair.

        Raises:
            UserFunctionError: the key is unhashable (function="mapper"), or the
                combiner raised while the buffer was compacted (function="combiner").
        """
        try:
            self._buf[key].append(value)
        except TypeError:
            raise UserFunctionError(_pair_problem((key, value)) or "", function="mapper") from None
        self._pending += 1
        if self._pending >= self._every:
            self._check(key, value)

    def add_all(self, pairs: Iterable[Any]) -> None:
        """Add every ``(key, value)`` pair of ``pairs`` (what one mapper call returned).

        An exception raised by ``pairs`` itself (the user's generator) propagates as it is.

        Raises:
            UserFunctionError: ``pairs`` is not iterable, or an item is not a 2-tuple or
                2-list, or its key is unhashable (function="mapper"; the message shows
                the item); or the combiner raised (function="combiner").
        """
        buf = self._buf
        kv = _NOTHING
        if type(pairs) is list and self._pending + len(pairs) < self._every:
            # Fast path for a mapper that returns a short list: no islice, no enumerate.
            try:
                for kv in pairs:
                    k, v = kv
                    buf[k].append(v)
            except (TypeError, ValueError) as exc:
                _raise_pair_error(exc, kv)
            if kv is not _NOTHING and type(kv) is not tuple and not isinstance(kv, (tuple, list)):
                raise UserFunctionError(_pair_problem(kv) or "", function="mapper")
            self._pending += len(pairs)
            return
        try:
            it = iter(pairs)
        except TypeError:
            raise UserFunctionError(
                f"The mapper returned {short(pairs)} (type {type(pairs).__name__}), which "
                "is not iterable; a mapper yields (key, value) pairs or returns a list of them.",
                function="mapper",
            ) from None
        budget = self._every - self._pending  # pairs until the next size check
        while True:
            n = 0
            kv = _NOTHING
            try:
                for n, kv in enumerate(islice(it, budget), 1):  # noqa: B007
                    k, v = kv
                    buf[k].append(v)
            except (TypeError, ValueError) as exc:
                _raise_pair_error(exc, kv)
            if kv is not _NOTHING and type(kv) is not tuple and not isinstance(kv, (tuple, list)):
                raise UserFunctionError(_pair_problem(kv) or "", function="mapper")
            self._pending += n
            if self._pending >= self._every:
                self._check(kv[0], kv[1])
            if n < budget:
                return
            budget = self._every - self._pending

    def add_mapping(self, mapping: Mapping[Any, Any]) -> None:
        """Add every item of ``mapping`` as a pair (what a batched mapper returned): its
        keys are hashable and distinct, so no item needs checking. The buffer's size is
        checked once, after the whole mapping.

        Raises:
            UserFunctionError: the combiner raised (function="combiner").
        """
        buf = self._buf
        k = v = _NOTHING
        for k, v in mapping.items():
            buf[k].append(v)
        self._pending += len(mapping)
        if self._pending >= self._every and k is not _NOTHING:
            self._check(k, v)

    # -- memory -------------------------------------------------------------------------

    def _check(self, key: Any, value: Any) -> None:
        """Refresh the size estimate from one sampled pair; combine or spill if over."""
        self.stats.pairs_in += self._pending
        self._values += self._pending
        self._pending = 0
        vsize = _LIST_SLOT
        if sys.getrefcount(value) < _SHARED_REFS:
            vsize += _size(value)
        ksize = _KEY_OVERHEAD + _size(key)
        # A larger sample counts at once (safe), a smaller one lowers the average slowly.
        self._value_size = max(vsize, self._value_size + (vsize - self._value_size) * 0.125)
        self._key_size = max(ksize, self._key_size + (ksize - self._key_size) * 0.125)
        combined = False
        if self._combiner is not None and self._values > COMBINE_AVERAGE * len(self._buf):
            self._combine_all()
            combined = True
        if self._estimate() > self._limit:
            if self._combiner is not None and not combined:
                self._combine_all()
            if self._combiner is None or self._estimate() > self._limit // 2:
                self._spill()
        room = self._limit - self._estimate()
        every = int(room / (2 * (self._key_size + self._value_size)))
        self._every = max(MIN_CHECK_EVERY, min(CHECK_EVERY, every))

    def _estimate(self) -> int:
        estimate = int(len(self._buf) * self._key_size + self._values * self._value_size)
        if estimate > self.stats.peak_buffer_bytes:
            self.stats.peak_buffer_bytes = estimate
        return estimate

    def _combine_all(self) -> None:
        self._values = _combine_lists(self._combiner, self._buf)

    # -- spilling -----------------------------------------------------------------------

    def _spill(self) -> None:
        buf = self._buf
        if not buf:
            return
        parts = self._partitions
        keys_of: list[list[Any]] = [[] for _ in range(parts)]
        str_only = all(type(key) is str for key in buf)
        if str_only:  # partition_of inlined: ~0.15 µs a key instead of ~0.5
            for key, h in zip(buf, map(_crc32, _encoded(buf)), strict=True):
                keys_of[h % parts].append(key)
        else:
            try:
                for key in buf:
                    keys_of[partition_of(key, parts)].append(key)
            except Exception:
                error = not_picklable([(k, []) for k in buf])  # a key that does not pickle
                if error is None:
                    raise
                raise error from error.__cause__
        if self._combiner is not None:
            _combine_lists(self._combiner, buf)
        path = self._directory / f"{self._name}-spill-{self.stats.spills:04d}"
        segments: dict[int, Segment] = {}
        values_written = []
        with _files.replacing(path) as f:
            for partition, keys in enumerate(keys_of):
                if not keys:
                    continue
                keys.sort(key=None if str_only else order)
                writer = SegmentWriter(f, str_only, self._record_values)
                writer.add_sorted(keys, buf)
                segments[partition] = (str(path), writer.start, writer.close())
                values_written.append(writer.values)
                self._record_values = writer.record_values
        self._files.append(segments)
        self._file_values.append(sum(values_written))
        self.stats.spills += 1
        buf.clear()
        self._values = 0

    def close(self) -> dict[int, list[Segment]]:
        """Spill what is buffered; the segments of every partition that has data.

        Calling it again returns the same segments. Raises as :meth:`add_all` does for
        the combiner, and ``OSError`` when the spill cannot be written.
        """
        if not self._closed:
            self.stats.pairs_in += self._pending
            self._values += self._pending
            self._pending = 0
            self._estimate()
            self._spill()
            merged = 0
            while len(self._files) > MAP_FILES:
                group = self._files[:MERGE_FACTOR]
                path = self._directory / f"{self._name}-merged-{merged:04d}"
                file, values = merge_files(group, path, self._combiner)
                self._files = [*self._files[MERGE_FACTOR:], file]
                self._file_values = [*self._file_values[MERGE_FACTOR:], values]
                remove(sorted({seg[0] for file in group for seg in file.values()}))
                merged += 1
            self.stats.merges = merged
            self._closed = True
            self.stats.pairs_out = sum(self._file_values)
            paths = {segment[0] for file in self._files for segment in file.values()}
            self.stats.bytes_spilled = sum(os.path.getsize(path) for path in paths)
        by_partition: dict[int, list[Segment]] = {}
        for spilled in self._files:
            for partition, segment in spilled.items():
                by_partition.setdefault(partition, []).append(segment)
        return dict(sorted(by_partition.items()))


def _combine_lists(combiner: Any, buf: dict[Any, list[Any]]) -> int:
    """Combine, in place, every list of two values or more in ``buf`` to a list of one;
    the values left. The combiner's exception becomes a UserFunctionError naming the key
    (as ``_segments.combine`` does)."""
    values = 0
    key: Any = None
    try:
        for key, lst in buf.items():
            if len(lst) > 1:
                buf[key] = [combiner(key, iter(lst))]
                values += 1
            else:
                values += len(lst)
    except MapReduceError:
        raise
    except Exception as exc:
        raise combiner_error(exc, key) from exc
    return values


def _encoded(keys: Iterable[str]) -> Iterator[bytes]:
    """Each key's bytes as ``partition_of`` hashes them."""
    for key in keys:
        yield key.encode("utf-8", "surrogatepass")


def _size(obj: Any) -> int:
    """``getsizeof`` plus, for tuples and lists, that of their first few items scaled."""
    size = sys.getsizeof(obj)
    if type(obj) is tuple or type(obj) is list:
        head = obj[:8]
        if head:
            size += sum(map(sys.getsizeof, head)) * len(obj) // len(head)
    return size


def _raise_pair_error(exc: BaseException, item: Any) -> NoReturn:
    """Raise the error for ``exc``, raised while adding ``item``: a UserFunctionError when
    ``item`` is not a usable pair, else ``exc`` itself (the user's iterator raised it)."""
    tb = exc.__traceback__
    problem = None if item is _NOTHING else _pair_problem(item)
    if problem is None or (tb is not None and tb.tb_next is not None):
        raise exc
    raise UserFunctionError(problem, function="mapper") from None


def _pair_problem(item: Any) -> str | None:
    """Why ``item`` is not a usable pair, or None when it is one."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        kind = type(item).__name__
        length = f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""
        return (
            f"The mapper yielded {short(item)} (a {kind}{length}), not a (key, value) "
            "pair; a mapper yields 2-tuples, e.g. `yield word, 1`, or returns a list of them."
        )
    try:
        hash(item[0])
    except TypeError:
        return (
            f"The mapper yielded a pair whose key {short(item[0])} is unhashable (type "
            f"{type(item[0]).__name__}); keys must be hashable: use a tuple instead of a "
            "list, a frozenset instead of a set."
        )
    return None
