"""The options that several commands share, each defined once.

A command declares a shared option as ``name: Annotated[type, factory(...)]`` (or with
the ready alias), so that ``--workers`` is ``-w``, at least 1, in every command; where
commands mean different things by it (what a worker is, what ``--run-dir`` keeps) the
factory takes that one difference as its argument::

    workers: Annotated[int | None, workers_option("Fits at once. Default: the CPUs.")] = None
    retries: Annotated[int | None, retries_option("shard")] = None
    overwrite: Overwrite = False

Importing this module is cheap (typer only): every command module imports it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from paralela.cli._errors import EXIT_USAGE, fail

__all__ = [
    "BackendOptions",
    "Encoding",
    "Gpus",
    "InputFormat",
    "InputPaths",
    "ModelArgument",
    "Overwrite",
    "PROGRAM_AFTER_OPTIONS",
    "backend_option",
    "check_backend",
    "json_option",
    "output_option",
    "parse_options",
    "progress_option",
    "quiet_option",
    "retries_option",
    "run_dir_option",
    "slurm_additional_option",
    "slurm_option",
    "split_bytes_option",
    "timeout_min_option",
    "workers_option",
]

PROGRAM_AFTER_OPTIONS: dict[str, Any] = {"allow_extra_args": True, "allow_interspersed_args": False}
"""The context settings of a command that ends with a program and its arguments (the
trial command of ``sweep``, the program of ``launch``, the work of ``scale``). The
options before the program are the command's own and Click checks them as in any other
command: an unknown one (``--trail 3``, ``--nporc 2``) is refused with "No such option:
--x (Possible options: ...)", never taken for the program. The first token that is not
an option, or everything after ``--``, is the program, and every token from there on is
the program's (``launch train.py --epochs 3`` gives ``--epochs 3`` to train.py)."""

WORKERS_HELP = "Worker count. Default: the CPUs this process may use (or PARALELA_WORKERS)."


def workers_option(help: str = WORKERS_HELP) -> Any:
    """``--workers``/``-w N`` (at least 1); ``help`` says what a worker is here and its
    default."""
    return typer.Option("--workers", "-w", min=1, help=help, show_default=False)


def run_dir_option(help: str) -> Any:
    """``--run-dir``/``-d DIR``; ``help`` says what the command keeps there (and so what
    running again with it does), or its default."""
    return typer.Option("--run-dir", "-d", metavar="DIR", help=help, show_default=False)


def progress_option(what: str) -> Any:
    """``--progress/--no-progress``: show ``what`` on stderr, by default when stderr is
    a terminal."""
    return typer.Option(
        "--progress/--no-progress",
        help=f"Show {what} on stderr. Default: when stderr is a terminal.",
        show_default=False,
    )


def retries_option(what: str) -> Any:
    """``--retries K``: times a ``what`` (chunk, task, shard) is run again when its
    worker dies."""
    return typer.Option(
        "--retries",
        min=0,
        help=f"Times a {what} is run again when its worker dies (killed, crashed, out of "
        "memory). Default: 2.",
        show_default=False,
    )


def backend_option(help: str) -> Any:
    """``--backend``/``-b NAME``; ``help`` lists the backends this command runs on."""
    return typer.Option("--backend", "-b", help=help, show_default=False)


def check_backend(name: str | None) -> None:
    """Exit 2 naming the valid backends when ``name`` is none of them."""
    from paralela.backends import available_backends

    if name is not None and name not in available_backends():
        fail(
            f"Unknown backend {name!r}; valid backends are: {', '.join(available_backends())}.",
            EXIT_USAGE,
        )


BackendOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-O",
        metavar="KEY=VALUE",
        help="A backend option, repeatable; for --backend slurm e.g. slurm_partition=gpu, "
        "cpus_per_task=8, gpus_per_task=1, timeout_min=60, max_jobs=100.",
        show_default=False,
    ),
]


def parse_options(pairs: list[str] | None) -> dict[str, str]:
    """``--option`` values, ``["slurm_partition=gpu", ...]``, as a dict (exit 2 on one
    that is not KEY=VALUE); the backend checks the names and values."""
    options: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(
                f"--option expects KEY=VALUE, got {pair!r}; e.g. --option slurm_partition=gpu.",
                EXIT_USAGE,
            )
        options[key.strip()] = value.strip()
    return options


def output_option(help: str, metavar: str = "DIR") -> Any:
    """``--output``/``-o``; ``help`` says what is written there."""
    return typer.Option("--output", "-o", metavar=metavar, help=help, show_default=False)


Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Delete what --output holds that paralela did not write (another tool's "
        "output, your files) before writing; without it such a directory is refused "
        "(exit 2). paralela's own earlier output is replaced either way.",
    ),
]
InputPaths = Annotated[
    list[str],
    typer.Option(
        "--input",
        "-i",
        metavar="PATH",
        help="A file, directory or quoted glob ('corpus/*.txt'); repeatable.",
        show_default=False,
    ),
]
InputFormat = Annotated[
    str | None,
    typer.Option(
        "--input-format",
        metavar="text|jsonl|csv|parquet",
        help="How to read the inputs. Default: from each file's extension.",
        show_default=False,
    ),
]
Encoding = Annotated[
    str, typer.Option("--encoding", help="Encoding of text, JSONL and CSV inputs.")
]


def split_bytes_option(per: str) -> Any:
    """``--split-bytes SIZE``: the most bytes of a file per ``per`` (map task, shard)."""
    return typer.Option(
        "--split-bytes", metavar="SIZE", help=f"The most bytes of a file per {per}."
    )


def json_option(help: str) -> Any:
    """``--json``; ``help`` says what goes to stdout instead of the table."""
    return typer.Option("--json", help=help)


def quiet_option(help: str) -> Any:
    """``--quiet``/``-q``; ``help`` says what is left out."""
    return typer.Option("--quiet", "-q", help=help)


# Slurm job options, the same for `paralela sweep --backend slurm` and `paralela launch
# --slurm` (``panel``: the heading they are listed under in each command's --help).


SLURM_OPTION_HELP = {
    "partition": "The partition (queue) to submit to",
    "account": "The account the job is charged to",
    "qos": "The job's quality of service",
    "constraint": "Node features the job needs (e.g. a100)",
}


def slurm_option(name: str, panel: str) -> Any:
    """``--slurm-NAME`` (also ``--NAME``, as sbatch spells it) for ``name`` one of
    partition, account, qos, constraint: passed to sbatch as it is."""
    return typer.Option(
        f"--slurm-{name}",
        f"--{name}",
        help=f"{SLURM_OPTION_HELP[name]}: sbatch's --{name}, passed as it is.",
        rich_help_panel=panel,
    )


def timeout_min_option(panel: str) -> Any:
    """``--timeout-min``/``--time MINUTES``: the job's time limit."""
    return typer.Option(
        "--timeout-min", "--time", min=1, help="Job time limit, minutes.", rich_help_panel=panel
    )


def slurm_additional_option(panel: str) -> Any:
    """``--slurm-additional KEY=VALUE|KEY``, repeatable: more sbatch options."""
    return typer.Option(
        "--slurm-additional",
        help="More sbatch options, KEY=VALUE or KEY (repeat): reservation=r1, exclusive.",
        rich_help_panel=panel,
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
Gpus = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        metavar="IDS",
        help="GPUs to use ('0,2'), or 'none' for CPUs only. Default: every visible GPU.",
        show_default=False,
    ),
]
