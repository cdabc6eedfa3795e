"""Partition files: how a reduce task writes its ``(key, value)`` pairs and how a result
reads them back.

::

    reduce task ──> write_part(pairs, directory, partition, format)
                      temp file next to the target ──fsync──> rename: part-00003.<ext>
    driver     ──> write_success(directory, parts)   _SUCCESS: JSON list of parts, last

An ``output=`` directory is checked, claimed and finished by ``paralela.files``:
only the files paralela recorded there as its own are ever replaced or removed.
    result     ──> read_part(part)  (again on every iteration; nothing kept in memory)

Formats:

- ``pickle``: a stream of pickled lists of pairs (the job's own result files, in the run
  or temporary directory); any picklable key and value.
- ``jsonl``: one ``{"key": ..., "value": ...}`` object per line (UTF-8). Tuples come
  back as lists; a key or value JSON cannot hold (a set, NaN, an object) is an error
  naming the key.
- ``parquet``: columns ``key`` and ``value`` (pyarrow infers their types from the first
  batch; later batches must fit that schema).
- ``text``: one ``key<TAB>value`` line per pair (``str()`` of each; a ``None`` value
  writes the key alone), as Hadoop's ``TextOutputFormat``: what a streaming job
  (commands as mapper and reducer) writes. Read back as strings (a line without a
  tab: the key, and ``None``). A key holding a tab or a line break is an error.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from paralela import files
from paralela._files import replacing
from paralela.errors import MapReduceError, MissingExtraError, UserFunctionError
from paralela.files import SUCCESS_NAME, temp_prefix
from paralela.tasks import short_repr

__all__ = [
    "EXTENSIONS",
    "SUCCESS_NAME",
    "FORMATS",
    "check_output_dir",
    "claim_output_dir",
    "Part",
    "part_name",
    "read_part",
    "remove_own_temporaries",
    "remove_stale_parts",
    "remove_temporaries",
    "type_empty_parquet_parts",
    "write_part",
    "write_success",
]

#: Output formats and the file extension of each.
EXTENSIONS = {"pickle": "pkl", "jsonl": "jsonl", "parquet": "parquet", "text": "txt"}
#: Formats a user may ask for as ``output_format``.
FORMATS = ("jsonl", "parquet", "text")
# Pairs per pickled list (pickle stream) or per Parquet row batch: large enough that the
# per-batch cost vanishes, small enough that a reader holds little.
_BATCH = 4096
_PARQUET_BATCH = 65536


@dataclass(frozen=True)
class Part:
    """One written partition file: its path, format and how many pairs it holds."""

    partition: int
    path: str
    format: str
    pairs: int
    bytes: int


def part_name(partition: int, fmt: str) -> str:
    """``part-00003.jsonl``: the file name of a partition in a format."""
    return f"part-{partition:05d}.{EXTENSIONS[fmt]}"


def write_part(
    pairs: Iterable[tuple[Any, Any]], directory: str | os.PathLike[str], partition: int, fmt: str
) -> Part:
    """Write ``pairs`` to ``directory/part-NNNNN.<ext>`` atomically (a crash leaves the old
    file or none, never half of one).

    Raises:
        UserFunctionError: a key or value cannot be written in ``fmt`` (names the key).
        MissingExtraError: Parquet without pyarrow.
        OSError: the directory cannot be written (a full disk, permissions).
    """
    path = Path(directory) / part_name(partition, fmt)
    with replacing(path, temp_prefix(directory)) as f:
        if fmt == "pickle":
            count = _write_pickle(pairs, f)
        elif fmt == "jsonl":
            count = _write_jsonl(pairs, f)
        elif fmt == "parquet":
            count = _write_parquet(pairs, f)
        elif fmt == "text":
            count = _write_text(pairs, f)
        else:  # checked by the API before work starts
            raise ValueError(f"unknown output format {fmt!r}")
    return Part(partition, str(path), fmt, count, path.stat().st_size)


def _write_pickle(pairs: Iterable[tuple[Any, Any]], f: BinaryIO) -> int:
    count = 0
    batch: list[tuple[Any, Any]] = []
    dump = pickle.dump
    for pair in pairs:
        batch.append(pair)
        if len(batch) >= _BATCH:
            dump(batch, f, pickle.HIGHEST_PROTOCOL)
            count += len(batch)
            batch = []
    if batch:
        dump(batch, f, pickle.HIGHEST_PROTOCOL)
        count += len(batch)
    return count


def _not_writable(key: Any, what: str, fmt: str, exc: BaseException) -> UserFunctionError:
    error = UserFunctionError(
        f"The reducer's result for key {short_repr(key)} cannot be written as {fmt}: "
        f"the {what} cannot be encoded ({exc}). Return values {fmt} can hold (numbers, "
        "strings, lists, dicts), or leave output= unset to keep Python objects.",
        function="reducer",
        where=short_repr(key),
    )
    error.__cause__ = exc
    return error


def _write_jsonl(pairs: Iterable[tuple[Any, Any]], f: BinaryIO) -> int:
    count = 0
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
    lines: list[str] = []
    for key, value in pairs:
        try:
            lines.append(encode({"key": key, "value": value}))
        except (TypeError, ValueError) as exc:
            bad_key = not _json_ok(key)
            raise _not_writable(key, "key" if bad_key else "value", "JSON", exc) from exc
        if len(lines) >= _BATCH:
            f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
            count += len(lines)
            lines = []
    if lines:
        f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
        count += len(lines)
    return count


def _write_text(pairs: Iterable[tuple[Any, Any]], f: BinaryIO) -> int:
    count = 0
    lines: list[str] = []
    for key, value in pairs:
        text = str(key)
        if "\t" in text or "\n" in text or "\r" in text:
            raise _not_writable(key, "key", "text", ValueError("a key holds a tab or a line break"))
        value_text = "" if value is None else "\t" + str(value).replace("\n", " ")
        lines.append(text + value_text)
        if len(lines) >= _BATCH:
            f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
            count += len(lines)
            lines = []
    if lines:
        f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        count += len(lines)
    return count


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise MissingExtraError("pyarrow", "parquet", "Parquet output") from exc
    return pyarrow


def _write_parquet(pairs: Iterable[tuple[Any, Any]], f: BinaryIO) -> int:
    pa = _pyarrow()
    writer: Any = None
    count = 0
    keys: list[Any] = []
    values: list[Any] = []

    def flush() -> None:
        nonlocal writer
        try:
            if writer is None:
                table = pa.table({"key": keys, "value": values})
                writer = pa.parquet.ParquetWriter(f, table.schema)
            else:
                table = pa.Table.from_pydict({"key": keys, "value": values}, writer.schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise _not_writable(keys[0], "batch of pairs from it on", "Parquet", exc) from exc
        writer.write_table(table)
        keys.clear()
        values.clear()

    try:
        for key, value in pairs:
            keys.append(key)
            values.append(value)
            if len(keys) >= _PARQUET_BATCH:
                count += len(keys)
                flush()
        if keys or writer is None:
            count += len(keys)
            if keys:
                flush()
            else:  # an empty partition: the two columns, typed null (they take the
                # other parts' types when a reader unifies the files' schemas)
                writer = pa.parquet.ParquetWriter(
                    f, pa.schema([("key", pa.null()), ("value", pa.null())])
                )
    finally:
        if writer is not None:
            writer.close()
    return count


def type_empty_parquet_parts(parts: list[Part]) -> None:
    """Give the Parquet parts of empty partitions the schema of the first part with rows
    (a reduce task writing an empty partition cannot know it), so that readers that take
    one file's schema for all (``pyarrow.parquet.read_table(dir)``, Spark) read them all."""
    typed = next((p for p in parts if p.format == "parquet" and p.pairs), None)
    if typed is None:
        return
    pa = _pyarrow()
    schema = pa.parquet.read_schema(typed.path)
    for part in parts:
        if part.format == "parquet" and not part.pairs:
            with replacing(part.path, temp_prefix(Path(part.path).parent)) as f:
                pa.parquet.ParquetWriter(f, schema).close()


