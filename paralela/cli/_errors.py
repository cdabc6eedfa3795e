"""Exit codes and error printing shared by the CLI commands.

Every command exits with a code a shell script can act on, and prints what went wrong
as one line on stderr (plus the tail of a remote traceback where that helps); a user
error never ends in a Python traceback dump. Every command runs its work inside
:func:`handling_errors`, the one place that maps paralela's errors to exit codes::

    with handling_errors(kept=..., codes=..., say=..., explain=...):
        ... the command's call into the library ...

    Ctrl-C        ──> "Error: Interrupted. <kept>"                          exit 130
    SIGTERM       ──> "Error: Stopped by SIGTERM (...). <kept>"             exit 143
    an exception  ──> explain(exc): the command's own words, if it has them (may exit)
                  ──> a ParalelaError (or a type in codes) ──> "Error: <say(exc)>",
                      the code from codes, else exit_code_for:
                      ConfigError, RunStoreError 2; WorkerDiedError 3;
                      FingerprintMismatchError 4; RendezvousError 5; any other 1
                  ──> anything else: re-raised (a bug, shown with its traceback)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

import click
import typer

from paralela.backends import Terminated
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    ParalelaError,
    RendezvousError,
    RunStoreError,
    WorkerDiedError,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RENDEZVOUS",
    "EXIT_RUN_DIR",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "EXIT_WORKER_DIED",
    "INTERRUPTED",
    "TERMINATED",
    "USAGE_OR_FAILED",
    "Codes",
    "ExitCodes",
    "exit_code_for",
    "exit_codes_help",
    "fail",
    "handling_errors",
    "interrupted",
    "kept_from_notes",
    "resume_hint",
    "said_over_lines",
    "said_with_notes",
    "say_interrupted",
    "tail",
]

EXIT_OK = 0
EXIT_FAILED = 1  # the function raised (or items failed, with collect); results unwritable
EXIT_USAGE = 2  # bad arguments or input: fix the command line (same code as Click's)
EXIT_WORKER_DIED = 3  # a worker died (killed, crashed, out of memory) too often
EXIT_RUN_DIR = 4  # the run directory belongs to another computation
EXIT_RENDEZVOUS = 5  # launch: the ranks did not all meet at the preflight rendezvous
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_TERMINATED = 143  # SIGTERM (scancel, a Slurm time limit or preemption), as shells report it

ExitCodes = Sequence[tuple[int, str]]
"""A command's exit codes, each with what it means in that command's words, in the
order of its ``--help``: every command module declares its own ``EXIT_CODES`` table and
builds its epilog from it with :func:`exit_codes_help` (a test checks that a command
lists only the codes its code exits with, and names only options it has)."""

INTERRUPTED = (EXIT_INTERRUPTED, "interrupted (Ctrl-C)")
TERMINATED = (EXIT_TERMINATED, "stopped by SIGTERM (scancel, a Slurm time limit or preemption)")


def exit_codes_help(codes: ExitCodes, then: str = "") -> str:
    """``Exit codes: 0 ok; 1 ...; 2 ...`` from a command's table, and ``then`` (a
    sentence on what to do after a failure) behind it: a command's ``--help`` epilog."""
    listed = "; ".join(f"{code} {meaning}" for code, meaning in codes)
    return f"Exit codes: {listed}." + (f" {then}" if then else "")


TRACEBACK_TAIL_LINES = 12


