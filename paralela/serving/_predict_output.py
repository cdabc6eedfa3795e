"""What ``predict`` writes: one part file per shard, and ``_SUCCESS`` when all are there.

::

    worker:  rows of one shard ──ShardWriter──> temp file next to the part (_files.replacing)
               {"shard": 3, "row": 0, "input": ..., "output": ...}     fsync, rename
                                                       ──> output/part-00003.jsonl|parquet
    driver:  every shard done ──> empty Parquet parts typed like the others, stale parts of
               a former run removed, _SUCCESS (JSON: format, records, each part's source)

The output directory is checked, claimed and finished by ``paralela.files``: only
the files paralela recorded there as its own are ever replaced or removed.

A row holds ``shard`` (the part's number: the shard it was read from), ``row`` (the
record's position in the shard, from 0), ``input`` (the record as read; left out with
``keep_input=False``) and ``output`` (what ``predict`` returned for it). Parts in name
order, rows in file order, are the input order. Outputs that are numpy arrays, tensors
or numpy scalars are written as lists and numbers (``.tolist()``), pydantic models (an
``output_model``'s instances) as dicts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from paralela.errors import MissingExtraError
from paralela.files import finish_output_dir, temp_prefix
from paralela.serving._model import ModelError
from paralela.tasks import short_repr

__all__ = ["FORMATS", "ShardWriter", "part_path", "type_empty_parts", "write_success"]

#: Output formats and the extension of their part files.
FORMATS = {"jsonl": "jsonl", "parquet": "parquet"}
# Rows per Parquet row group written at once: large enough that the per-group cost
# vanishes, small enough that a worker holds few outputs (embeddings) in memory.
_PARQUET_ROWS = 8192


def part_path(directory: str | os.PathLike[str], shard: int, fmt: str) -> Path:
    """``directory/part-00003.jsonl``: the part file of a shard."""
    return Path(directory) / f"part-{shard:05d}.{FORMATS[fmt]}"


def plain(value: Any) -> Any:
    """``value`` with arrays, tensors and numpy scalars made plain lists and numbers, and
    a pydantic model (an ``output_model``'s instance) made a dict of JSON values."""
    if hasattr(value, "model_dump") and hasattr(type(value), "model_fields"):
        return value.model_dump(mode="json")
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        try:
            return value.tolist()
        except Exception:  # not numpy's tolist: leave it to the writer to judge
            return value
    return value


class ShardWriter:
    """Writes one shard's rows to an open (temporary) file, in ``fmt``.

    ``add`` and ``close`` raise :class:`ModelError` when an output cannot be written in
    the format (JSON cannot hold it, or it does not fit the Parquet column's type);
    ``where(first, last)`` says where the shard's records ``first..last`` come from, for
    that message.
    """

    def __init__(
        self,
        f: BinaryIO,
        fmt: str,
        shard: int,
        keep_input: bool,
        model: str,
        where: Callable[[int, int], str],
    ) -> None:
        self.where = where
        self.f = f
        self.fmt = fmt
        self.shard = shard
        self.keep_input = keep_input
        self.model = model
        self.rows = 0
        self._encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
        self._columns: dict[str, list[Any]] = {"shard": [], "row": []}
        if keep_input:
            self._columns["input"] = []
        self._columns["output"] = []
        self._writer: Any = None
        self._pa: Any = None

    def add(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Write a batch's rows."""
        if self.fmt == "jsonl":
            self._add_jsonl(inputs, outputs)
        else:
            self._add_parquet(inputs, outputs)
        self.rows += len(inputs)

    def _add_jsonl(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        lines = []
        row = self.rows
        for record, output in zip(inputs, outputs, strict=True):
            obj: dict[str, Any] = {"shard": self.shard, "row": row}
            if self.keep_input:
                obj["input"] = record
            obj["output"] = plain(output)
            try:
                lines.append(self._encode(obj))
            except (TypeError, ValueError) as exc:
                raise ModelError(
                    f"{self.model}.predict returned {short_repr(output)} for "
                    f"{self.where(row, row)}; JSON cannot hold it ({exc}). Return numbers, "
                    "strings, lists, dicts or arrays."
                ) from exc
            row += 1
        self.f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))

    def _add_parquet(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        columns = self._columns
        start = self.rows
        columns["shard"].extend([self.shard] * len(inputs))
        columns["row"].extend(range(start, start + len(inputs)))
        if self.keep_input:
            columns["input"].extend(inputs)
        columns["output"].extend(plain(o) for o in outputs)
        if len(columns["row"]) >= _PARQUET_ROWS:
            self._flush()

    def _flush(self) -> None:
        pa = self._pa or _pyarrow()
        self._pa = pa
        columns = self._columns
        first, last = columns["row"][0], columns["row"][-1]
        try:
            if self._writer is None:
                table = pa.table(columns)
                self._writer = pa.parquet.ParquetWriter(self.f, table.schema)
            else:
                table = pa.Table.from_pydict(columns, self._writer.schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ModelError(
                f"The outputs of {self.model}.predict for {self.where(first, last)} cannot "
                f"be written as Parquet ({type(exc).__name__}: {exc}). Every output of a "
                "shard must have one type (its first rows' type), and every input too; "
                "return uniform outputs, or use output_format='jsonl'."
            ) from exc
        self._writer.write_table(table)
        for values in columns.values():
            values.clear()

    def close(self) -> None:
        """Finish the file (Parquet: the last rows and the footer)."""
        if self.fmt != "parquet":
            return
        if self._columns["row"]:
            self._flush()
        if self._writer is None:  # an empty shard: its columns, typed null
            pa = _pyarrow()
            names = list(self._columns)
            self._writer = pa.parquet.ParquetWriter(
                self.f, pa.schema([(name, pa.null()) for name in names])
            )
        self._writer.close()


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise MissingExtraError("pyarrow", "parquet", "Parquet output") from exc
    return pyarrow


def type_empty_parts(paths: Sequence[str], rows: Sequence[int]) -> None:
    """Give the empty Parquet parts the schema of the first part with rows, so readers
    that take one file's schema for all (``pyarrow.parquet.read_table(dir)``) read them."""
    from paralela._files import replacing

    typed = next((p for p, n in zip(paths, rows, strict=True) if n), None)
    if typed is None or not typed.endswith(".parquet"):
        return
    pa = _pyarrow()
    schema = pa.parquet.read_schema(typed)
    for path, n in zip(paths, rows, strict=True):
        if not n:
            with replacing(path, temp_prefix(Path(path).parent)) as f:
                pa.parquet.ParquetWriter(f, schema).close()


def write_success(directory: Path, fmt: str, model: str, parts: Sequence[dict[str, Any]]) -> None:
    """``directory/_SUCCESS``, written last: JSON naming the model, the format, and each
    part's file, source (the shard's file and range) and records. paralela's own files
    that are not these parts (a former run's) and its temp files are removed first."""
    data = {
        "model": model,
        "format": fmt,
        "records": sum(int(p["records"]) for p in parts),
        "parts": list(parts),
    }
    finish_output_dir(directory, [str(p["file"]) for p in parts], data)
