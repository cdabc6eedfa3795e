"""``paralela stage``: copy a dataset to node-local scratch, verified; or results home.

Standard output gets the staged path (one line, for ``DATA=$(paralela stage ~/data)``)
or, with ``--json``, the whole result; the summary and warnings go to standard error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
)
from paralela.cli._options import json_option, quiet_option, workers_option

STAGE_HELP = (
    "Copy SRC (a directory or a file) to node-local scratch, in parallel, and print "
    "where the copy is.\n\n"
    "DEST defaults to $SLURM_TMPDIR/paralela-stage-USER/NAME (else $TMPDIR inside a "
    "Slurm job, else the temporary directory). Each copy is read back and its checksum "
    "compared before it gets its name; files already up to date (same size and time, "
    "recorded in DEST/.paralela-stage.jsonl) are skipped, changed ones copied anew. "
    "--back copies DEST to SRC instead (results home)."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (
        EXIT_FAILED,
        "a file could not be copied or did not verify (each is named; run the same "
        "command again to copy only those)",
    ),
    (EXIT_USAGE, "bad usage (SRC missing, DEST inside SRC, DEST not writable, not enough space)"),
    (EXIT_INTERRUPTED, "interrupted"),
    (
        EXIT_TERMINATED,
        "stopped by SIGTERM (scancel, a time limit): finished files are kept, as after Ctrl-C",
    ),
)
EPILOG = exit_codes_help(EXIT_CODES)


@app.command(
    help=STAGE_HELP,
    short_help="Copy a dataset to node-local scratch (verified, parallel), or results home.",
    epilog=EPILOG,
)
def stage(
    src: Annotated[Path, typer.Argument(help="The dataset (or, with --back, where results go).")],
    dest: Annotated[
        Path | None,
        typer.Argument(help="The copy (default: in node-local scratch, see above)."),
    ] = None,
    back: Annotated[
        bool, typer.Option("--back", help="Copy DEST to SRC: results from scratch, home.")
    ] = False,
    workers: Annotated[int | None, workers_option("Threads. Default: 4 per CPU, 8 to 32.")] = None,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Read each copy back and compare.")
    ] = True,
    verify_only: Annotated[
        bool,
        typer.Option("--verify-only", help="Copy nothing: check every staged file again."),
    ] = False,
    checksum: Annotated[
        str, typer.Option(help="auto (what DEST used, else blake2b), blake2b or sha256.")
    ] = "auto",
    json_: Annotated[bool, json_option("Print the result as JSON instead of the path.")] = False,
    quiet: Annotated[bool, quiet_option("No summary or warnings on stderr.")] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace files in DEST that paralela did not write; without it a stage "
            "that would replace one is refused (exit 2) before anything is copied.",
        ),
    ] = False,
) -> None:
    from paralela.staging import StageError, verify_stage
    from paralela.staging import stage as run_stage

    if verify_only and not verify:
        fail("--verify-only and --no-verify contradict each other; give one.", EXIT_USAGE)

    def waiting(holder: str) -> None:
        if not quiet:
            typer.echo(f"paralela stage: waiting for another stage ({holder})", err=True)

    def explain(exc: Exception) -> None:  # what was done before a StageError, then its line
        if isinstance(exc, StageError) and exc.result is not None:
            if not quiet:
                for warning in exc.result.warnings:
                    typer.echo(f"Warning: {warning}", err=True)
            if json_:
                report = {**exc.result.to_dict(), "error": str(exc), "failures": exc.failures}
                typer.echo(json.dumps(report, indent=2))

    with handling_errors(
        "Finished files are recorded, unfinished copies were deleted. "
        "Run the same command again to go on.",
        explain=explain,
    ):
        if verify_only:
            result = verify_stage(src, dest, back=back, workers=workers)
        else:
            result = run_stage(
                src, dest, back=back, workers=workers, verify=verify, checksum=checksum,
                on_wait=waiting, overwrite=overwrite,
            )  # fmt: skip
    if not quiet:
        for warning in result.warnings:
            typer.echo(f"Warning: {warning}", err=True)
        typer.echo(result.summary(), err=True)
    if json_:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(result.path)
