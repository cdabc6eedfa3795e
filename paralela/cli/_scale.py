"""``paralela scale``: run the same work at several worker counts, fit Amdahl's law.

::

    paralela scale --workers 1,2,4,8 -- paralela map f:g -i items.jsonl -o out.jsonl
    paralela scale --workers 1,2,4 mywork:run          (run(workers) in this process)
      ──> paralela.scaling.measure(...) ──> a table, the serial fraction ± uncertainty,
          predicted speed-ups, warnings; --json: scaling.json's content on stdout
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    INTERRUPTED,
    TERMINATED,
    USAGE_OR_FAILED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
    said_over_lines,
)
from paralela.cli._options import PROGRAM_AFTER_OPTIONS, json_option, quiet_option, run_dir_option

__all__ = ["parse_workers", "scale_command"]

SCALE_HELP = (
    "Run the same work at several worker counts (with repetitions) and report speed-up, "
    "efficiency, the serial fraction fitted by Amdahl's law with its uncertainty, and "
    "the speed-up it predicts at larger counts.\n\n"
    "The work is a command after '--': a paralela command gets --workers N; any other "
    "command takes {workers} (and, with --weak, {scale}) where the counts go. Or a "
    "Python MODULE:FUNC, called as FUNC(workers) (--weak: FUNC(workers, scale)) in this "
    "process.\n\n"
    "Example: paralela scale --workers 1,2,4,8 --run-dir runs/scale -- paralela map "
    "features:extract --input items.jsonl --output out.jsonl"
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "measured (warnings about the numbers do not fail it)"),
    (EXIT_FAILED, "the work failed or timed out at some count"),
    (EXIT_USAGE, "bad usage"),
    INTERRUPTED,
    TERMINATED,
)
EPILOG = exit_codes_help(EXIT_CODES)
# One token like module:func, pkg.mod:Class.method or path/file.py:func: a function.
_FUNCTION = re.compile(r"^[\w./\\-]+(\.py)?:[A-Za-z_][\w.]*$")


def parse_workers(text: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``; exits with code 2 on anything else."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if len(counts) < 2 or any(n < 1 for n in counts):
        fail(
            f"--workers takes two or more positive counts separated by commas, e.g. "
            f"1,2,4,8; got {text!r}.",
            EXIT_USAGE,
        )
    return counts


def _target(args: list[str]) -> Any:
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        fail(
            "Give the work to measure: a command after '--' (e.g. -- paralela map f:g "
            "-i items.jsonl -o out.jsonl) or a MODULE:FUNC.",
            EXIT_USAGE,
        )
    if len(args) == 1 and _FUNCTION.match(args[0]):
        from paralela.cli._load import load_function

        return load_function(args[0])
    return args


@app.command(
    "scale",
    help=SCALE_HELP,
    short_help="Measure speed-up at several worker counts; fit Amdahl's law.",
    epilog=EPILOG,
    context_settings=PROGRAM_AFTER_OPTIONS,
)
def scale_command(
    ctx: typer.Context,
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            "-w",
            metavar="N,N,...",
            help="Worker counts, e.g. 1,2,4,8. Default: powers of two up to the usable CPUs.",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[
        int, typer.Option("--repeats", "-r", min=1, help="Timed runs per count.")
    ] = 3,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, help="Untimed runs per count before them.")
    ] = 1,
    weak: Annotated[
        bool,
        typer.Option(
            "--weak",
            help="Weak scaling: the work grows with the workers (Gustafson's law).",
        ),
    ] = False,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference/--no-reference",
            help="With --weak: also time each count's grown work on the smallest count "
            "(the reference runs, about as long as all the baseline runs together), so "
            "that the scaled speed-up is measured; --no-reference skips them and "
            "estimates it: the serial fraction is then a lower bound.",
        ),
    ] = True,
    oversubscribe: Annotated[
        bool,
        typer.Option(
            "--oversubscribe",
            help="Fit counts above the usable CPUs too (work that waits: I/O, GPUs).",
        ),
    ] = False,
    run_dir: Annotated[
        Path | None, run_dir_option("Save scaling.json, scaling.png and the command logs in DIR.")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0.001, help="Seconds per command run before it is killed."),
    ] = None,
    timer: Annotated[
        str,
        typer.Option(
            "--timer",
            help="wall: the whole command or call (start-up included); map: a paralela "
            "map command's own wall time, from its --run-dir's summary.json.",
        ),
    ] = "wall",
    plot: Annotated[
        bool,
        typer.Option(
            "--plot/--no-plot",
            help="With --run-dir: draw scaling.png there (speed-up and efficiency against "
            "the workers, with the fitted law; needs matplotlib). --no-plot saves the "
            "time of drawing it.",
        ),
    ] = True,
    json_out: Annotated[
        bool,
        json_option(
            "Print the result as JSON on stdout (scaling.json's content: every run's "
            "time, the fit, the predictions, the warnings) instead of the table."
        ),
    ] = False,
    quiet: Annotated[
        bool,
        quiet_option(
            "Leave out the line per run on stderr (count, repetition, seconds); the "
            "warnings are still printed."
        ),
    ] = False,
) -> None:
    """Measure and fit; see ``SCALE_HELP``. Exits through :class:`typer.Exit`."""
    from paralela.scaling import measure

    counts = parse_workers(workers) if workers is not None else None
    target = _target(list(ctx.args))

    def log(line: str) -> None:
        if not quiet or line.startswith("Warning:"):
            typer.echo(f"paralela scale: {line}", err=True)

    with handling_errors("Nothing was saved.", codes=USAGE_OR_FAILED, say=said_over_lines):
        result = measure(
            target,
            counts,
            repeats=repeats,
            weak=weak,
            reference=reference,
            warmup=warmup,
            oversubscribe=oversubscribe,
            run_dir=run_dir,
            timeout=timeout,
            plot=plot,
            timer=timer,
            log=log,
        )
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)
    if result.plot_note:
        typer.echo(f"paralela scale: {result.plot_note}", err=True)
    if run_dir is not None:
        typer.echo(f"paralela scale: saved {run_dir / 'scaling.json'}", err=True)


def _print_result(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False, highlight=False)
    headers, rows = result.table_rows()
    title = (
        f"{'Weak' if result.mode == 'weak' else 'Strong'} scaling of {result.target} "
        f"({result.repeats} runs per count)"
    )
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == len(headers) - 1 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in result.summary_lines():
        style = "yellow" if line.startswith("Warning:") else None
        console.print(line, style=style, soft_wrap=True)
