"""Readers of one split of each input format, and the errors they raise.

::

    text, jsonl, csv (a byte range [start, end) of a file, or a whole gzip file)
      _chunks ─(offset, bytes of whole lines, each block ~1 MiB)─> _line_blocks (decode once)
        text:   the lines                          ("\\r\\n" and "\\n" endings removed)
        jsonl:  json.loads(line) for each non-blank line
        csv:    csv.reader(lines) ─> dict(zip(header, row)); the header is line 1 of the file
    parquet   pyarrow.parquet.ParquetFile.iter_batches(row_groups) ─> a dict per row
    records   the tuple the split holds

Line ownership (Hadoop's rule): a line belongs to the split holding its first byte. A
split with ``start > 0`` skips the partial line it begins in (it looks at byte
``start - 1`` and discards through the next ``b"\\n"``); it reads lines while a line's
first byte is before ``end``, and finishes the last one past ``end``. So a line longer
than a split is read once, by the split where it starts.

Nothing counts lines while reading: a line number is computed only for an error or for
:func:`paralela.files.locate`, by counting ``b"\\n"`` before the offset.
Every failure to read is an :class:`~paralela.errors.InputError` naming the file, and the
line when there is one.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, cast

from paralela.errors import InputError, MissingExtraError

if TYPE_CHECKING:
    from paralela.files._inputs import Split

__all__ = [
    "BLOCK_BYTES",
    "csv_rows",
    "display",
    "first_line_start",
    "line_blocks",
    "line_number",
    "pyarrow_parquet",
    "read_batches",
]

#: Bytes read at a time. Measured on this machine (one core, a 50 MB file of ASCII lines
#: of 0-15 words): decoding a ~1 MiB block once and then ``str.split("\\n")`` runs at
#: ~445 MB/s, against ~200-240 MB/s for ``bytes.split`` then decoding each line; blocks of
#: 1 MiB and 4 MiB read equally fast, so the smaller one keeps memory low. End to end,
#: ``read_split`` streams that file at ~300 MB/s and ``read_split_batches`` at ~460 MB/s.
BLOCK_BYTES = 1 << 20
_PARQUET_BATCH_ROWS = 65_536


def display(path: str | None) -> str:
    """The path as the user most likely wrote it: relative to the working directory when
    the file is under it, else absolute."""
    if path is None:
        return "records"
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith(os.pardir) else rel


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, imported on first use.

    Raises:
        MissingExtraError: pyarrow is not installed (``pip install 'paralela[parquet]'``).
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError("pyarrow", "parquet", "Reading Parquet inputs") from None
    return pq


# --------------------------------------------------------------------------- opening


def _open(split: Split) -> IO[bytes]:
    """Open the split's file for reading bytes (decompressing a gzip file).

    Raises:
        InputError: the file is gone, not readable (the OS reason), or not a file.
    """
    path = split.path
    assert path is not None  # callers only pass file splits
    try:
        if split.compression == "gzip":
            return cast("IO[bytes]", gzip.GzipFile(filename=path, mode="rb"))
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise InputError(
            f"{display(path)}: the file no longer exists (it did when the job was planned); "
            "restore it, or run the job again without it",
            path=path,
        ) from None
    except OSError as exc:
        raise InputError(
            f"{display(path)}: cannot be read: {exc.strerror or exc}; give the user running "
            "the job read access to it, or leave it out of the inputs",
            path=path,
        ) from exc


def _read_failed(split: Split, exc: BaseException) -> InputError:
    name = display(split.path)
    if split.compression == "gzip" and not isinstance(exc, InputError):
        message = (
            f"{name}: is not a valid gzip file ({type(exc).__name__}: {exc}); it may be "
            "truncated or not gzip at all: check it with 'gzip -t', or rename it without .gz "
            "if it is plain text"
        )
    else:
        message = f"{name}: reading failed: {exc}; check the file and the disk it is on"
    return InputError(message, path=split.path)


def _shrank(split: Split, size: int) -> InputError:
    return InputError(
        f"{display(split.path)}: the file is now {size:,} bytes, but it had at least "
        f"{split.end:,} when the job was planned; it changed while the job ran. Do not "
        "modify inputs during a job; run it again",
        path=split.path,
    )


# --------------------------------------------------------------------------- lines


def first_line_start(f: IO[bytes], start: int) -> int:
    """Offset of the first line that starts at or after ``start`` (``start > 0``): look
    at byte ``start - 1`` and skip through the next newline. ``-1`` at end of file."""
    f.seek(start - 1)
    pos = start - 1
    while True:
        data = f.read(65_536)
        if not data:
            return -1
        i = data.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(data)


def _chunks(split: Split, block: int = BLOCK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, data)``: the bytes of whole lines the split owns, in blocks of
    about ``block`` bytes, each ending with ``b"\\n"`` (but the file's unterminated last
    line); ``offset`` is where ``data`` starts in the (decompressed) file.

    Raises:
        InputError: the file cannot be opened or read, is a corrupt gzip file, or shrank
            since planning.
    """
    with _open(split) as f:
        try:
            yield from _chunks_of(f, split, block)
        except InputError:
            raise
        except (OSError, EOFError, zlib.error) as exc:
            raise _read_failed(split, exc) from exc


