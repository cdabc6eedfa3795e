"""``paralela map``: a function over the lines of a JSONL file (or over files), in parallel.

::

    _load        MODULE:FUNC ──> import (current directory first on sys.path, like python -m)
    _jsonl       --input items.jsonl | --glob 'data/*.csv' ──> items, read as strict UTF-8
                 JSON and encoded once, all before work starts (exit 2 names the line)
    _map_output  --output results.jsonl checked before work starts too
    (here)       paralela.imap(fn, items, ...) ──> each result encoded as strict JSON as it
                 arrives: one JSON cannot hold (NaN, a lone surrogate) fails its item then
    _map_failures  an exception that stopped the map ──> its message and exit code; the
                 results that finished before it are written all the same (keep_finished)
    _map_output  {"index", "item", "result"|"error"} per line, in input order, written to
                 a temp file and renamed (never half a file) ──> a summary line on stderr

This module holds the command and its flow; each step above is one call into the module
named on its left. Each failure ends in an exit code a shell can act on (see ``_errors``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from paralela._config import UNSET
from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_RUN_DIR,
    EXIT_USAGE,
    EXIT_WORKER_DIED,
    INTERRUPTED,
    TERMINATED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
    resume_hint,
)
from paralela.cli._jsonl import NanAs, NotJson, read_items, to_json
from paralela.cli._load import load_function
from paralela.cli._map_failures import Failed, fail_for, failure_of
from paralela.cli._map_output import (
    check_output,
    keep_finished,
    print_summary,
    records,
    write_results,
)
from paralela.cli._options import (
    BackendOptions,
    backend_option,
    check_backend,
    output_option,
    parse_options,
    progress_option,
    retries_option,
    run_dir_option,
    workers_option,
)
from paralela.errors import MapError
from paralela.mapping import MapIterator, imap
from paralela.runs import fingerprint_function
from paralela.tasks import short_repr

# load_function and read_items are re-exported: they used to live here.
__all__ = ["load_function", "map_command", "read_items"]


class OnError(str, enum.Enum):
    raise_ = "raise"
    collect = "collect"


# -- the command line -----------------------------------------------------------------


def _parse_chunksize(text: str) -> int | Literal["auto"]:
    if text == "auto":
        return "auto"
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        fail(
            f"--chunksize must be 'auto' or a positive integer, got {text!r}. "
            "Use 'auto' unless you have measured a better value.",
            EXIT_USAGE,
        )
    return size


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


def _encode_results(
    iterator: MapIterator[Any],
    items: list[Any],
    unordered: bool,
    nan_as: NanAs,
    results: list[bytes | None],
    unwritable: list[Failed],
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
            results[index] = to_json(value, nan_as, "the result")
        except NotJson as exc:
            unwritable.append(
                Failed(
                    index,
                    f"UnwritableResult: the result cannot be written as JSON: {exc}",
                    f"The result of item {index} ({short_repr(items[index])}) cannot be "
                    f"written as JSON: {exc}",
                )
            )
            if stop:
                iterator.close()
                return


BACKEND_HELP = (
    "processes (default), threads (I/O-bound work), sequential (a plain loop, for "
    "debugging), or slurm (array jobs on a cluster; see --option)."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (
        EXIT_FAILED,
        "the function raised, or some items failed with --on-error collect, or the results "
        "could not be written (a result JSON cannot hold, a full disk)",
    ),
    (EXIT_USAGE, "bad usage or input"),
    (EXIT_WORKER_DIED, "a worker died more often than --retries allows"),
    (EXIT_RUN_DIR, "the run directory belongs to another computation"),
    INTERRUPTED,
    TERMINATED,
)
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
    epilog=exit_codes_help(
        EXIT_CODES, "After 130 or 143, running again with the same --run-dir resumes."
    ),
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
        output_option(
            'Results as JSON Lines, in input order: {"index", "item", "result"} (or '
            '"error" with --on-error collect). Written atomically; - writes stdout.',
            metavar="FILE",
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
    workers: Annotated[int | None, workers_option()] = None,
    backend: Annotated[str | None, backend_option(BACKEND_HELP)] = None,
    run_dir: Annotated[
        Path | None,
        run_dir_option(
            "Keep finished chunks in DIR; running again with the same DIR computes only "
            "what is missing."
        ),
    ] = None,
    fingerprint: Annotated[
        str | None,
        typer.Option(
            "--fingerprint",
            metavar="KEY",
            help="Your own key for the results in --run-dir, replacing the computed "
            "fingerprint of the function and what it depends on; the key a fingerprint "
            "mismatch quotes resumes that directory after an edit that changes no result.",
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
    retries: Annotated[int | None, retries_option("chunk")] = None,
    progress: Annotated[bool | None, progress_option("a progress bar")] = None,
    option: BackendOptions = None,
) -> None:
    """Apply a function to every item (JSONL line or file) in parallel; see ``MAP_HELP``.

    Exits through :class:`typer.Exit` with the codes of :mod:`paralela.cli._errors`.
    """
    check_backend(backend)
    size = _parse_chunksize(chunksize)
    backend_options = parse_options(option)
    out_path = check_output(output)
    fn = load_function(target)
    items, item_json = read_items(input_, glob_, nan_as)

    call_fn: Callable[[Any], Any] = fn if not unordered else _indexed(fn)
    call_items: list[Any] = items if not unordered else list(enumerate(items))
    results: list[bytes | None] = [None] * len(items)  # each result as JSON
    unwritable: list[Failed] = []  # results JSON cannot hold
    failures: list[Failed] = []  # items the function failed on (collect)

    def explain(exc: Exception) -> None:  # each failure paralela knows: its message
        fail_for(exc, items, run_dir, keep_finished(out_path, output, item_json, results, run_dir))

    with handling_errors(resume_hint(run_dir, "chunks"), explain=explain):
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
            fingerprint=fingerprint,
            progress=UNSET if progress is None else progress,
            backend_options=backend_options or None,
        )
        try:
            stop = on_error is OnError.raise_
            _encode_results(iterator, items, unordered, nan_as, results, unwritable, stop)
        except MapError as exc:
            for record in exc.failures:
                failed = failure_of(record, items)
                if failed is None:
                    raise record from exc
                failures.append(failed)

    if unwritable and on_error is OnError.raise_:
        kept = keep_finished(out_path, output, item_json, results, run_dir)
        fail(unwritable[0].head, EXIT_FAILED, kept or None)
    failures = sorted([*failures, *unwritable], key=lambda f: f.index)
    iterator.summary.failures += len(unwritable)
    errors = {f.index: f.error for f in failures}
    write_results(out_path, output, records(item_json, results, errors), run_dir)
    print_summary(iterator.summary, output if out_path is not None else "stdout")
    if failures:
        first = failures[0]
        where = f"their lines in {output}" if out_path is not None else "their lines"
        fail(
            f'{len(failures)} of {len(items)} items failed ({where} have an "error" '
            f'field instead of "result"). The first: {first.head}',
            EXIT_FAILED,
            first.detail,
        )
