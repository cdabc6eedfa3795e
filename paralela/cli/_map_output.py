"""The output of ``paralela map``: where it goes, its lines, and writing them safely.

::

    --output results.jsonl ──> check_output, before any work: the file (a symlink's
                               target), a device or pipe, or None for - (stdout)
    items and results as JSON ──> records ──> {"index", "item", "result"|"error"} per
                               line, in input order
        ──> write_results: a file through a temp file, fsync and a rename (never half a
            file); a device, a pipe or stdout directly (a closed pipe is no error)
        ──> a full disk: exit 1, saying whether --run-dir kept the results
    a failure that stopped the run ──> keep_finished: the results that finished before it
        (an ordered run's prefix) written as above, and a sentence saying so
    print_summary ──> one line on stderr: items, wall time, items/s, how busy
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import typer

from paralela._files import atomic_write
from paralela.cli._errors import EXIT_FAILED, EXIT_USAGE, fail
from paralela.cli._jsonl import text_json
from paralela.mapping import MapSummary

__all__ = ["check_output", "keep_finished", "print_summary", "records", "write_results"]


def check_output(output: str) -> Path | None:
    """Where to write: a file (symlinks followed), a device or pipe, or ``None``: stdout."""
    if output == "-":
        return None
    path = Path(output)
    if path.is_dir():
        fail(f"--output {output} is a directory; name a file such as results.jsonl.", EXIT_USAGE)
    if path.exists() and not path.is_file():
        return path  # /dev/null, a named pipe, >(gzip > out.gz): written directly
    real = Path(os.path.realpath(path))  # a symlink stays a symlink: replace its target
    parent = real.parent
    if not parent.is_dir():
        fail(
            f"The directory {path.parent} for --output does not exist; create it first.", EXIT_USAGE
        )
    if not os.access(parent, os.W_OK):
        fail(f"Cannot write --output into {parent}: permission denied.", EXIT_USAGE)
    return real


def records(
    items: list[bytes], results: list[bytes | None], errors: dict[int, str]
) -> Iterator[bytes]:
    """The output lines, in input order, from the items and results as JSON."""
    for index, item in enumerate(items):
        if index in errors:
            error = text_json(errors[index])
            yield b'{"index": %d, "item": %s, "error": %s}\n' % (index, item, error)
        else:
            result = results[index] or b"null"
            yield b'{"index": %d, "item": %s, "result": %s}\n' % (index, item, result)


def write_results(
    path: Path | None, output: str, lines: Iterable[bytes], run_dir: Path | None
) -> None:
    """Write ``lines`` to ``path`` (``None``: stdout), named ``output`` on the command line.

    An ``OSError`` (a full disk) exits with code 1, saying whether ``run_dir`` kept the
    results; no temp file is left behind.
    """
    try:
        _write_output(path, lines)
    except OSError as exc:
        where = "standard output" if path is None else f"--output {output}"
        fail(f"Cannot write {where}: {_reason(exc)}. {_kept(run_dir)}", EXIT_FAILED)


def keep_finished(
    path: Path | None,
    output: str,
    items: list[bytes],
    results: list[bytes | None],
    run_dir: Path | None,
) -> str:
    """After a failure stopped the run, write the results that finished to ``path`` (an
    ordered run's: those before the failed item; an unordered run's: every one that
    came back), in input order, as a finished run writes them; ``items`` and ``results``
    as JSON (``None``: no result). Returns the sentence that says so, and how a rerun
    can skip them; ``""`` when nothing finished (then nothing is written)."""
    done = [index for index, result in enumerate(results) if result is not None]
    if not done:
        return ""
    lines = (b'{"index": %d, "item": %s, "result": %s}\n' % (i, items[i], results[i]) for i in done)
    try:
        _write_output(path, lines)
    except OSError as exc:  # the failure that stopped the run is the one to report
        return f"The {len(done)} results that finished could not be written: {_reason(exc)}."
    where = "standard output" if path is None else output
    rerun = (
        f"{run_dir} keeps them too: the same command run again skips them."
        if run_dir is not None
        else "With --run-dir DIR, running again would skip them instead of computing them again."
    )
    return f"The {len(done)} results that finished ({_spans(done)}) are in {where}. {rerun}"


def _spans(indices: list[int], shown: int = 3) -> str:
    """``items 0-499`` / ``items 0-2, 5, 7-9 and 3 more ranges``: sorted ``indices``."""
    spans: list[tuple[int, int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], index)
        else:
            spans.append((index, index))
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans[:shown])
    more = f" and {len(spans) - shown} more ranges" if len(spans) > shown else ""
    return f"item{'s' if len(indices) > 1 else ''} {text}{more}"


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
    atomic_write(path, lines)


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


def print_summary(summary: MapSummary, destination: str) -> None:
    typer.echo(f"paralela map: {summary} -> {destination}", err=True)
