"""``paralela map``: a function over the lines of a JSONL file (or over files), in parallel.

::

    MODULE:FUNC ──> import (current directory first on sys.path, like python -m)
    --input items.jsonl | --glob 'data/*.csv' ──> items, validated before work starts
    paralela.imap(fn, items, ...) ──> results (MapError with collect: failures too)
    --output results.jsonl ──> {"index", "item", "result"|"error"} per line, in input
                               order, written to a temp file and renamed (never half a file)

Each failure ends in an exit code a shell can act on (see ``_errors``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import glob as globlib
import importlib
import inspect
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer

from paralela._config import UNSET
from paralela.backends import available_backends
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
    TaskError,
    WorkerDiedError,
)
from paralela.mapping import MapSummary, imap
from paralela.mapping._task import short_repr
from paralela.runs._fingerprint import fingerprint_function

__all__ = ["load_function", "map_command", "read_items"]


class OnError(str, enum.Enum):
    raise_ = "raise"
    collect = "collect"


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


# -- the items ------------------------------------------------------------------------


def read_items(input_path: str | None, pattern: str | None) -> list[Any]:
    """The items: from a JSONL file (stdin for ``-``), or the files matching a glob."""
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
        return paths
    if input_path is None:
        usage_error(
            "Pass the items: --input FILE (one JSON item per line, - for stdin) or "
            "--glob PATTERN (one item per matching file)."
        )
    if input_path == "-":
        return _parse_lines(sys.stdin, "stdin")
    try:
        with open(input_path, encoding="utf-8") as f:
            return _parse_lines(f, input_path)
    except FileNotFoundError:
        usage_error(f"Input file {input_path} does not exist.")
    except IsADirectoryError:
        usage_error(
            f"--input {input_path} is a directory; for one item per file use "
            f"--glob '{input_path.rstrip('/')}/*'."
        )
    except PermissionError:
        usage_error(f"Input file {input_path} cannot be read: permission denied.")


def _parse_lines(lines: Iterable[str], name: str) -> list[Any]:
    items: list[Any] = []
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                usage_error(
                    f"{name} line {lineno} is not valid JSON ({exc.msg}, column {exc.colno}): "
                    f"{short_repr(line.rstrip())}. Each line must hold one JSON value, "
                    'e.g. 42, "text" (double quotes) or {"path": "a.csv"}.'
                )
    except UnicodeDecodeError:
        usage_error(f"{name} line {lineno + 1} is not UTF-8 text. Save the file as UTF-8.")
    return items


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


def _json_default(value: Any) -> Any:
    """Results as JSON: numpy arrays and scalars become lists and numbers, paths strings."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _records(items: list[Any], results: dict[int, Any], errors: dict[int, str]) -> Iterator[str]:
    for index, item in enumerate(items):
        record: dict[str, Any] = {"index": index, "item": item}
        if index in errors:
            record["error"] = errors[index]
        else:
            record["result"] = results.get(index)
        try:
            yield json.dumps(record, ensure_ascii=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            fail(
                f"The result of item {index} ({short_repr(item)}) cannot be written as "
                f"JSON: {exc}. Return plain data: dicts, lists, strings, numbers.",
                EXIT_FAILED,
            )


def _write_output(path: Path | None, lines: Iterable[str]) -> None:
    """Write ``lines`` to a file through a temp file and a rename, so that a crash never
    leaves half a file; to stdout (``None``), a device or a pipe, directly."""
    if path is None or (path.exists() and not path.is_file()):
        ready = list(lines)  # every line encoded first: a bad result writes nothing
        try:
            with contextlib.ExitStack() as stack:
                out = (
                    sys.stdout
                    if path is None
                    else stack.enter_context(open(path, "w", encoding="utf-8"))
                )
                for line in ready:
                    out.write(line + "\n")
                out.flush()
        except BrokenPipeError:  # `paralela map ... -o - | head`: the reader is gone
            if path is None:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())  # so that the exit-time flush is quiet
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _task_error_lines(exc: TaskError, items: list[Any]) -> tuple[str, str]:
    if exc.index is None:
        return str(exc.args[0]), tail(exc.remote_traceback)
    item = items[exc.index] if 0 <= exc.index < len(items) else exc.item_repr
    head = f"{exc.exc_type} in item {exc.index} ({short_repr(item)}): {exc.args[0]}"
    return head, "Remote traceback (last lines):\n" + tail(exc.remote_traceback)


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
    items = read_items(input_, glob_)

    call_fn: Callable[[Any], Any] = fn if not unordered else _indexed(fn)
    call_items: list[Any] = items if not unordered else list(enumerate(items))
    values: list[Any] = []
    failures: list[TaskError] = []
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
            for value in iterator:
                values.append(value)
        except MapError as exc:
            failures = exc.failures
    except TaskError as exc:
        head, detail = _task_error_lines(exc, items)
        fail(head, EXIT_FAILED, detail)
    except WorkerDiedError as exc:
        fail(
            str(exc),
            exit_code_for(exc),
            "Hint: --retries K runs a dead worker's chunk K more times; fewer --workers "
            "leave each worker more memory.",
        )
    except FingerprintMismatchError as exc:
        fail(
            str(exc),
            exit_code_for(exc),
            f"Hint: pass another --run-dir, or delete {run_dir} to start afresh. Runs with "
            "and without --unordered keep different results and need their own --run-dir.",
        )
    except ParalelaError as exc:  # ConfigError, UnpicklableError, RunStoreError: exit 2
        fail(str(exc), exit_code_for(exc))
    except KeyboardInterrupt:
        kept = f" Finished chunks are kept in {run_dir}; run again to resume." if run_dir else ""
        fail(f"Interrupted.{kept}", EXIT_INTERRUPTED)

    errors = {f.index: f"{f.exc_type}: {f.args[0]}" for f in failures if f.index is not None}
    if unordered:
        results = {pair[0]: pair[1] for pair in values if pair is not None}
    else:
        results = dict(enumerate(values))
    _write_output(out_path, _records(items, results, errors))
    _print_summary(iterator.summary, output if out_path is not None else "stdout")
    if failures:
        first, detail = _task_error_lines(failures[0], items)
        where = f"their lines in {output}" if out_path is not None else "their lines"
        fail(
            f'{len(failures)} of {len(items)} items failed ({where} have an "error" '
            f'field instead of "result"). The first: {first}',
            EXIT_FAILED,
            detail,
        )
