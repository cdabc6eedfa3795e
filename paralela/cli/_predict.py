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
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_USAGE,
    fail,
    handling_errors,
    resume_hint,
    said_with_notes,
)
from paralela.cli._load import load_function
from paralela.errors import MissingExtraError, ParalelaError

__all__ = ["GpusOption", "ModelArgument", "load_model", "predict_command"]


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


# The model class and the GPUs: the same for `paralela predict` and `paralela serve`.
ModelArgument = Annotated[
    str,
    typer.Argument(
        metavar="MODULE:CLASS",
        help="The model class: models:Embedder (models.py here) or path/to/file.py:Embedder.",
        show_default=False,
    ),
]
GpusOption = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        metavar="IDS",
        help="GPUs to use ('0,2'), or 'none' for CPUs only. Default: every visible GPU.",
        show_default=False,
    ),
]


def _parse_options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(
                f"--option expects KEY=VALUE, got {pair!r}; e.g. --option slurm_partition=gpu.",
                EXIT_USAGE,
            )
        options[key.strip()] = value.strip()
    return options


def _unwritable(exc: Exception) -> None:
    """The output cannot be written (a full disk, permissions): exit 1, saying so."""
    if isinstance(exc, OSError):
        fail(f"{exc}. Free space or choose another --output, then run again.", EXIT_FAILED)


def load_model(spec: str) -> Any:
    """The class ``spec`` names, checked (exit 2 with what to do when it is not a model)."""
    from paralela.serving import check_model

    target = load_function(spec)
    try:
        return check_model(target)
    except ParalelaError as exc:
        fail(str(exc), EXIT_USAGE)


@app.command(
    "predict",
    help=PREDICT_HELP,
    short_help="Batch prediction: a model class over files, on every core or GPU.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
def predict_command(
    model: ModelArgument,
    input_: Annotated[
        list[str],
        typer.Option(
            "--input",
            "-i",
            metavar="PATH",
            help="A file, directory or quoted glob ('texts/*.jsonl'); repeatable.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            metavar="DIR",
            help="Directory for the part files and _SUCCESS.",
            show_default=False,
        ),
    ],
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Delete what --output holds that paralela did not write (another tool's "
            "output, your files) before writing; without it such a directory is refused "
            "(exit 2). paralela's own earlier output is replaced either way.",
        ),
    ] = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Records per predict call.")
    ] = 32,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            min=1,
            help="Workers. Default: one per GPU, else one per CPU; on Slurm the most array tasks.",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        BackendName | None,
        typer.Option(
            "--backend",
            "-b",
            help="processes (default), sequential (one process: pdb works) or slurm.",
            show_default=False,
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            "-O",
            metavar="KEY=VALUE",
            help="A Slurm option, repeatable (slurm_partition=gpu, gpus_per_task=1, "
            "timeout_min=60).",
            show_default=False,
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            metavar="DIR",
            help="Keep finished shards in DIR; running again with it resumes.",
            show_default=False,
        ),
    ] = None,
    format_: Annotated[
        Format, typer.Option("--format", "-f", help="Format of the part files.")
    ] = Format.jsonl,
    input_format: Annotated[
        str | None,
        typer.Option(
            "--input-format",
            metavar="text|jsonl|csv|parquet",
            help="How to read the inputs. Default: from each file's extension.",
            show_default=False,
        ),
    ] = None,
    encoding: Annotated[
        str, typer.Option("--encoding", help="Encoding of text, JSONL and CSV inputs.")
    ] = "utf-8",
    split_bytes: Annotated[
        str,
        typer.Option("--split-bytes", metavar="SIZE", help="The most bytes of a file per shard."),
    ] = "16MiB",
    gpus: GpusOption = None,
    workers_per_gpu: Annotated[
        int,
        typer.Option("--workers-per-gpu", min=1, help="Workers sharing each GPU (small models)."),
    ] = 1,
    no_input: Annotated[
        bool,
        typer.Option("--no-input", help="Leave the input out of the rows (shard, row, output)."),
    ] = False,
    retries: Annotated[
        int | None,
        typer.Option(
            "--retries",
            min=0,
            help="Times a shard is run again when its worker dies. Default: 2.",
            show_default=False,
        ),
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="A progress bar of shards on stderr. Default: when stderr is a terminal.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a model class over files; see ``PREDICT_HELP``. Exits through
    :class:`typer.Exit` with the codes of :mod:`paralela.cli._errors`."""
    from paralela.serving._predict import predict

    cls = load_model(model)
    options = _parse_options(option or [])
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
