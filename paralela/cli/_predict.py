"""``paralela predict``: a model class over files, one part file per shard.

::

    models.py:Embedder ──load (like paralela map)──> check_model ──> paralela.predict(...)
    --input PATH (repeatable) ──> shards ──> workers (one model each) ──> --output DIR
    summary ──> stderr; a failure ──> one paragraph on stderr and an exit code
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer

from paralela._config import UNSET
from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_RUN_DIR,
    EXIT_USAGE,
    EXIT_WORKER_DIED,
    INTERRUPTED,
    TERMINATED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
    resume_hint,
    said_with_notes,
)
from paralela.cli._load import load_function
from paralela.cli._options import (
    BackendOptions,
    Encoding,
    Gpus,
    InputFormat,
    InputPaths,
    ModelArgument,
    Overwrite,
    backend_option,
    output_option,
    parse_options,
    progress_option,
    retries_option,
    run_dir_option,
    split_bytes_option,
    workers_option,
)
from paralela.errors import MissingExtraError, ParalelaError

__all__ = ["load_model", "predict_command"]


class Format(str, enum.Enum):
    jsonl = "jsonl"
    parquet = "parquet"


class BackendName(str, enum.Enum):
    processes = "processes"
    sequential = "sequential"
    slurm = "slurm"


PREDICT_HELP = (
    "Run the model class MODULE:CLASS over every record of every --input (lines of "
    "text files, JSON Lines, CSV rows or Parquet rows) and write its outputs to --output.\n\n"
    "Example: paralela predict models.py:Embedder --input 'texts/*.jsonl' --output "
    "embeddings/ --batch-size 64 --run-dir runs/embed\n\n"
    "The class has predict(self, batch) returning one output per input, and optionally "
    "setup(self, device), run once per worker. Each worker is pinned to a slot of this "
    "machine (a GPU each when there are GPUs) and builds the model once. One "
    'part-NNNNN.jsonl (or .parquet) per shard holds rows {"shard", "row", "input", '
    '"output"}, in input order; _SUCCESS is written last. With --run-dir, running again '
    "after a crash or Ctrl-C predicts only the unfinished shards."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (
        EXIT_FAILED,
        "the model raised or returned something unusable (the shard is named), or the "
        "output could not be written (a full disk)",
    ),
    (EXIT_USAGE, "bad usage or input (MODULE:CLASS is not a model class, a missing extra)"),
    (EXIT_WORKER_DIED, "a shard's worker died more often than --retries allows"),
    (EXIT_RUN_DIR, "the --run-dir was made for another model, input or output"),
    INTERRUPTED,
    TERMINATED,
)


def _unwritable(exc: Exception) -> None:
    """The output cannot be written (a full disk, permissions): exit 1, saying so."""
    if isinstance(exc, OSError):
        fail(f"{exc}. Free space or choose another --output, then run again.", EXIT_FAILED)


def load_model(spec: str) -> Any:
    """The class ``spec`` names, checked (exit 2 with what to do when it is not a model)."""
    from paralela.serving import check_model

    target = load_function(spec, kind="class")
    try:
        return check_model(target)
    except ParalelaError as exc:
        fail(str(exc), EXIT_USAGE)


@app.command(
    "predict",
    help=PREDICT_HELP,
    short_help="Batch prediction: a model class over files, on every core or GPU.",
    epilog=exit_codes_help(
        EXIT_CODES,
        "With --run-dir, running the same command again predicts only the unfinished shards.",
    ),
    no_args_is_help=True,
)
def predict_command(
    model: ModelArgument,
    input_: InputPaths,
    output: Annotated[Path, output_option("Directory for the part files and _SUCCESS.")],
    overwrite: Overwrite = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Records per predict call.")
    ] = 32,
    workers: Annotated[
        int | None,
        workers_option(
            "Workers. Default: one per GPU, else one per CPU; on Slurm the most array tasks."
        ),
    ] = None,
    backend: Annotated[
        BackendName | None,
        backend_option("processes (default), sequential (one process: pdb works) or slurm."),
    ] = None,
    option: BackendOptions = None,
    run_dir: Annotated[
        Path | None, run_dir_option("Keep finished shards in DIR; running again with it resumes.")
    ] = None,
    format_: Annotated[
        Format, typer.Option("--format", "-f", help="Format of the part files.")
    ] = Format.jsonl,
    input_format: InputFormat = None,
    encoding: Encoding = "utf-8",
    split_bytes: Annotated[str, split_bytes_option("shard")] = "16MiB",
    gpus: Gpus = None,
    workers_per_gpu: Annotated[
        int,
        typer.Option("--workers-per-gpu", min=1, help="Workers sharing each GPU (small models)."),
    ] = 1,
    no_input: Annotated[
        bool,
        typer.Option("--no-input", help="Leave the input out of the rows (shard, row, output)."),
    ] = False,
    retries: Annotated[int | None, retries_option("shard")] = None,
    progress: Annotated[bool | None, progress_option("a progress bar of shards")] = None,
) -> None:
    """Run a model class over files; see ``PREDICT_HELP``. Exits through
    :class:`typer.Exit` with the codes of :mod:`paralela.cli._errors`."""
    from paralela.serving import predict

    cls = load_model(model)
    options = parse_options(option)
    with handling_errors(
        resume_hint(run_dir, "shards", again="run the same command again"),
        codes=((MissingExtraError, EXIT_USAGE),),
        say=said_with_notes,
        explain=_unwritable,
    ):
        result = predict(
            cls,
            input_[0] if len(input_) == 1 else list(input_),
            output=output,
            batch_size=batch_size,
            workers=UNSET if workers is None else workers,
            backend=UNSET if backend is None else backend.value,
            backend_options=options or None,
            run_dir=run_dir,
            output_format=format_.value,
            mode="overwrite" if overwrite else "errorifexists",
            input_format=input_format,
            progress=UNSET if progress is None else progress,
            keep_input=not no_input,
            gpus=gpus,
            workers_per_gpu=workers_per_gpu,
            split_bytes=split_bytes,
            encoding=encoding,
            retries=UNSET if retries is None else retries,
        )
    typer.echo(f"paralela predict: {result}; {len(result.files)} files in {output}", err=True)
