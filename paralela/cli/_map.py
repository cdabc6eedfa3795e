"""``paralela map``: a function over the lines of a JSONL file (or over files), in parallel.

::

    MODULE:FUNC ──> import (current directory first on sys.path, like python -m)
    --input items.jsonl | --glob 'data/*.csv' ──> items, read as strict UTF-8 JSON and
                               encoded once, all before work starts (exit 2 names the line)
    paralela.imap(fn, items, ...) ──> each result encoded as strict JSON as it arrives: one
                               JSON cannot hold (NaN, a lone surrogate) fails its item then
    --output results.jsonl ──> {"index", "item", "result"|"error"} per line, in input
                               order, written to a temp file and renamed (never half a file)

Each failure ends in an exit code a shell can act on (see ``_errors``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import glob as globlib
import importlib
import inspect
import json
import math
import os
import sys
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer

from paralela import runs as runs_package
from paralela._config import UNSET
from paralela.backends import available_backends
from paralela.backends._processes import RemoteTraceback
from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    exit_code_for,
    fail,
    tail,
)
from paralela.errors import (
    FingerprintMismatchError,
    MapError,
    ParalelaError,
    RunStoreError,
    TaskError,
    WorkerDiedError,
)
from paralela.mapping import MapIterator, MapSummary, imap
from paralela.mapping._task import short_repr
from paralela.runs._fingerprint import fingerprint_function

__all__ = ["load_function", "map_command", "read_items"]


class OnError(str, enum.Enum):
    raise_ = "raise"
    collect = "collect"


class NanAs(str, enum.Enum):
    """How NaN and ±Infinity, which JSON lacks, are written: an error, null, or a string."""

    error = "error"
    null = "null"
    string = "string"


def usage_error(message: str, detail: str | None = None) -> NoReturn:
    fail(message, EXIT_USAGE, detail)


# -- the function ---------------------------------------------------------------------


def _put_first_on_path(directory: str) -> None:
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)


def _import_module(name: str, shown: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            usage_error(
                f"No module named {missing!r} in the current directory ({os.getcwd()}) "
                "or on the Python path. Run paralela from the directory that holds it, "
                "or name the file: path/to/file.py:func."
            )
        usage_error(
            f"Importing {shown} failed: {exc}. Install the missing package in this environment.",
            tail(_format_exception(exc)),
        )
    except (Exception, SystemExit) as exc:
        usage_error(
            f"Importing {shown} failed: {type(exc).__name__}: {exc}",
            tail(_format_exception(exc)),
        )


def _format_exception(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _module_from_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        usage_error(f"No such file: {path_text}. Give MODULE:FUNC or path/to/file.py:FUNC.")
    if path.suffix != ".py" or not path.stem.isidentifier():
        usage_error(
            f"{path_text} cannot be imported: a module file must be named like "
            "name.py, with a Python identifier as its name."
        )
    # Like `python path/to/file.py`: the file's directory goes first on sys.path, and
    # the workers (which receive this sys.path) import it by the same name.
    _put_first_on_path(str(path.parent.resolve()))
    module = _import_module(path.stem, path_text)
    found = Path(getattr(module, "__file__", None) or "")
    if found.resolve() != path.resolve():
        usage_error(
            f"{path_text} cannot be imported as {path.stem!r}: a module of that name is "
            f"already imported from {found}. Rename the file."
        )
    return module


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``MODULE:FUNC`` or ``path/to/file.py:FUNC`` (``FUNC`` may be dotted).

    The current directory is put first on ``sys.path``, as ``python -m`` does. Every
    problem exits with code 2 and a message saying what to do.
    """
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        usage_error(
            f"Expected MODULE:FUNC, got {spec!r}; e.g. features:extract (features.py in "
            "the current directory), mypkg.features:extract, or path/to/file.py:extract."
        )
    _put_first_on_path(os.getcwd())
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        module = _module_from_file(module_part)
    else:
        module = _import_module(module_part, repr(module_part))
    target: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            owner = ".".join([module_part, *attr.split(".")[:i]])
            usage_error(
                f"{owner} has no attribute {part!r}. {_functions_in(module) if i == 0 else ''}"
            )
    if not callable(target):
        usage_error(
            f"{spec} is not a function (it is of type {type(target).__name__}); name a "
            "function that takes one item."
        )
    return target  # type: ignore[no-any-return]


def _functions_in(module: Any) -> str:
    names = sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and value.__module__ == module.__name__
    )
    return f"Functions defined there: {', '.join(names)}." if names else ""


# -- strict JSON ----------------------------------------------------------------------


class _NotJson(ValueError):
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


