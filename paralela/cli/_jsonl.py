"""JSON Lines in and out, strictly: items read as UTF-8 JSON, values written as JSON
that every reader accepts.

::

    --input items.jsonl (- for stdin) ──> each line decoded as UTF-8 on its own,
                           json.loads ──> the item, and the item as strict JSON again
    --glob 'data/*.csv' ──> the matching files, sorted ──> each path is an item
        (a line or file name that cannot be read or written back: exit 2, naming it)

    a result ──> to_json ──> strict JSON in UTF-8: no NaN or Infinity (--nan-as writes
                 them as null or as strings), no lone surrogates; else NotJson, whose
                 message names the part at fault: "the result['loss'] is NaN, ..."

The items are read, and encoded, all before work starts; each result is encoded as it
arrives (``paralela.cli._map``).
"""

from __future__ import annotations

import enum
import glob as globlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from paralela.cli._errors import EXIT_USAGE, fail
from paralela.tasks import short_repr

__all__ = ["NanAs", "NotJson", "read_items", "text_json", "to_json"]


class NanAs(str, enum.Enum):
    """How NaN and ±Infinity, which JSON lacks, are written: an error, null, or a string."""

    error = "error"
    null = "null"
    string = "string"


# -- strict JSON ----------------------------------------------------------------------


class NotJson(ValueError):
    """A value that strict JSON in UTF-8 cannot hold; the message says where and why."""


def _json_default(value: Any) -> Any:
    """Results as JSON: numpy arrays and scalars become lists and numbers, paths strings."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One encoder for every value (json.dumps with options builds one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_json_default)


def to_json(value: Any, nan_as: NanAs, name: str) -> bytes:
    """``value`` as strict JSON in UTF-8, which every JSON reader accepts: no NaN or
    Infinity (unless ``nan_as`` writes them as null or strings), no lone surrogates.

    Raises :class:`NotJson` naming the part of ``value`` at fault, ``name`` its root
    ("the result"): ``the result['loss'] is NaN, ...``.
    """
    try:
        try:
            text = _ENCODER.encode(value)
        except ValueError:
            if nan_as is NanAs.error:
                raise
            text = _ENCODER.encode(_without_nan(value, nan_as))
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError included
        raise NotJson(_why_not_json(value, name, exc)) from None


def _float_name(number: float) -> str:
    """NaN, Infinity or -Infinity: the names JavaScript and Python's json module use."""
    return "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"


def _without_nan(value: Any, nan_as: NanAs) -> Any:
    """``value`` with NaN and ±Infinity replaced by None or by their names."""
    if _is_non_finite(value):
        return None if nan_as is NanAs.null else _float_name(value)
    if isinstance(value, dict):
        return {_without_nan(k, nan_as): _without_nan(v, nan_as) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(v, nan_as) for v in value]
    if hasattr(value, "tolist") or isinstance(value, os.PathLike):
        return _without_nan(_json_default(value), nan_as)
    return value


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _is_not_unicode(value: Any) -> bool:
    """A string with a lone surrogate, as ``errors="surrogateescape"`` makes of bytes
    that are not UTF-8 (file names, input read that way)."""
    if not isinstance(value, str) or value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find(value: Any, bad: Callable[[Any], bool], path: str) -> tuple[str, Any] | None:
    """The first part of ``value`` that is ``bad``, with its path: ``the result['a'][2]``."""
    if bad(value):
        return path, value
    parts: Iterable[tuple[str, Any]] = ()
    if isinstance(value, dict):
        for key in value:
            if bad(key):
                return f"a key of {path}", key
        parts = ((f"{path}[{key!r}]", inner) for key, inner in value.items())
    elif isinstance(value, (list, tuple)):
        parts = ((f"{path}[{i}]", inner) for i, inner in enumerate(value))
    elif hasattr(value, "tolist") or isinstance(value, os.PathLike):
        parts = [(path, _json_default(value))]
    for inner_path, inner in parts:
        found = _find(inner, bad, inner_path)
        if found is not None:
            return found
    return None


