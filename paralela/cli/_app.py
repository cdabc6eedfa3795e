"""The Typer application that every sub-command module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="paralela",
    help="Run deep-learning and machine-learning work in parallel, "
    "from the cores and GPUs of one machine to a Slurm cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