def _to_json(value: Any, nan_as: NanAs, name: str) -> bytes:
    """``value`` as strict JSON in UTF-8, which every JSON reader accepts: no NaN or
    Infinity (unless ``nan_as`` writes them as null or strings), no lone surrogates.

    Raises :class:`_NotJson` naming the part of ``value`` at fault, ``name`` its root
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
        raise _NotJson(_why_not_json(value, name, exc)) from None


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


def _text_json(text: str) -> bytes:
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
            usage_error(
                "Pass either --input FILE (one JSON item per line) or --glob PATTERN (one "
                "item per matching file), not both."
            )
        paths = sorted(p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p))
        if not paths:
            usage_error(
                f"No files match --glob {pattern!r} (from {os.getcwd()}). Check the "
                "pattern, and quote it so that the shell does not expand it."
            )
        return paths, [_path_json(path) for path in paths]
    if input_path is None:
        usage_error(
            "Pass the items: --input FILE (one JSON item per line, - for stdin) or "
            "--glob PATTERN (one item per matching file)."
        )
    if input_path == "-":
        # The bytes, decoded here: sys.stdin may decode with errors="surrogateescape".
        return _parse_lines(getattr(sys.stdin, "buffer", sys.stdin), "stdin", nan_as)
    try:
        with open(input_path, "rb") as f:
            return _parse_lines(f, input_path, nan_as)
    except FileNotFoundError:
        usage_error(f"Input file {input_path} does not exist.")
    except IsADirectoryError:
        usage_error(
            f"--input {input_path} is a directory; for one item per file use "
            f"--glob '{input_path.rstrip('/')}/*'."
        )
    except PermissionError:
        usage_error(f"Input file {input_path} cannot be read: permission denied.")


def _path_json(path: str) -> bytes:
    try:
        return _to_json(path, NanAs.error, "the path")
    except _NotJson:
        usage_error(
            f"The name of {os.fsencode(path)!r} (from --glob) is not UTF-8, so the output "
            "cannot hold it as text. Rename the file, or narrow the pattern."
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
                usage_error(
                    f"{name} line {lineno} is not UTF-8 (byte {raw[exc.start]:#04x} at byte "
                    f"{exc.start + 1} of the line). Save the file as UTF-8."
                )
        else:
            line = raw
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            usage_error(
                f"{name} line {lineno} is not valid JSON ({exc.msg}, column {exc.colno}): "
                f"{short_repr(line.rstrip())}. Each line must hold one JSON value, "
                'e.g. 42, "text" (double quotes) or {"path": "a.csv"}.'
            )
        except RecursionError:
            usage_error(
                f"{name} line {lineno} nests too deeply to read (more levels than Python's "
                "recursion limit allows). Write flatter items."
            )
        try:
            encoded.append(_to_json(item, nan_as, "the item"))
        except _NotJson as exc:
            usage_error(f"{name} line {lineno} is not strict JSON: {exc}")
        items.append(item)
    return items, encoded


# -- running --------------------------------------------------------------------------


def _call_indexed(fn: Callable[[Any], Any], fingerprint: str, pair: tuple[int, Any]) -> Any:
    """Runs ``fn`` on one item of an unordered run, tagging the result with its index.

    ``fingerprint`` is unused here: as an argument of the partial it makes the run
    directory's identity follow the code of ``fn``, not only its name.
    """
    index, item = pair
    return index, fn(item)


def _indexed(fn: Callable[[Any], Any]) -> Callable[[tuple[int, Any]], Any]:
    wrapper = functools.partial(_call_indexed, fn, fingerprint_function(fn))
    name = getattr(fn, "__name__", "map")
    # Names for the progress bar and the run manifest.
    wrapper.__name__ = name  # type: ignore[attr-defined]
    wrapper.__qualname__ = f"{getattr(fn, '__qualname__', name)} (unordered)"  # type: ignore[attr-defined]
    return wrapper


def _check_output(output: str) -> Path | None:
    """Where to write: a file (symlinks followed), a device or pipe, or ``None``: stdout."""
    if output == "-":
        return None
    path = Path(output)
    if path.is_dir():
        usage_error(f"--output {output} is a directory; name a file such as results.jsonl.")
    if path.exists() and not path.is_file():
        return path  # /dev/null, a named pipe, >(gzip > out.gz): written directly
    real = Path(os.path.realpath(path))  # a symlink stays a symlink: replace its target
    parent = real.parent
    if not parent.is_dir():
        usage_error(f"The directory {path.parent} for --output does not exist; create it first.")
    if not os.access(parent, os.W_OK):
        usage_error(f"Cannot write --output into {parent}: permission denied.")
    return real


def _parse_chunksize(text: str) -> int | Literal["auto"]:
    if text == "auto":
        return "auto"
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        usage_error(
            f"--chunksize must be 'auto' or a positive integer, got {text!r}. "
            "Use 'auto' unless you have measured a better value."
        )
    return size


def _parse_options(pairs: list[str]) -> dict[str, str]:
    """``["slurm_partition=gpu", ...]`` -> a dict; the backend checks names and values."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            usage_error(
                f"--option expects KEY=VALUE, got {pair!r}; e.g. --option slurm_partition=gpu."
            )
        options[key.strip()] = value.strip()
    return options


