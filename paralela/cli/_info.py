"""``paralela info``: what this process may use, and the default slots."""

from __future__ import annotations

import json

import typer

from paralela.cli._app import app
from paralela.errors import ConfigError
from paralela.resources import detect, make_slots


@app.command()
def info(
    json_: bool = typer.Option(False, "--json", help="Print the report as JSON instead."),
) -> None:
    """Show the CPUs, memory, GPUs, Slurm allocation and filesystems this process may use.

    Also shows the default slots: one per GPU when GPUs are visible, else one per usable
    CPU. Exits with code 2 and a message when a SLURM_* variable is malformed.
    """
    try:
        resources = detect()
        slots = make_slots(resources, gpus_per_slot=1 if resources.gpus else 0)
    except ConfigError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if json_:
        report = resources.to_dict()
        report["slots"] = [slot.to_dict() for slot in slots]
        typer.echo(json.dumps(report, indent=2))
        return
    from rich.console import Console

    from paralela.resources._render import print_report

    print_report(resources, slots, Console())