def _chunks_of(f: IO[bytes], split: Split, block: int) -> Iterator[tuple[int, bytes]]:
    start, end = split.start, split.end
    if end >= 0 and split.compression is None:
        size = os.fstat(f.fileno()).st_size
        if size < end:
            raise _shrank(split, size)
    pos = 0
    if start > 0:
        pos = first_line_start(f, start)
        if pos < 0 or (end >= 0 and pos >= end):
            return
        f.seek(pos)
    read = f.read
    pieces: list[bytes] = []  # the line being read, when it spans blocks
    offset = pos  # where pieces start
    while end < 0 or pos < end:
        data = read(block if end < 0 else min(block, end - pos))
        if not data:
            if end >= 0:
                raise _shrank(split, pos)
            break
        pos += len(data)
        i = data.rfind(b"\n")
        if i < 0:
            pieces.append(data)
            continue
        if pieces:
            pieces.append(data[: i + 1])
            chunk = b"".join(pieces)
        else:
            chunk = data if i == len(data) - 1 else data[: i + 1]
        yield offset, chunk
        offset += len(chunk)
        rest = data[i + 1 :]
        pieces = [rest] if rest else []
    if end >= 0 and pieces:  # finish the line that started before end
        while True:
            data = read(block)
            if not data:
                break
            i = data.find(b"\n")
            if i >= 0:
                pieces.append(data[: i + 1])
                break
            pieces.append(data)
    if pieces:
        yield offset, b"".join(pieces)