@dataclass(frozen=True)
class _Failed:
    """A failed item, as the command reports it."""

    index: int
    error: str  # the "error" field of its output line
    head: str  # its message on stderr
    detail: str = ""  # what follows the message: the tail of a traceback


def _function_failed(
    items: list[Any], index: int, item_repr: str, kind: str, message: str, tb: str, remote: bool
) -> _Failed:
    item = short_repr(items[index]) if 0 <= index < len(items) else item_repr
    said = f": {message}" if message else ""  # KeyboardInterrupt() says nothing
    label = "Remote traceback" if remote else "Traceback"
    detail = f"{label} (last lines):\n{tail(tb)}" if tb else ""
    return _Failed(index, f"{kind}{said}", f"{kind} in item {index} ({item}){said}", detail)


def _failure_of(exc: BaseException, items: list[Any]) -> _Failed | None:
    """The failed item that ``exc`` reports, or ``None``: ``exc`` is not an item failure.

    ``paralela.map`` raises the function's own exception, with ``paralela_index`` and
    (from a worker process) a :class:`RemoteTraceback` as its cause; or a
    :class:`TaskError` (also the records of ``MapError.failures``).
    """
    if isinstance(exc, TaskError):
        if exc.index is None:
            return None
        return _function_failed(
            items, exc.index, exc.item_repr, exc.exc_type, str(exc.args[0]),
            exc.remote_traceback, remote=True,
        )  # fmt: skip
    index = getattr(exc, "paralela_index", None)
    if not isinstance(exc, Exception) or not isinstance(index, int):
        return None
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):  # from a worker process
        tb, remote = cause.tb, True
    else:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
        remote = False
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    item_repr = str(getattr(exc, "paralela_item_repr", "?"))
    return _function_failed(items, index, item_repr, kind, str(exc), tb, remote)


def _encode_results(
    iterator: MapIterator[Any],
    items: list[Any],
    unordered: bool,
    nan_as: NanAs,
    results: list[bytes | None],
    unwritable: list[_Failed],
    stop: bool,
) -> None:
    """Encode each result into ``results`` as it arrives. One that strict JSON cannot
    hold fails its item there and then (in ``unwritable``); with ``stop`` the run stops
    at it, cancelling the work in flight."""
    position = 0
    for value in iterator:
        if unordered:
            if value is None:  # a failed item (collect): MapError reports it at the end
                continue
            index, value = value
        else:
            index, position = position, position + 1
        try:
            results[index] = _to_json(value, nan_as, "the result")
        except _NotJson as exc:
            unwritable.append(
                _Failed(
                    index,
                    f"UnwritableResult: the result cannot be written as JSON: {exc}",
                    f"The result of item {index} ({short_repr(items[index])}) cannot be "
                    f"written as JSON: {exc}",
                )
            )
            if stop:
                iterator.close()
                return


def _records(
    items: list[bytes], results: list[bytes | None], errors: dict[int, str]
) -> Iterator[bytes]:
    """The output lines, in input order, from the items and results as JSON."""
    for index, item in enumerate(items):
        if index in errors:
            error = _text_json(errors[index])
            yield b'{"index": %d, "item": %s, "error": %s}\n' % (index, item, error)
        else:
            result = results[index] or b"null"
            yield b'{"index": %d, "item": %s, "result": %s}\n' % (index, item, result)


