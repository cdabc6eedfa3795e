"""``paralela report``: one self-contained HTML page for a run directory.

Standard output gets one line, the page's path (with ``--open``, its ``file://`` URL),
for ``xdg-open "$(paralela report RUN_DIR --open)"``; what the page covers and any
warnings go to standard error.
"""

from __future__ import annotations

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

REPORT_HELP = (
    "Write an HTML report of RUN_DIR: a timeline of the tasks on each worker, how busy "
    "each worker was, where the time went, the scaling curve with its Amdahl fit, and a "
    "sweep's or a comparison's leaderboard and plots.\n\n"
    "RUN_DIR is a map's run directory (summary.json), a sweep's (trials.json), a "
    "comparison's (compare.json), a launch's "
    "log directory (launch.json), a paralela scale directory (scaling.json), or a "
    "directory holding several of them (paralela demo's): one page, a section per run. "
    "The page loads nothing from anywhere: it opens from disk, without a server or "
    "network. Its charts are also written next to it as report-*.png."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (EXIT_USAGE, "RUN_DIR missing, not a run directory, or unreadable"),
    INTERRUPTED,
    TERMINATED,
)
EPILOG = exit_codes_help(EXIT_CODES)


@app.command(
    help=REPORT_HELP,
    short_help="Write an HTML report (timelines, busy time, scaling, sweep) of a run.",
    epilog=EPILOG,
)
def report(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="The run directory (or a directory of runs).")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="The HTML file to write. Default: RUN_DIR/report.html."),
    ] = None,
    open_: Annotated[
        bool,
        typer.Option("--open", help="Print the page as a file:// URL to click or paste."),
    ] = False,
) -> None:
    """Write the report (:func:`paralela.reporting.write_report`) and print where it is."""
    from paralela.reporting import write_report

    with handling_errors():
        written = write_report(run_dir, out)
    kinds = ", ".join(f"{r.kind} {r.path}" for r in written.runs)
    typer.echo(f"paralela report: {len(written.runs)} run(s): {kinds}", err=True)
    if written.images:
        typer.echo(
            f"paralela report: {len(written.images)} chart(s) next to it (report-*.png)",
            err=True,
        )
    for problem in written.problems:
        typer.echo(f"Warning: {problem}", err=True)
    typer.echo(written.url if open_ else str(written.path))
