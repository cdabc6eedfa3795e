"""The Typer application that every sub-command module registers on.

Importing this module is cheap (typer only): ``paralela --version`` is answered from it
alone, without the command modules (see :func:`paralela.cli.main`).
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="paralela",
    help="Run deep-learning and machine-learning work in parallel, "
    "from the cores and GPUs of one machine to a Slurm cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

VERSION_OPTIONS = ("--version", "-V")


def _print_version(value: bool) -> None:
    if value:
        from paralela._version import __version__

        typer.echo(f"paralela {__version__}")
        raise typer.Exit()


@app.callback()
def _paralela(
    version: Annotated[
        bool,
        typer.Option(
            *VERSION_OPTIONS,
            is_eager=True,
            callback=_print_version,
            help="Print paralela's version (paralela X.Y.Z) and exit.",
        ),
    ] = False,
) -> None:
    # No docstring: the app's help above is the one shown by `paralela --help`.
    pass