def _write_output(path: Path | None, lines: Iterable[bytes]) -> None:
    """Write ``lines`` to a file through a temp file and a rename, so that a crash never
    leaves half a file; to stdout (``None``), a device or a pipe, directly.

    An ``OSError`` (a full disk) propagates; the temp file is removed first.
    """
    if path is None or (path.exists() and not path.is_file()):
        ready = list(lines)
        try:
            with contextlib.ExitStack() as stack:
                if path is None:
                    sys.stdout.flush()
                    out = sys.stdout.buffer
                else:
                    out = stack.enter_context(open(path, "wb"))
                out.writelines(ready)
                out.flush()
        except OSError as exc:
            if path is None:  # what stays in stdout's buffer goes nowhere at exit, quietly
                with contextlib.suppress(OSError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            if isinstance(exc, BrokenPipeError):  # `paralela map ... -o - | head`
                return
            raise
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _kept(run_dir: Path | None) -> str:
    if run_dir is None:
        return (
            "Nothing was kept: with --run-dir DIR the results are kept, and writing them "
            "again needs no computing."
        )
    return (
        f"The results are kept in {run_dir}: run the same command again (once there is "
        "room, or with another --output) to write them without computing them again."
    )


_RUN_STORE_CODE = os.path.dirname(os.path.abspath(runs_package.__file__)) + os.sep
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _run_dir_error(exc: BaseException, run_dir: Path | None) -> OSError | None:
    """The ``OSError`` of writing the run directory (a full disk) that ``exc`` is."""
    if run_dir is None:
        return None
    cause = exc.__cause__
    if isinstance(exc, RunStoreError) and isinstance(cause, OSError) and cause.errno in _DISK_FULL:
        return cause
    if isinstance(exc, OSError) and any(
        frame.f_code.co_filename.startswith(_RUN_STORE_CODE)
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    ):
        return exc  # raised while the run store wrote, not by a backend
    return None


def _fail_for(exc: Exception, items: list[Any], run_dir: Path | None) -> None:
    """Exit with the message and code for ``exc``, which stopped the map. Returns only
    for an exception that no message here explains (a bug: the caller re-raises it)."""
    failed = _failure_of(exc, items)
    if failed is not None:
        fail(failed.head, EXIT_FAILED, failed.detail)
    if isinstance(exc, TaskError):  # a chunk failed outside the function (initializer)
        fail(str(exc.args[0]), EXIT_FAILED, tail(exc.remote_traceback))
    disk = _run_dir_error(exc, run_dir)
    if disk is not None:
        permission = disk.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        fail(
            f"Cannot write to --run-dir {run_dir}: {_reason(disk)}. Finished chunks are "
            f"kept in {run_dir}: once it can be written again, run the same command to "
            "resume.",
            EXIT_USAGE if permission else EXIT_FAILED,
        )
    if isinstance(exc, WorkerDiedError):
        fail(
            str(exc),
            exit_code_for(exc),
            "Hint: --retries K runs a dead worker's chunk K more times; fewer --workers "
            "leave each worker more memory.",
        )
    if isinstance(exc, FingerprintMismatchError):
        fail(
            str(exc),
            exit_code_for(exc),
            f"Hint: pass another --run-dir, or delete {run_dir} to start afresh. Runs with "
            "and without --unordered keep different results and need their own --run-dir.",
        )
    if isinstance(exc, ParalelaError):  # ConfigError, UnpicklableError, RunStoreError: exit 2
        fail(str(exc), exit_code_for(exc))


def _print_summary(summary: MapSummary, destination: str) -> None:
    typer.echo(f"paralela map: {summary} -> {destination}", err=True)


MAP_HELP = (
    "Apply MODULE:FUNC to every item of --input (JSON Lines) or every file of --glob, "
    "on every core, and write the results as JSON Lines.\n\n"
    "Example: paralela map features:extract --input items.jsonl --output results.jsonl "
    "--run-dir runs/features\n\n"
    "At the end a one-line summary goes to stderr: items, wall time, items/s and how "
    "busy the workers were."
)


@app.command(
    "map",
    help=MAP_HELP,
    short_help="Apply a function to every line of a JSONL file, or every file, in parallel.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
def map_command(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:FUNC",
            help="The function to apply to each item: module:func (a module in the "
            "current directory, or installed) or path/to/file.py:func.",
            show_default=False,
        ),
    ],
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help='Results as JSON Lines, in input order: {"index", "item", "result"} (or '
            '"error" with --on-error collect). Written atomically; - writes stdout.',
        ),
    ],
    input_: Annotated[
        str | None,
        typer.Option(
            "--input",
            "-i",
            metavar="FILE",
            help="Items as JSON Lines: one JSON value per line (blank lines skipped); "
            "- reads stdin.",
        ),
    ] = None,
    glob_: Annotated[
        str | None,
        typer.Option(
            "--glob",
            "-g",
            metavar="PATTERN",
            help="Files mode: each file matching PATTERN (sorted; ** recurses) is an "
            "item, passed as a string path. Quote the pattern.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            min=1,
            help="Worker count. Default: the CPUs this process may use (or PARALELA_WORKERS).",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            "-b",
            help="processes (default), threads (I/O-bound work), sequential (a plain "
            "loop, for debugging), or slurm (array jobs on a cluster; see --option).",
            show_default=False,
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            metavar="DIR",
            help="Keep finished chunks in DIR; running again with the same DIR computes "
            "only what is missing.",
        ),
    ] = None,
    chunksize: Annotated[
        str,
        typer.Option(
            "--chunksize",
            metavar="auto|N",
            help="Items per chunk: auto aims at about 50 ms of work per chunk.",
        ),
    ] = "auto",
    unordered: Annotated[
        bool,
        typer.Option(
            "--unordered",
            help="Let workers run ahead of a slow item instead of holding finished "
            "results back for it; the output file is still in input order.",
        ),
    ] = False,
    on_error: Annotated[
        OnError,
        typer.Option(
            "--on-error",
            help="raise: stop at the first exception (exit 1). collect: finish every "
            'item, write "error" lines for the failed ones, then exit 1.',
        ),
    ] = OnError.raise_,
    nan_as: Annotated[
        NanAs,
        typer.Option(
            "--nan-as",
            help="How to write NaN and Infinity, which JSON does not have, in results and "
            'items: error (the item fails), null, or string ("NaN", "Infinity", '
            '"-Infinity").',
        ),
    ] = NanAs.error,
    retries: Annotated[
        int | None,
        typer.Option(
            "--retries",
            min=0,
            help="Times a chunk is run again when its worker dies (killed, crashed, out "
            "of memory). Default: 2.",
            show_default=False,
        ),
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Show a progress bar on stderr. Default: when stderr is a terminal.",
            show_default=False,
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            "-O",
            metavar="KEY=VALUE",
            help="A backend option, repeatable; for --backend slurm e.g. "
            "slurm_partition=gpu, cpus_per_task=8, timeout_min=60, max_jobs=100.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Apply a function to every item (JSONL line or file) in parallel; see ``MAP_HELP``.

    Exits through :class:`typer.Exit` with the codes of :mod:`paralela.cli._errors`.
    """
    if backend is not None and backend not in available_backends():
        usage_error(
            f"Unknown backend {backend!r}; valid backends are: {', '.join(available_backends())}."
        )
    size = _parse_chunksize(chunksize)
    backend_options = _parse_options(option or [])
    out_path = _check_output(output)
    fn = load_function(target)
    items, item_json = read_items(input_, glob_, nan_as)

    call_fn: Callable[[Any], Any] = fn if not unordered else _indexed(fn)
    call_items: list[Any] = items if not unordered else list(enumerate(items))
    results: list[bytes | None] = [None] * len(items)  # each result as JSON
    unwritable: list[_Failed] = []  # results JSON cannot hold
    failures: list[_Failed] = []  # items the function failed on (collect)
    try:
        iterator = imap(
            call_fn,
            call_items,
            workers=UNSET if workers is None else workers,
            backend=UNSET if backend is None else backend,
            chunksize=size,
            ordered=not unordered,
            on_error=on_error.value,
            retries=UNSET if retries is None else retries,
            run_dir=run_dir,
            progress=UNSET if progress is None else progress,
            backend_options=backend_options or None,
        )
        try:
            stop = on_error is OnError.raise_
            _encode_results(iterator, items, unordered, nan_as, results, unwritable, stop)
        except MapError as exc:
            for record in exc.failures:
                failed = _failure_of(record, items)
                if failed is None:
                    raise record from exc
                failures.append(failed)
    except KeyboardInterrupt:
        kept = f" Finished chunks are kept in {run_dir}; run again to resume." if run_dir else ""
        fail(f"Interrupted.{kept}", EXIT_INTERRUPTED)
    except Exception as exc:  # each failure paralela knows exits with its message
        _fail_for(exc, items, run_dir)
        raise  # not a failure paralela knows: a bug, shown with its traceback

    if unwritable and on_error is OnError.raise_:
        fail(unwritable[0].head, EXIT_FAILED)
    failures = sorted([*failures, *unwritable], key=lambda f: f.index)
    iterator.summary.failures += len(unwritable)
    errors = {f.index: f.error for f in failures}
    try:
        _write_output(out_path, _records(item_json, results, errors))
    except OSError as exc:
        where = "standard output" if out_path is None else f"--output {output}"
        fail(f"Cannot write {where}: {_reason(exc)}. {_kept(run_dir)}", EXIT_FAILED)
    _print_summary(iterator.summary, output if out_path is not None else "stdout")
    if failures:
        first = failures[0]
        where = f"their lines in {output}" if out_path is not None else "their lines"
        fail(
            f'{len(failures)} of {len(items)} items failed ({where} have an "error" '
            f'field instead of "result"). The first: {first.head}',
            EXIT_FAILED,
            first.detail,
        )
