"""Exit codes and error printing shared by the CLI commands.

Every command exits with a code a shell script can act on, and prints what went wrong
as one line on stderr (plus the tail of a remote traceback where that helps); a user
error never ends in a Python traceback dump.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from paralela.backends._interrupt import Terminated
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    RunStoreError,
    WorkerDiedError,
)

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RENDEZVOUS",
    "EXIT_RUN_DIR",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "EXIT_WORKER_DIED",
    "exit_code_for",
    "fail",
    "interrupted",
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

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 the function raised, or some items failed with "
    "--on-error collect, or the results could not be written (a result JSON cannot "
    "hold, a full disk); 2 bad usage or input; 3 a worker died more often than "
    "--retries allows; 4 the run directory belongs to another computation; "
    "130 interrupted (Ctrl-C); 143 stopped by SIGTERM (scancel, a Slurm time limit or "
    "preemption): what finished is kept, as after Ctrl-C."
)

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