def read_part(part: Part) -> Iterator[tuple[Any, Any]]:
    """The pairs of one partition file, streamed.

    Raises:
        MapReduceError: the file is gone or damaged (names it).
    """
    try:
        if part.format == "pickle":
            yield from _read_pickle(part.path)
        elif part.format == "jsonl":
            with open(part.path, "rb") as f:
                for line in f:
                    obj = json.loads(line)
                    yield obj["key"], obj["value"]
        elif part.format == "text":
            with open(part.path, encoding="utf-8", errors="surrogateescape", newline="\n") as t:
                for text in t:
                    key, tab, value = text.removesuffix("\n").partition("\t")
                    yield key, (value if tab else None)
        else:
            pq = _pyarrow().parquet
            for batch in pq.ParquetFile(part.path).iter_batches():
                yield from zip(
                    batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
                )
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, KeyError) as exc:
        raise MapReduceError(
            f"The result file {part.path} cannot be read ({type(exc).__name__}: {exc}); it "
            "was removed or damaged after the job wrote it. Run the job again."
        ) from exc


def _read_pickle(path: str) -> Iterator[tuple[Any, Any]]:
    with open(path, "rb") as f:
        load = pickle.load
        while True:
            try:
                batch = load(f)
            except EOFError:
                return
            yield from batch


