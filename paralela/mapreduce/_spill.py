"""The map side of the shuffle: buffer pairs by key, combine, spill sorted runs to disk.

    add / add_all ──> buffer: dict key -> [values]          (one dict lookup per pair)
         │   with a combiner, a pair whose value is the run value (the same object as the
         └─> first pair's: the 1 of `yield word, 1`) only counts: runs: dict key -> count
                        │ every 16..CHECK_EVERY pairs: estimate bytes (sampled sizes x counts)
                        │   a combiner, and COMBINE_AVERAGE values per key, or over
                        │   memory_limit?          combine every list to one value in place
                        │   over memory_limit (half of it after combining)?      spill
                        ▼
    spill:  runs combined into the buffer: combiner(key, chain(buffered, repeat(value, n)))
            keys ─partition_of─> P lists ─sort by key order─> one spill file, a segment
            per partition (format in ._segments)
    close:  last spill; more than MAP_FILES spill files are merged (with the combiner)
            into one, so a reduce task opens at most MAP_FILES segments per map task

The combiner may run zero, one or several times on a key's values (while buffering,
at each spill): it must accept its own results as values, as Hadoop's and Spark's do.
Counting a run changes nothing it sees: it gets the very objects the mapper yielded, in
the order yielded for each key (a key's counted run follows its buffered values; a pair
of another value first combines the key's run into its list). Without a combiner there
are no runs: every value is written as it came.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any

from paralela import _files
from paralela.errors import MapReduceError, UserFunctionError
from paralela.mapreduce._counting import Tally as _Tally
from paralela.mapreduce._counting import count_runs as _count_runs
from paralela.mapreduce._hashing import order, partition_of
from paralela.mapreduce._pairs import CHECKED_PAIRS
from paralela.mapreduce._pairs import NOTHING as _NOTHING
from paralela.mapreduce._pairs import check_first as _check_first
from paralela.mapreduce._pairs import pair_problem as _pair_problem
from paralela.mapreduce._pairs import raise_pair_error as _raise_pair_error
from paralela.mapreduce._pairs import size as _size
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
# With a combiner, a pair whose value is the run value (the very object of the first pair's
# value) is counted, one dict update, instead of appended and combined later: the natural
# word-count mapper (`yield word, 1`) then costs about what Counter.update costs. Measured
# on one 12.5 MB split of bench_mapreduce.py's corpus, CPU time, best of 3, in one run on
# the shared 2-core VM: list-append loop 0.73 s, counting loop 0.46-0.53 s, batched
# mapper (Counter in C) 0.32 s. Runs are combined into the buffer at a spill, when a pair
# of another value comes for a key that has a run, and when the pairs since the last time
# average RUN_COMBINE_AVERAGE a key (a run costs no memory: this only makes a combiner
# that raises fail while buffering rather than at the end of the task).
# The counting loop itself is compiled where a C compiler was (_counting, _speedups.c).
RUN_COMBINE_AVERAGE = 256
# Runs stop when more than 1/RUN_MISSES of the pairs (after RUN_PROBE pairs) are of other
# values (`yield word, len(word)`): the run value is chosen again from the next pair, up
# to RUN_CHOICES times, then runs are off for the task and each pair is appended as
# before. A pair of another value costs a few calls (~0.5 µs), a counted one saves
# ~0.2 µs on a 50 MB task (the lists and sweeps it no longer makes): at 1/8 runs still
# win. Measured: 1M pairs of 1 (80 %) or 0, Zipf keys: 3.2x the CPU with 1/2, as before
# with 1/8.
RUN_MISSES = 8
RUN_PROBE = 1024
RUN_CHOICES = 3
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
_UNSET: Any = object()  # the run value before the first pair
_OFF: Any = object()  # no runs: no combiner, or too few pairs were of the run value
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
        # Runs (see RUN_COMBINE_AVERAGE): key -> how many pairs of the run value follow
        # the key's buffered values (a Tally, counted in place: see _counting).
        self._runs: dict[Any, Any] = {}
        self._run_value: Any = _OFF if combiner is None else _UNSET
        self._run_pairs = 0  # pairs added since the runs were last combined
        self._run_seen = 0  # pairs added since the run value was chosen (at least)
        self._run_misses = 0  # of these, pairs of another value
        self._run_hits = 0  # and pairs of the run value whose runs were combined
        self._run_choices = 0
        self._unchecked = CHECKED_PAIRS  # pairs still to check one by one (see _pairs)

    # -- adding pairs -------------------------------------------------------------------

    def add(self, key: Any, value: Any) -> None:
        """Add one pair.

        Raises:
            UserFunctionError: the key is unhashable (function="mapper"), or the
                combiner raised while the buffer was compacted (function="combiner").
        """
        try:
            if self._runs:
                self._take_run(key)
            self._buf[key].append(value)
        except TypeError:
            raise UserFunctionError(_pair_problem((key, value)) or "", function="mapper") from None
        self._pending += 1
        if self._run_value is not _OFF:
            self._values += 1
            self.stats.pairs_in += 1
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
        if self._unchecked > 0:
            if type(pairs) is not list:
                pairs = self._iterate(pairs)
            pairs, checked = _check_first(pairs, self._unchecked)
            self._unchecked -= checked
        if self._run_value is not _OFF:
            it = self._iterate(pairs)
            while not self._add_runs(it):
                if self._run_value is _OFF:  # too few pairs of the run value: lists
                    self._add_lists(it)
                    return
            return
        self._add_lists(pairs)

    def _add_lists(self, pairs: Iterable[Any]) -> None:
        """:meth:`add_all`, each value appended to its key's list."""
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
        it = self._iterate(pairs)
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

    @staticmethod
    def _iterate(pairs: Iterable[Any]) -> Iterator[Any]:
        try:
            return iter(pairs)
        except TypeError:
            raise UserFunctionError(
                f"The mapper returned {short(pairs)} (type {type(pairs).__name__}), which "
                "is not iterable; a mapper yields (key, value) pairs or returns a list of them.",
                function="mapper",
            ) from None

    def _add_runs(self, it: Iterator[Any]) -> bool:
        """Add pairs of ``it`` up to the next size check, counting those of the run
        value; whether ``it`` is exhausted."""
        runs = self._runs
        one = self._run_value
        other = self._add_other
        budget = self._every - self._pending
        if self._run_seen < RUN_PROBE:  # a check soon, to drop a run value few pairs have
            budget = min(budget, RUN_PROBE)
        grown = len(runs) + self._run_misses
        seen = [_NOTHING]
        try:
            # The hot loop of a word count: one dict update a pair, compiled where it
            # could be (see _counting); whether `it` ran dry is found by a look ahead.
            _count_runs(runs, it, one, other, budget, seen)
        except (TypeError, ValueError) as exc:
            _raise_pair_error(exc, seen[0])
        kv = seen[0]
        if kv is _NOTHING:
            return True
        if type(kv) is not tuple and not isinstance(kv, (tuple, list)):
            raise UserFunctionError(_pair_problem(kv) or "", function="mapper")
        ahead = next(it, _NOTHING)
        if ahead is _NOTHING:  # fewer than budget pairs: at least those that grew the buffer
            self._pending += max(1, len(runs) + self._run_misses - grown)
            if self._pending >= self._every:
                self._check(kv[0], kv[1])
            return True
        try:
            k, v = ahead
            other(k, v)
        except (TypeError, ValueError) as exc:
            _raise_pair_error(exc, ahead)
        self._pending += budget + 1
        self._check(k, v)
        return False

    def _add_other(self, key: Any, value: Any) -> None:
        """A pair whose value is not the run value (the first pair, the first after the
        run value was dropped: that value becomes the run value)."""
        if self._run_value is _UNSET:
            self._run_value = value
            self._run_seen = self._run_misses = self._run_hits = 0
        try:
            if value is self._run_value:
                tally = self._runs.get(key)
                if tally is None:
                    self._runs[key] = _Tally(1)
                else:
                    tally.n += 1
                return
            if self._runs:
                self._take_run(key)
            self._buf[key].append(value)
        except TypeError:
            raise UserFunctionError(_pair_problem((key, value)) or "", function="mapper") from None
        self._values += 1
        self._run_misses += 1
        self.stats.pairs_in += 1

    def _take_run(self, key: Any) -> None:
        """Combine the run of ``key`` (if any) into its list: a value of another kind
        comes next, and must follow it."""
        tally = self._runs.pop(key, None)
        if tally is not None:
            n = tally.n
            self.stats.pairs_in += n
            self._run_hits += n
            self._combine_run(key, n)

    def _combine_run(self, key: Any, n: int) -> None:
        one = self._run_value
        buf = self._buf
        if n <= COMBINE_AVERAGE:  # a short run joins the list: no combiner call a miss
            buf[key].extend(repeat(one, n))
            self._values += n
            return
        values = buf.get(key)
        if not values:
            it: Iterator[Any] = repeat(one, n)
        else:
            it = chain(values, repeat(one, n))
            self._values -= len(values)
        try:
            buf[key] = [self._combiner(key, it)]  # type: ignore[misc]
        except MapReduceError:
            raise
        except Exception as exc:
            raise combiner_error(exc, key) from exc
        self._values += 1

    def _combine_runs(self) -> None:
        """Combine every run into the buffer (before a spill, or to let the combiner run)."""
        runs = self._runs
        if runs:
            buf, one, combiner = self._buf, self._run_value, self._combiner
            key: Any = None
            hits = values_added = 0
            try:
                for key, tally in runs.items():  # _combine_run inlined: a key a loop turn
                    n = tally.n
                    hits += n
                    values = buf.get(key)
                    if values:
                        values_added -= len(values) - 1
                        buf[key] = [combiner(key, chain(values, repeat(one, n)))]  # type: ignore[misc]
                    else:
                        values_added += 1
                        buf[key] = [one] if n == 1 else [combiner(key, repeat(one, n))]  # type: ignore[misc]
            except MapReduceError:
                raise
            except Exception as exc:
                raise combiner_error(exc, key) from exc
            finally:
                self._values += values_added
            self.stats.pairs_in += hits
            self._run_hits += hits
            runs.clear()
        self._run_pairs = 0

    def _check_runs(self) -> None:
        """At a size check: combine the runs when long; drop a run value too few pairs have."""
        self._run_pairs += self._pending
        self._run_seen += self._pending
        if self._run_seen >= RUN_PROBE and RUN_MISSES * self._run_misses > self._run_seen:
            # _run_seen counts at least the pairs seen: count them exactly before dropping.
            counted = sum(tally.n for tally in self._runs.values())
            self._run_seen = self._run_misses + self._run_hits + counted
        if self._run_seen >= RUN_PROBE and RUN_MISSES * self._run_misses > self._run_seen:
            self._combine_runs()
            self._run_choices += 1
            self._run_value = _OFF if self._run_choices >= RUN_CHOICES else _UNSET
        elif self._run_pairs > RUN_COMBINE_AVERAGE * len(self._runs):
            self._combine_runs()

    def add_mapping(self, mapping: Mapping[Any, Any]) -> None:
        """Add every item of ``mapping`` as a pair (what a batched mapper returned): its
        keys are hashable and distinct, so no item needs checking. The buffer's size is
        checked once, after the whole mapping.

        Raises:
            UserFunctionError: the combiner raised (function="combiner").
        """
        if self._runs:
            self._combine_runs()
        buf = self._buf
        k = v = _NOTHING
        for k, v in mapping.items():
            buf[k].append(v)
        self._pending += len(mapping)
        if self._run_value is not _OFF:
            self._values += len(mapping)
            self.stats.pairs_in += len(mapping)
        if self._pending >= self._every and k is not _NOTHING:
            self._check(k, v)

    # -- memory -------------------------------------------------------------------------

    def _check(self, key: Any, value: Any) -> None:
        """Refresh the size estimate from one sampled pair; combine or spill if over."""
        if self._run_value is _OFF:  # every pair is a value in the buffer
            self.stats.pairs_in += self._pending
            self._values += self._pending
        else:  # pairs and values were counted as they came (runs: when combined)
            self._check_runs()
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
        keys = len(self._buf) + len(self._runs)
        estimate = int(keys * self._key_size + self._values * self._value_size)
        if estimate > self.stats.peak_buffer_bytes:
            self.stats.peak_buffer_bytes = estimate
        return estimate

    def _combine_all(self) -> None:
        self._values = _combine_lists(self._combiner, self._buf)

    # -- spilling -----------------------------------------------------------------------

    def _spill(self) -> None:
        self._combine_runs()
        buf = self._buf
        if not buf:
            return
        parts = self._partitions
        keys_of: list[list[Any]] = [[] for _ in range(parts)]
        str_only = set(map(type, buf)) == {str}
        if str_only:  # partition_of inlined: ~0.15 µs a key instead of ~0.5
            encoded = map(str.encode, buf, repeat("utf-8"), repeat("surrogatepass"))
            for key, h in zip(buf, map(_crc32, encoded), strict=True):
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
        # Lists of one value each (a word count's): no combining pass, and the writer
        # fills each record in one go (add_single).
        lengths = set(map(len, buf.values()))
        if self._combiner is not None and max(lengths) > 1:
            _combine_lists(self._combiner, buf)
            lengths = set(map(len, buf.values()))
        single = lengths == {1}
        path = self._directory / f"{self._name}-spill-{self.stats.spills:04d}"
        segments: dict[int, Segment] = {}
        values_written = []
        with _files.replacing(path) as f:
            for partition, keys in enumerate(keys_of):
                if not keys:
                    continue
                keys.sort(key=None if str_only else order)
                writer = SegmentWriter(f, str_only, self._record_values)
                if single:
                    writer.add_single(keys, buf)
                else:
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
            if self._run_value is _OFF:
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
