"""``paralela info``: what this process may use, and the default slots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_OK,
    EXIT_USAGE,
    INTERRUPTED,
    TERMINATED,
    ExitCodes,
    exit_codes_help,
    handling_errors,
)
from paralela.cli._options import json_option
from paralela.resources import detect, make_slots

EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (EXIT_USAGE, "bad usage, or a SLURM_* variable is malformed (the line names it)"),
    INTERRUPTED,
    TERMINATED,
)


@app.command(epilog=exit_codes_help(EXIT_CODES))
def info(
    json_: Annotated[bool, json_option("Print the report as JSON instead.")] = False,
    run_dir: list[Path] = typer.Option(  # noqa: B008 (Typer's way to declare options)
        [], "--run-dir", help="Check a run directory's filesystem (repeatable)."
    ),
    data: list[Path] = typer.Option(  # noqa: B008
        [], "--data", help="Check a dataset's filesystem (repeatable)."
    ),
) -> None:
    """Show the CPUs, memory, GPUs, Slurm allocation and filesystems this process may use.

    Also shows the default slots: one per GPU when GPUs are visible, else one per usable
    CPU. With --run-dir or --data, warns when those paths sit on a filesystem that is
    wrong for the job (many small files or SQLite on a network filesystem, results in
    scratch that is erased at the end of the job); the warnings are also in --json as
    "advice". Exits with code 2 and a message when a SLURM_* variable is malformed.
    """
    with handling_errors():
        resources = detect()
        slots = make_slots(resources, gpus_per_slot=1 if resources.gpus else 0)
    advice = None
    if run_dir or data:
        from paralela.resources import advise_filesystems

        advice = advise_filesystems(data=data, run_dirs=run_dir)
    if json_:
        report = resources.to_dict()
        report["slots"] = [slot.to_dict() for slot in slots]
        if advice is not None:
            report["advice"] = [a.to_dict() for a in advice]
        typer.echo(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    from paralela.resources import print_report

    console = Console()
    print_report(resources, slots, console)
    if advice is not None:
        console.print()
        console.print("[bold]Filesystem advice[/bold]")
        for item in advice:
            console.print(f"[yellow]Warning[/yellow] ({item.role}): {escape(item.message)}")
        if not advice:
            console.print("no warnings: the given paths are on suitable filesystems.")