def write_success(directory: str | os.PathLike[str], parts: list[Part]) -> None:
    """Write ``directory/_SUCCESS``: the JSON list of parts, written last, so its presence
    says every part is complete; paralela's own files that are not these parts (a former
    run's) and its temp files are removed first."""
    data = {
        "parts": [
            {"partition": p.partition, "file": Path(p.path).name, "pairs": p.pairs} for p in parts
        ],
        "format": parts[0].format if parts else None,
        "pairs": sum(p.pairs for p in parts),
    }
    files.finish_output_dir(directory, [Path(p.path).name for p in parts], data)


def remove_stale_parts(directory: str | os.PathLike[str], keep: Iterable[str]) -> None:
    """Remove the files a former run of paralela's left in the output ``directory`` that
    this run did not write (it had more partitions, or another format); only files
    paralela recorded there as its own, whatever their names."""
    files.remove_stale(directory, [Path(p).name for p in keep])


def remove_temporaries(directory: str | os.PathLike[str]) -> None:
    """Remove the temporary files (``_files.TMP_PREFIX``) in a directory of paralela's
    own (spills, a run directory): a task stopped mid-write when another failed, or on
    Ctrl-C. For an output directory use :func:`remove_own_temporaries`."""
    from paralela._files import TMP_PREFIX

    for path in Path(directory).glob(TMP_PREFIX + "*"):
        if path.is_file():
            path.unlink(missing_ok=True)


def remove_own_temporaries(directory: str | os.PathLike[str]) -> None:
    """Remove the temp files paralela made in the output ``directory`` (their names carry
    the token it recorded there), never anyone else's."""
    files.remove_own_temporaries(directory)


def check_output_dir(directory: str | os.PathLike[str], mode: str = "errorifexists") -> Path:
    """The output directory, made if missing; refuses (``mode="errorifexists"``) or
    deletes (``"overwrite"``) the files there that paralela did not write.

    Raises:
        ConfigError: ``directory`` is a file, or holds files paralela did not write
            (names a few) and ``mode`` is ``"errorifexists"``.
    """
    return files.check_output_dir(directory, mode)


def claim_output_dir(directory: str | os.PathLike[str], partitions: int, fmt: str) -> None:
    """Record in ``directory`` that this job writes ``partitions`` parts in ``fmt`` (see
    :func:`paralela.files.claim_output_dir`), before the first is written."""
    files.claim_output_dir(directory, [part_name(p, fmt) for p in range(partitions)])