def line_blocks(split: Split, *, keepends: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(offset, lines)``: the split's lines, decoded, block by block; ``offset``
    is the byte offset of the block's first line. Without ``keepends`` the line endings
    (``"\\n"``, ``"\\r\\n"``, and a final unterminated line's ``"\\r"``) are removed; with
    it, each line keeps its ending (what :mod:`csv` wants).

    Raises:
        InputError: bytes not valid in the split's encoding (naming the line and
            column), or any error of reading the file.
    """
    encoding = split.encoding
    # utf-8-sig: the byte order mark can only be at offset 0; the rest is plain utf-8.
    rest = "utf-8" if codecs.lookup(encoding).name == "utf-8-sig" else encoding
    for offset, chunk in _chunks(split):
        try:
            text = chunk.decode(encoding if offset == 0 else rest)
        except UnicodeDecodeError as exc:
            raise _decode_error(split, offset + exc.start, exc) from None
        if keepends:
            lines = text.split("\n")
            last = lines.pop()  # "" when the block ends with a newline
            lines = [line + "\n" for line in lines]
            if last:
                lines.append(last)
            yield offset, lines
            continue
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        elif lines[-1].endswith("\r"):  # the file's last line, without "\n"
            lines[-1] = lines[-1][:-1]
        yield offset, lines


def line_number(split: Split, offset: int) -> tuple[int, int]:
    """The 1-based line and byte column of ``offset`` in the split's (decompressed) file,
    found by counting newlines from its start (slow: used only to report an error)."""
    line, column_start, pos = 1, 0, 0
    with _open(split) as f:
        while pos < offset:
            data = f.read(min(BLOCK_BYTES, offset - pos))
            if not data:
                break
            count = data.count(b"\n")
            if count:
                line += count
                column_start = pos + data.rfind(b"\n") + 1
            pos += len(data)
    return line, offset - column_start + 1


def _decode_error(split: Split, offset: int, exc: UnicodeDecodeError) -> InputError:
    line, column = line_number(split, offset)
    bad = exc.object[exc.start : exc.start + 1]
    hint = (
        "pass encoding='latin-1' if that is what it is"
        if split.encoding.replace("-", "").lower() in ("utf8", "ascii")
        else "pass the encoding it is written in as encoding="
    )
    return InputError(
        f"{display(split.path)} line {line}: byte 0x{bad.hex()} at column {column} is not "
        f"valid {split.encoding}; re-encode the file, or {hint}",
        path=split.path,
        where=f"line {line}",
    )


def _first_line(split: Split, lines_offset: int) -> int:
    """The 1-based file line number of the line starting at ``lines_offset``."""
    return line_number(split, lines_offset)[0]


# --------------------------------------------------------------------------- formats


def read_batches(split: Split) -> Iterator[list[Any]]:
    """The split's records, a list at a time (a block of lines, a Parquet batch).

    Raises:
        InputError: see the module docstring; names the file and line or row group.
        MissingExtraError: a Parquet split without pyarrow installed.
    """
    fmt = split.format
    if fmt == "text":
        for _, lines in line_blocks(split):
            yield lines
    elif fmt == "jsonl":
        yield from _jsonl_batches(split)
    elif fmt == "csv":
        batch: list[Any] = []
        for _, record in csv_rows(split):
            batch.append(record)
            if len(batch) >= 4096:
                yield batch
                batch = []
        if batch:
            yield batch
    elif fmt == "parquet":
        yield from _parquet_batches(split)
    elif fmt == "records":
        yield list(split.records or ())
    else:
        raise InputError(
            f"{display(split.path)}: unknown format {fmt!r}; use one of text, jsonl, csv, "
            "parquet, records",
            path=split.path,
        )


def _jsonl_batches(split: Split) -> Iterator[list[Any]]:
    loads = json.loads
    for offset, lines in line_blocks(split):
        out: list[Any] = []
        for i, line in enumerate(lines):
            if not line or line.isspace():
                continue
            try:
                out.append(loads(line))
            except ValueError as exc:
                number = _first_line(split, offset) + i
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                column = f" at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
                raise InputError(
                    f"{display(split.path)} line {number}: not valid JSON: {reason}{column}; "
                    "each line of a JSONL file must be one JSON value: fix or remove that line",
                    path=split.path,
                    where=f"line {number}",
                ) from exc
        if out:
            yield out


def _read_header(split: Split) -> list[str] | None:
    """The CSV header of the split's file, read from its first line."""
    first = dataclasses.replace(split, start=0, end=-1)
    for _, lines in line_blocks(first, keepends=True):
        for row in csv.reader(lines[:1]):
            return row
        return None
    return None


def _whole_file(split: Split) -> bool:
    if split.start > 0:
        return False
    if split.end < 0:
        return True
    try:
        return split.end >= os.path.getsize(split.path or "")
    except OSError:
        return True


def csv_rows(split: Split) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line, row)`` for each CSV row the split owns: ``line`` is the row's first
    line counted from the split's first line (0-based), ``row`` a dict keyed by the
    file's header (line 1). Missing trailing fields are ``None``; blank lines are skipped.

    Raises:
        InputError: a row with more fields than the header, a quoted field spanning lines
            in a file read as several splits (pass ``split_bytes=0``), a malformed row, or
            any error of reading the file.
    """
    first_offset = [-1]

    def lines() -> Iterator[str]:
        for offset, block in line_blocks(split, keepends=True):
            if first_offset[0] < 0:
                first_offset[0] = offset
            yield from block

    def where(rel: int) -> tuple[int, str]:
        number = _first_line(split, max(first_offset[0], 0)) + rel
        return number, f"{display(split.path)} line {number}"

    header = _read_header(split) if split.start > 0 else None
    reader = csv.reader(lines())
    whole = _whole_file(split)
    seen = 0  # lines consumed before the current row
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            number, at = where(seen)
            raise InputError(
                f"{at}: malformed CSV: {exc}; fix the row",
                path=split.path,
                where=f"line {number}",
            ) from exc
        rel, seen = seen, reader.line_num
        if seen - rel > 1 and not whole:
            number, at = where(rel)
            raise InputError(
                f"{at}: a quoted field spans several lines, so this CSV file cannot be read "
                "in byte-range splits; pass split_bytes=0 to read each file as one split",
                path=split.path,
                where=f"line {number}",
            )
        if header is None:
            header = row
            continue
        if not row:
            continue
        if len(row) > len(header):
            number, at = where(rel)
            raise InputError(
                f"{at}: {len(row)} fields, but the header (line 1) names {len(header)}; "
                "quote fields that contain the delimiter, or fix the row",
                path=split.path,
                where=f"line {number}",
            )
        record: dict[str, Any] = dict(zip(header, row, strict=False))
        if len(row) < len(header):
            for name in header[len(row) :]:
                record[name] = None
        yield rel, record


def _parquet_batches(split: Split) -> Iterator[list[Any]]:
    pq = pyarrow_parquet()
    name = display(split.path)
    group = split.start
    try:
        pf = pq.ParquetFile(split.path)
        end = pf.metadata.num_row_groups if split.end < 0 else split.end
        for group in range(split.start, end):
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group]):
                yield batch.to_pylist()
    except FileNotFoundError:
        raise InputError(
            f"{name}: the file no longer exists (it did when the job was planned); restore "
            "it, or run the job again without it",
            path=split.path,
        ) from None
    except PermissionError as exc:
        raise InputError(
            f"{name}: cannot be read: {exc.strerror or exc}; give the user running the job "
            "read access to it, or leave it out of the inputs",
            path=split.path,
        ) from exc
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError: a corrupt or changed file
        if isinstance(exc, InputError | MissingExtraError):
            raise
        raise InputError(
            f"{name} row group {group}: cannot be read as Parquet ({type(exc).__name__}: "
            f"{exc}); the file may be corrupt or may have changed since the job was planned",
            path=split.path,
            where=f"row group {group}",
        ) from exc
