"""``paralela demo``: see what paralela does on this machine, in a few seconds."""

from __future__ import annotations

from typing import Annotated

import typer

from paralela.cli._app import app
from paralela.cli._errors import EXIT_FAILED, EXIT_USAGE, fail
from paralela.errors import ConfigError

DEMO_HELP = (
    "Run a data-parallel map and show its speed-up.\n\n"
    "Extracts 36 spectral and statistical features from synthetic sensor recordings, "
    "once on one core and once with paralela.map on every usable CPU, checks that both "
    "give the same features, and prints the times, the speed-up and how busy the "
    "workers were. Takes about 5-10 s on 2 cores."
)


@app.command(
    help=DEMO_HELP,
    short_help="Run a data-parallel map demo and show its speed-up.",
    epilog="Exit codes: 0 ok; 1 the parallel results differ from the serial ones; 2 bad usage.",
)
def demo(
    items: Annotated[
        int | None,
        typer.Option("--items", "-n", min=1, help="Recordings to process. Default: 400."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            min=1,
            help="Worker processes for the parallel run. Default: every usable CPU.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the map demo (:func:`paralela.demos.run_map_demo`) and print what it measured."""
    from rich.console import Console
    from rich.table import Table

    from paralela.demos import DEFAULT_ITEMS, run_map_demo

    n = DEFAULT_ITEMS if items is None else items
    console = Console(highlight=False)
    console.print(
        f"[bold]paralela demo[/bold]: extracting features from {n} synthetic sensor "
        "recordings, serially and then in parallel..."
    )
    try:
        result = run_map_demo(n, workers)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)

    table = Table(title="Data-parallel map: feature extraction", title_justify="left")
    table.add_column("items", justify="right")
    table.add_column("serial s", justify="right")
    table.add_column("parallel s", justify="right")
    table.add_column("speed-up", justify="right")
    table.add_column("workers", justify="right")
    table.add_column("busy", justify="right")
    table.add_row(
        str(result.items),
        f"{result.serial_seconds:.2f}",
        f"{result.parallel_seconds:.2f}",
        f"{result.speedup:.2f}x",
        str(result.workers),
        f"{result.busy_fraction:.0%}",
    )
    console.print(table)
    console.print(f"Summary: {result.summary}")
    console.print(
        f"Speed-up: {result.speedup:.2f}x on {result.workers} workers "
        f"(ideal {result.ideal_speedup:.0f}x; parallel time includes starting the workers)."
    )
    if not result.results_equal:
        fail("Results equal: no. The parallel features differ from the serial ones.", EXIT_FAILED)
    console.print(
        f"Results equal: yes ({result.items} x {result.features} features, serial == parallel)."
    )
