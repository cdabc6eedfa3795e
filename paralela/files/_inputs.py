"""The inputs of a MapReduce job: plan them into splits, read a split's records.

::

    inputs ──plan_splits──> Split, Split, ...   (in the driver, before any work; small,
      │                                          picklable: a path and bounds, never data)
      ├─ path, directory, glob, list of these   files in sorted order; per file by suffix:
      │    text / .jsonl .ndjson / .csv          byte ranges of about split_bytes
      │    *.gz                                  one split per file (gzip cannot be split)
      │    .parquet .pq                          ranges of row groups of about split_bytes
      └─ any other iterable of records          chunks of records_per_split, pulled lazily
    Split ──read_split──> records                (in a worker; see _formats.py)
    Split, record index ──locate──> "corpus/a.txt line 12"   (only when reporting errors)
    splits ──group_splits──> map tasks           (small splits joined, up to split_bytes)
    splits ──input_identity──> digest            (what a run directory's resume checks)

Inputs are planned in the order given, each directory or glob's files sorted by name; a
file named twice is read once. Directories give the regular files directly in them,
skipping hidden names and names starting with ``_`` (as Hadoop and Spark do: a former
job's ``_SUCCESS``); use ``'dir/**/*'`` to read subdirectories. A ``str`` is always a path
or a glob; to use a list of strings as records, pass ``format="records"``. A glob skips
hidden files (as the shell does) but not ``_`` names: it reads what it matches.

CSV files are split by bytes like text, each split reading the header from the file's
first line. A quoted field that spans lines cannot be split that way: a split that meets
one raises :class:`~paralela.errors.InputError` asking for ``split_bytes=0``, which reads
every file as one split (a file that is one split anyway reads such fields correctly).
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from paralela.errors import ConfigError, InputError, UnpicklableError
from paralela.files._formats import (
    csv_rows,
    display,
    first_line_start,
    line_blocks,
    line_number,
    pyarrow_parquet,
    read_batches,
)

__all__ = [
    "FORMATS",
    "MIN_SPLIT_BYTES",
    "Split",
    "group_splits",
    "input_identity",
    "locate",
    "parse_split_bytes",
    "plan_splits",
    "read_split",
    "read_split_batches",
]

FORMATS = ("text", "jsonl", "csv", "parquet", "records")
#: ``min_splits`` never cuts a file below this (unless ``split_bytes`` is smaller): a
#: split of 256 KiB reads in about 1 ms, so smaller ones cost more to schedule than to read.
MIN_SPLIT_BYTES = 256 * 1024
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True, repr=False)
class Split:
    """One map task's share of the input: a byte range of a file, a range of a Parquet
    file's row groups, a whole gzip file, or a chunk of in-memory records.

    Attributes:
        index: position in plan order, ``0..n-1``.
        format: ``"text"``, ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"records"``.
        path: the file's absolute path; ``None`` for records.
        start: text/jsonl/csv: first byte; parquet: first row group; records: index of
            the first record in the input.
        end: exclusive byte offset / row group / record index; ``-1``: to the end.
        compression: ``"gzip"`` or ``None``.
        records: the records themselves (format ``"records"`` only).
        size: bytes this split covers (records: 0).
        encoding: of text, jsonl and csv files.
    """

    index: int
    format: str
    path: str | None
    start: int = 0
    end: int = -1
    compression: str | None = None
    records: tuple[Any, ...] | None = None
    size: int = 0
    encoding: str = "utf-8"

    def describe(self) -> str:
        """Say what the split covers: ``"corpus/a.txt, bytes 0-67,108,864"``,
        ``"data.parquet, row groups 0-3"``, ``"records 0-9,999"``."""
        if self.format == "records":
            return f"records {self.start:,}-{self.end - 1:,}"
        name = display(self.path)
        if self.format == "parquet":
            if self.end < 0:
                return f"{name}, all row groups"
            return f"{name}, row groups {self.start:,}-{self.end - 1:,}"
        if self.end < 0:
            return f"{name} (whole file)"
        return f"{name}, bytes {self.start:,}-{self.end:,}"

    def __repr__(self) -> str:
        return f"Split({self.index}, {self.format}, {self.describe()})"


def parse_split_bytes(value: int | str) -> int:
    """``split_bytes`` as ``mapreduce`` and ``predict`` take it: bytes (``67108864``,
    ``"64MB"``), or ``0`` (``"0"``) for one split per file, which a CSV file with quoted
    fields that span lines needs.

    Raises:
        ConfigError: not a size, or negative.
    """
    from paralela.files._sizes import parse_bytes

    size = parse_bytes(value, "split_bytes")
    if size < 0:
        raise ConfigError(
            f"split_bytes must be 0 (one split per file) or a positive size like '64MB', "
            f"got {value!r}."
        )
    return size


def plan_splits(
    inputs: Any,
    *,
    format: str | None = None,
    split_bytes: int = 64 * 2**20,
    min_splits: int = 1,
    records_per_split: int = 10_000,
    encoding: str = "utf-8",
    min_split_bytes: int = MIN_SPLIT_BYTES,
) -> Iterator[Split]:
    """Plan ``inputs`` into splits (see the module docstring for what inputs may be).

    Files are resolved, checked and measured now, in the caller; records are chunked
    lazily, as the returned iterator is pulled (a generator is never read ahead by more
    than one split).

    Args:
        format: force one format for every file (or ``"records"`` for an iterable);
            default: from each file's suffix.
        split_bytes: about how many bytes a split of a text, jsonl, csv or Parquet file
            covers; ``0``: one split per file.
        min_splits: make at least this many splits over the whole job where the data
            allows, by cutting files finer than ``split_bytes`` (but not below
            ``min_split_bytes``).
        records_per_split: records per split of an in-memory iterable.
        encoding: of text, jsonl and csv files; must write ``"\\n"`` as the byte
            ``0x0a`` (utf-8, utf-8-sig, latin-1, cp1252, ...; not utf-16).

    Raises:
        ConfigError: an unknown format or encoding, or a bad number.
        InputError: a missing path, a pattern matching no file, a directory with no
            files, an unreadable or corrupt (Parquet) file; names it.
        MissingExtraError: a Parquet input without pyarrow installed.
    """
    _check_options(format, split_bytes, min_splits, records_per_split, encoding)
    if _is_records(inputs, format):
        return _record_splits(iter(inputs), records_per_split)
    files = _resolve(inputs)
    return iter(_file_splits(files, format, split_bytes, min_splits, encoding, min_split_bytes))


def group_splits(
    splits: Iterable[Split], split_bytes: int, min_tasks: int
) -> Iterator[tuple[Split, ...]]:
    """The map tasks: consecutive splits of small files joined into tasks of about
    ``min(split_bytes, total / min_tasks)`` bytes (Hadoop's ``CombineFileInputFormat``,
    Spark's ``maxPartitionBytes`` for file sources). Each task writes one set of combined
    pairs, so 16 files of 12 MB on 2 workers make 4 tasks, not 16: a quarter of the pairs
    to spill and merge. A split joins a task while its middle byte stays within the
    target, so splits already near the target stay alone.
    In-memory records keep one task per split, pulled lazily; ``split_bytes=0``
    (one split per file) joins nothing.
    """
    it = iter(splits)
    first = next(it, None)
    if first is None:
        return
    if first.format == "records" or split_bytes <= 0:
        yield (first,)
        for split in it:
            yield (split,)
        return
    planned = [first, *it]
    total = sum(s.size for s in planned)
    target = min(split_bytes, total // max(1, min_tasks))
    task: list[Split] = []
    size = 0
    for split in planned:
        if task and size + split.size / 2 > target:
            yield tuple(task)
            task, size = [], 0
        task.append(split)
        size += split.size
    yield tuple(task)


def read_split(split: Split) -> Iterator[Any]:
    """Stream the split's records: a text line (``str``, no line ending), a JSON value, a
    CSV or Parquet row (``dict``), or an in-memory record as given.

    Raises:
        InputError: the file is gone, unreadable, shrank since planning, not valid in its
            encoding, or holds a malformed JSON line, CSV row, gzip or Parquet data; the
            message names the file and the line (or row group).
        MissingExtraError: a Parquet split without pyarrow installed.
    """
    for batch in read_batches(split):
        yield from batch


def read_split_batches(split: Split) -> Iterator[list[Any]]:
    """:func:`read_split`, a list of records at a time (a block of ~1 MiB of lines, a
    Parquet batch): for engines that loop faster over lists. Raises as ``read_split``."""
    return read_batches(split)


def locate(split: Split, record_index: int) -> str:
    """Where the split's record ``record_index`` (0-based, in read order) comes from:
    ``"corpus/a.txt line 12"`` (1-based line of the file), ``"records item 40"``,
    ``"data.parquet row group 2 row 7"`` (0-based row in the group). Re-reads the split up
    to that record (slow: for error messages). Never raises: if the file cannot be read
    any more, it says which split and record."""
    try:
        return _locate(split, record_index)
    except Exception:
        return f"{split.describe()}, record {record_index}"


def input_identity(splits: Sequence[Split]) -> str:
    """A digest of what was planned: for files their path, size, modification time,
    format and split bounds; for records a digest of their pickles. Equal digests mean the
    same input (as far as sizes and times tell).

    Raises:
        InputError: a file cannot be examined any more.
        UnpicklableError: records that cannot be pickled.
    """
    from paralela.runs import digest_items

    h = hashlib.blake2b(digest_size=16)
    stats: dict[str, str] = {}
    for s in splits:
        if s.path is None:
            try:
                body = digest_items(list(s.records or ()))
            except Exception as exc:
                raise UnpicklableError(
                    f"{s.describe()}: the records cannot be pickled ({type(exc).__name__}: "
                    f"{exc}); records must pickle to reach the workers: pass plain data"
                ) from exc
        else:
            if s.path not in stats:
                try:
                    st = os.stat(s.path)
                except OSError as exc:
                    raise InputError(
                        f"{display(s.path)}: cannot be examined: {exc.strerror or exc}",
                        path=s.path,
                    ) from exc
                stats[s.path] = f"{s.path}\0{st.st_size}\0{st.st_mtime_ns}"
            body = stats[s.path]
        h.update(
            f"{s.index}\0{s.format}\0{s.compression}\0{s.encoding}\0{s.start}\0{s.end}\0"
            f"{body}\n".encode("utf-8", "surrogateescape")
        )
    return h.hexdigest()


# --------------------------------------------------------------------------- planning


def _check_options(
    format: str | None, split_bytes: int, min_splits: int, records_per_split: int, encoding: str
) -> None:
    if format is not None and format not in FORMATS:
        raise ConfigError(f"Unknown input format {format!r}; use one of {', '.join(FORMATS)}")
    for name, value, low in (
        ("split_bytes", split_bytes, 0),
        ("min_splits", min_splits, 1),
        ("records_per_split", records_per_split, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, not {value!r}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ConfigError(f"Unknown encoding {encoding!r}; use e.g. 'utf-8' or 'latin-1'") from None
    if codecs.lookup(encoding).name != "utf-8-sig" and "\n".encode(encoding) != b"\n":
        raise ConfigError(
            f"encoding={encoding!r} does not write a newline as the byte 0x0a, so its files "
            "cannot be split into lines; convert them to utf-8 (iconv -f ... -t utf-8)"
        )


def _is_pathlike(x: Any) -> bool:
    return isinstance(x, str | bytes | os.PathLike)


def _is_records(inputs: Any, format: str | None) -> bool:
    if _is_pathlike(inputs):
        if format == "records":
            raise ConfigError(
                "format='records' needs an iterable of records, but inputs is a single "
                f"{type(inputs).__name__} ({inputs!r}); a string is always a path or a glob"
            )
        return False
    if not isinstance(inputs, Iterable):
        raise ConfigError(
            f"inputs must be a path, a glob, a directory, a list of these, or an iterable "
            f"of records; got {type(inputs).__name__}"
        )
    if format == "records":
        return True
    if isinstance(inputs, list | tuple):
        if not inputs:
            raise InputError(
                "inputs is an empty list: there is nothing to read; pass paths, a glob, or records"
            )
        paths = [_is_pathlike(x) for x in inputs]
        if all(paths):
            return False
        if any(paths):
            raise InputError(
                "inputs mixes paths and records; pass a list of paths, or a list of "
                "records (with format='records' if the records are strings)"
            )
    return True


def _record_splits(it: Iterator[Any], per_split: int) -> Iterator[Split]:
    for index in itertools.count():
        chunk = tuple(itertools.islice(it, per_split))
        if not chunk:
            return
        start = index * per_split
        yield Split(index, "records", None, start=start, end=start + len(chunk), records=chunk)


def _resolve(inputs: Any) -> list[str]:
    items = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
    files: list[str] = []
    seen: set[str] = set()
    for item in items:
        for path in _expand(os.fsdecode(item)):
            absolute = os.path.abspath(path)
            if absolute not in seen:
                seen.add(absolute)
                files.append(absolute)
    return files


def _expand(name: str) -> list[str]:
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        found = sorted(
            entry.path
            for entry in os.scandir(path)
            if not entry.name.startswith((".", "_")) and entry.is_file()
        )
        if not found:
            raise InputError(
                f"{name}: the directory has no files to read (hidden files and names "
                "starting with '_' are skipped, and subdirectories are not read: use "
                f"'{os.path.join(name, '**', '*')}' for them)",
                path=os.path.abspath(path),
            )
        return found
    if os.path.exists(path):
        return [path]
    if glob.has_magic(path):
        found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not found:
            raise InputError(
                f"No file matches the pattern {name!r} (looked from {os.getcwd()}); check "
                "the pattern and the working directory",
                path=name,
            )
        return found
    raise InputError(
        f"{name}: no such file or directory (looked from {os.getcwd()}); check the path",
        path=os.path.abspath(path),
    )


def _format_of(path: str, forced: str | None) -> tuple[str, str | None]:
    lower = path.lower()
    compression = None
    if lower.endswith(".gz"):
        compression = "gzip"
        lower = lower[:-3]
    fmt = forced or _SUFFIXES.get(os.path.splitext(lower)[1], "text")
    if fmt == "parquet" and compression:
        raise InputError(
            f"{display(path)}: a gzip-compressed Parquet file cannot be read; Parquet "
            "compresses its own columns: decompress the file",
            path=path,
        )
    return fmt, compression


def _check_readable(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise InputError(
            f"{display(path)}: cannot be read: {exc.strerror or exc}; give the user running "
            "the job read access to it, or leave it out of the inputs",
            path=path,
        ) from exc


def _row_group_sizes(path: str) -> list[int]:
    pq = pyarrow_parquet()
    try:
        meta = pq.ParquetFile(path).metadata
        return [
            sum(meta.row_group(g).column(c).total_compressed_size for c in range(meta.num_columns))
            for g in range(meta.num_row_groups)
        ]
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError
        raise InputError(
            f"{display(path)}: is not a valid Parquet file ({type(exc).__name__}: {exc}); "
            "it may be corrupt or truncated",
            path=path,
        ) from exc


def _file_splits(
    files: list[str],
    forced: str | None,
    split_bytes: int,
    min_splits: int,
    encoding: str,
    min_split_bytes: int,
) -> list[Split]:
    planned: list[tuple[str, str, str | None, int, list[int] | None]] = []
    for path in files:
        fmt, compression = _format_of(path, forced)
        size = _check_readable(path)
        groups = _row_group_sizes(path) if fmt == "parquet" else None
        planned.append((path, fmt, compression, size, groups))

    target = split_bytes
    if split_bytes > 0:
        fixed = sum(1 for p in planned if p[2] is not None)
        splittable = [p[3] if p[4] is None else sum(p[4]) for p in planned if p[2] is None]
        natural = fixed + sum(max(1, math.ceil(s / split_bytes)) for s in splittable)
        if natural < min_splits:
            # rounded up: rounded down, a file cut by it takes one split more than
            # asked (9 for 8), and at the end one worker waits a split's time for it
            share = -(-sum(splittable) // max(1, min_splits - fixed))
            target = min(split_bytes, max(share, min_split_bytes, 1))

    splits: list[Split] = []

    def add(path: str, fmt: str, compression: str | None, start: int, end: int, size: int) -> None:
        splits.append(Split(len(splits), fmt, path, start, end, compression, None, size, encoding))

    for path, fmt, compression, size, groups in planned:
        if groups is not None:
            for first, last, nbytes in _group_ranges(groups, target):
                add(path, fmt, None, first, last, nbytes)
        elif compression is not None:
            add(path, fmt, compression, 0, -1, size)
        else:
            n = 1 if target == 0 else max(1, math.ceil(size / target))
            for i in range(n):
                start, end = size * i // n, size * (i + 1) // n
                add(path, fmt, None, start, end, end - start)
    return splits


def _group_ranges(sizes: list[int], target: int) -> Iterator[tuple[int, int, int]]:
    """Consecutive row groups of about ``target`` bytes each: ``(first, end, bytes)``.

    A file of ``total`` bytes gets ``ceil(total / target)`` splits (at most one per row
    group); each row group goes to the split its middle byte falls in, so equal groups
    spread evenly."""
    total = sum(sizes)
    if target == 0 or len(sizes) <= 1 or total == 0:
        yield 0, len(sizes), total
        return
    n = min(len(sizes), max(1, math.ceil(total / target)))
    first, nbytes, before, current = 0, 0, 0, 0
    for g, size in enumerate(sizes):
        bin_ = min(n - 1, (2 * before + size) * n // (2 * total))
        if bin_ != current and g > first:
            yield first, g, nbytes
            first, nbytes = g, 0
        current = bin_
        nbytes += size
        before += size
    yield first, len(sizes), nbytes


# --------------------------------------------------------------------------- locating


def _locate(split: Split, k: int) -> str:
    if split.format == "records":
        return f"records item {split.start + k}"
    name = display(split.path)
    if split.format == "parquet":
        meta = pyarrow_parquet().ParquetFile(split.path).metadata
        end = meta.num_row_groups if split.end < 0 else split.end
        row = k
        for group in range(split.start, end):
            rows = meta.row_group(group).num_rows
            if row < rows:
                return f"{name} row group {group} row {row}"
            row -= rows
        return f"{name}, row groups {split.start}-{end - 1}, record {k}"
    if split.format == "csv":
        for i, (rel, _) in enumerate(csv_rows(split)):
            if i == k:
                return f"{name} line {_line_of(split, rel)}"
    elif split.format == "jsonl":
        i = -1
        for offset, lines in line_blocks(split):
            for j, line in enumerate(lines):
                if line and not line.isspace():
                    i += 1
                    if i == k:
                        return f"{name} line {line_number(split, offset)[0] + j}"
    else:
        return f"{name} line {_line_of(split, k)}"
    return f"{split.describe()}, record {k}"


def _line_of(split: Split, rel: int) -> int:
    """The file's 1-based line number of the split's line ``rel`` (0-based)."""
    start = 0
    if split.start > 0:
        with open(split.path or "", "rb") as f:
            start = first_line_start(f, split.start)
    return line_number(split, start)[0] + rel