def tail(text: str, lines: int = TRACEBACK_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text`` (a remote traceback), marked when cut."""
    kept = text.rstrip().splitlines()
    if len(kept) <= lines:
        return "\n".join(kept)
    return "\n".join(["  ...", *kept[-lines:]])


def exit_code_for(exc: BaseException) -> int:
    """The exit code for one of paralela's errors (1 for anything unexpected)."""
    if isinstance(exc, FingerprintMismatchError):
        return EXIT_RUN_DIR
    if isinstance(exc, WorkerDiedError):
        return EXIT_WORKER_DIED
    if isinstance(exc, RendezvousError):
        return EXIT_RENDEZVOUS
    if isinstance(exc, (ConfigError, RunStoreError)):
        return EXIT_USAGE
    return EXIT_FAILED  # TaskError, MapError, and anything unexpected


def fail(message: str, code: int, detail: str | None = None) -> NoReturn:
    """Print ``Error: message`` (and an indented ``detail``) to stderr, exit with ``code``."""
    typer.echo(f"Error: {message}", err=True)
    if detail:
        typer.echo(detail, err=True)
    raise typer.Exit(code)


def interrupted(exc: KeyboardInterrupt, what_was_kept: str = "") -> NoReturn:
    """Exit as a stopped command: ``Interrupted.`` and 130 after Ctrl-C, ``Stopped by
    SIGTERM ...`` and 143 after SIGTERM (``exc`` is then a ``Terminated``);
    ``what_was_kept`` says what finished is kept and how to go on (each command's own
    words)."""
    raise typer.Exit(say_interrupted(exc, what_was_kept))


def say_interrupted(exc: KeyboardInterrupt, what_was_kept: str = "") -> int:
    """Print :func:`interrupted`'s line on stderr and return its exit code."""
    if isinstance(exc, Terminated):
        head, code = "Stopped by SIGTERM (scancel, a time limit or preemption).", EXIT_TERMINATED
    else:
        head, code = "Interrupted.", EXIT_INTERRUPTED
    typer.echo(f"Error: {head} {what_was_kept}".rstrip(), err=True)
    return code


Codes = Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...], int]]
"""Exit codes that a command gives some errors instead of :func:`exit_code_for`'s:
``(types, code)`` pairs, the first that matches wins."""

USAGE_OR_FAILED: Codes = ((ConfigError, EXIT_USAGE), (ParalelaError, EXIT_FAILED))
"""The codes of a command whose every failure but bad usage exits 1 (sweep, scale: a
run directory they cannot write is a failure to retry, as their epilogs say)."""


@contextlib.contextmanager
def handling_errors(
    kept: str | Callable[[KeyboardInterrupt], str] = "",
    *,
    codes: Codes = (),
    say: Callable[[BaseException], str] = str,
    explain: Callable[[Exception], None] | None = None,
) -> Iterator[None]:
    """Run the block as a command's work: its errors exit with a message and a code.

    - Ctrl-C or SIGTERM: :func:`interrupted` with ``kept`` (what finished is kept and
      how to go on, the command's own words; a callable gets the interrupt, whose notes
      may say it).
    - Any other exception goes first to ``explain``, the command's own words for the
      errors it knows (it exits with :func:`fail`, or returns to leave ``exc`` to what
      follows).
    - A :class:`~paralela.errors.ParalelaError`, or an exception of a type in ``codes``:
      ``Error: say(exc)`` on stderr (its lines after the first go under it) and the
      code from ``codes``, else from :func:`exit_code_for`.
    - Anything else is re-raised: a bug, shown with its traceback. So is a
      :class:`typer.Exit` the block raised itself (a :func:`fail` inside it).
    """
    try:
        yield
    except KeyboardInterrupt as exc:
        interrupted(exc, kept(exc) if callable(kept) else kept)
    except (typer.Exit, click.exceptions.Exit, click.ClickException):
        raise
    except Exception as exc:
        if explain is not None:
            explain(exc)
        code = next((code for types, code in codes if isinstance(exc, types)), None)
        if code is None:
            if not isinstance(exc, ParalelaError):
                raise
            code = exit_code_for(exc)
        fail(say(exc), code)


def resume_hint(run_dir: object, what: str, again: str = "run again") -> str:
    """What an interrupted command that keeps finished ``what`` (chunks, tasks,
    shards) in its ``--run-dir`` says: where they are, or how to keep them next time."""
    if run_dir:
        return f"Finished {what} are kept in {run_dir}; {again} to resume."
    return f"Pass --run-dir DIR to keep finished {what}, so that running again resumes."


def kept_from_notes(default: str) -> Callable[[KeyboardInterrupt], str]:
    """For :func:`handling_errors`: the last note of the interrupt (the library says
    what it kept and how to go on), or ``default``, in the command line's words."""

    def kept(exc: KeyboardInterrupt) -> str:
        notes = getattr(exc, "__notes__", None) or [default]
        return str(notes[-1]).replace("run it again", "run the same command again")

    return kept


def said_with_notes(exc: BaseException) -> str:
    """The message and its notes as one paragraph (``paralela: `` taken off a note)."""
    notes = [n.removeprefix("paralela: ") for n in getattr(exc, "__notes__", [])]
    return " ".join([str(exc), *(n[:1].upper() + n[1:] for n in notes)])


def said_over_lines(exc: BaseException) -> str:
    """The message, and each of its notes on a line under it."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])