def _why_not_json(value: Any, name: str, exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return (
            f"{name} nests too deeply (more levels than Python's recursion limit allows). "
            "Use flatter data."
        )
    try:
        text = _find(value, _is_not_unicode, name)
        number = None if text is not None else _find(value, _is_non_finite, name)
    except Exception:  # too deep to walk (RecursionError), or a tolist() that fails
        text = number = None
    if text is not None:
        where, string = text
        char = next(c for c in string if "\ud800" <= c <= "\udfff")
        return (
            f"{where} holds {char!r}, a lone surrogate: text that is not valid Unicode, "
            "as bytes that are not UTF-8 become when decoded with errors='surrogateescape'. "
            "UTF-8 cannot hold it: decode such bytes as UTF-8, or with errors='replace'."
        )
    if number is not None:
        where, float_value = number
        return (
            f"{where} is {_float_name(float_value)}, which JSON cannot hold. Use null or a "
            "string instead, or pass --nan-as null or --nan-as string to write it so."
        )
    return f"{exc}. Return plain data: dicts, lists, strings, numbers."


def text_json(text: str) -> bytes:
    """A message as a JSON string; a lone surrogate in it is written as ``\\udcff``."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return json.dumps(text, ensure_ascii=False).encode("utf-8")


# -- the items ------------------------------------------------------------------------


def read_items(
    input_path: str | None, pattern: str | None, nan_as: NanAs = NanAs.error
) -> tuple[list[Any], list[bytes]]:
    """The items, from a JSONL file (stdin for ``-``) or the files matching a glob, and
    each item as strict JSON for the output lines. An item that cannot be read, or
    written back, exits with code 2 naming its line (or file)."""
    if pattern is not None:
        if input_path is not None:
            fail(
                "Pass either --input FILE (one JSON item per line) or --glob PATTERN (one "
                "item per matching file), not both.",
                EXIT_USAGE,
            )
        paths = sorted(p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p))
        if not paths:
            fail(
                f"No files match --glob {pattern!r} (from {os.getcwd()}). Check the "
                "pattern, and quote it so that the shell does not expand it.",
                EXIT_USAGE,
            )
        return paths, [_path_json(path) for path in paths]
    if input_path is None:
        fail(
            "Pass the items: --input FILE (one JSON item per line, - for stdin) or "
            "--glob PATTERN (one item per matching file).",
            EXIT_USAGE,
        )
    if input_path == "-":
        # The bytes, decoded here: sys.stdin may decode with errors="surrogateescape".
        return _parse_lines(getattr(sys.stdin, "buffer", sys.stdin), "stdin", nan_as)
    try:
        with open(input_path, "rb") as f:
            return _parse_lines(f, input_path, nan_as)
    except FileNotFoundError:
        fail(f"Input file {input_path} does not exist.", EXIT_USAGE)
    except IsADirectoryError:
        fail(
            f"--input {input_path} is a directory; for one item per file use "
            f"--glob '{input_path.rstrip('/')}/*'.",
            EXIT_USAGE,
        )
    except PermissionError:
        fail(f"Input file {input_path} cannot be read: permission denied.", EXIT_USAGE)


def _path_json(path: str) -> bytes:
    try:
        return to_json(path, NanAs.error, "the path")
    except NotJson:
        fail(
            f"The name of {os.fsencode(path)!r} (from --glob) is not UTF-8, so the output "
            "cannot hold it as text. Rename the file, or narrow the pattern.",
            EXIT_USAGE,
        )


def _parse_lines(
    lines: Iterable[bytes | str], name: str, nan_as: NanAs
) -> tuple[list[Any], list[bytes]]:
    """Each line decoded on its own (so that an error names its real line), parsed, and
    encoded again as strict JSON."""
    items: list[Any] = []
    encoded: list[bytes] = []
    for lineno, raw in enumerate(lines, 1):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                fail(
                    f"{name} line {lineno} is not UTF-8 (byte {raw[exc.start]:#04x} at byte "
                    f"{exc.start + 1} of the line). Save the file as UTF-8.",
                    EXIT_USAGE,
                )
        else:
            line = raw
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(
                f"{name} line {lineno} is not valid JSON ({exc.msg}, column {exc.colno}): "
                f"{short_repr(line.rstrip())}. Each line must hold one JSON value, "
                'e.g. 42, "text" (double quotes) or {"path": "a.csv"}.',
                EXIT_USAGE,
            )
        except RecursionError:
            fail(
                f"{name} line {lineno} nests too deeply to read (more levels than Python's "
                "recursion limit allows). Write flatter items.",
                EXIT_USAGE,
            )
        try:
            encoded.append(to_json(item, nan_as, "the item"))
        except NotJson as exc:
            fail(f"{name} line {lineno} is not strict JSON: {exc}", EXIT_USAGE)
        items.append(item)
    return items, encoded
