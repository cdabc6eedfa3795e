"""paralela's command line: a thin layer, each sub-command one call into the library.

Importing this package is cheap: the commands load with ``app`` or in :func:`main`,
inside its handling of Ctrl-C and SIGTERM (so that one of them arriving while the
command still starts prints one line, not a traceback).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.cli._app import app

VERSION_OPTIONS = ("--version", "-V")  # as paralela.cli._app spells them (a test checks)

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``paralela`` console script and of ``python -m paralela``.

    SIGTERM (scancel, a Slurm time limit or preemption, a supervisor) stops every
    command as Ctrl-C does: what finished is kept and the command says how to go on,
    exiting 143 (130 after Ctrl-C). One that arrives before a command's own handling
    (while it starts) prints one line and exits the same way.
    """
    try:
        from paralela.backends import marking_sigint, sigterm_as_interrupt

        with sigterm_as_interrupt(), marking_sigint():
            if sys.argv[1:2] and sys.argv[1] in VERSION_OPTIONS:
                from paralela.cli._app import app  # no command module: --version is cheap

                app()
            from paralela.cli._commands import app

            for command in app.registered_commands:
                if command.callback is not None:
                    command.callback = _stopping_in_one_line(command.callback)
            app()
    except KeyboardInterrupt as exc:  # not inside a command: while importing
        from paralela.cli._errors import say_interrupted

        raise SystemExit(say_interrupted(exc, "(while starting: nothing was done)")) from None


def _stopping_in_one_line(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command``, exiting as :func:`~paralela.cli._errors.interrupted` says on Ctrl-C
    or SIGTERM that its own handling does not cover (while it reads its input, loads
    the function); Typer would exit 130 silently, and 130 after SIGTERM."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as exc:
            from paralela.cli._errors import interrupted

            interrupted(exc)

    return run


def __getattr__(name: str) -> Any:
    if name == "app":
        from paralela.cli._commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
