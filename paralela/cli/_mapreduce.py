"""``paralela mapreduce``: a job file's mapper and reducer over files, on every core.

::

    job.py ──import (its directory first on sys.path)──> mapper, reducer, combiner?
    --input 'corpus/*.txt' (repeatable) ──> paralela.mapreduce(...)
        --output DIR: part-NNNNN.jsonl|parquet + _SUCCESS; else JSON Lines on stdout
    summary ──> stderr; a failure ──> one paragraph on stderr and an exit code
"""

from __future__ import annotations

import enum
import errno
import json
import sys
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
    InputFormat,
    InputPaths,
    Overwrite,
    backend_option,
    check_backend,
    output_option,
    parse_options,
    progress_option,
    retries_option,
    run_dir_option,
    split_bytes_option,
    workers_option,
)
from paralela.errors import MissingExtraError, ParalelaError

__all__ = ["mapreduce_command"]


class Format(str, enum.Enum):
    jsonl = "jsonl"
    parquet = "parquet"
    text = "text"


class Engine(str, enum.Enum):
    local = "local"
    spark = "spark"


MAPREDUCE_HELP = (
    "Run the mapper and reducer that JOB.py defines (and its combiner, if it defines "
    "one) over the records of every --input: lines of text files (gzip too), JSON "
    "Lines, CSV rows or Parquet rows.\n\n"
    "Example: paralela mapreduce examples/wordcount.py --input 'corpus/*.txt' "
    "--output counts/\n\n"
    "With --output, one part-NNNNN.jsonl (or .parquet) file per partition and a "
    "_SUCCESS manifest are written there; without it, the pairs go to stdout as JSON "
    'Lines {"key": ..., "value": ...}, partition after partition (keys sorted within '
    "a partition, not across them: pipe through sort for a total order). A summary "
    "goes to stderr.\n\n"
    "Hadoop Streaming jobs run unchanged: instead of JOB.py, give --mapper CMD and "
    "--reducer CMD (and --combiner CMD), programs that read lines on stdin and write "
    "key<TAB>value lines on stdout. Example: paralela mapreduce --mapper 'python3 "
    "mapper.py' --reducer 'python3 reducer.py' --input 'corpus/*.txt' --output counts/ "
    "(text part files of key<TAB>value lines, as Hadoop writes; key<TAB>value lines on "
    "stdout without --output)."
)

EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (
        EXIT_FAILED,
        "the mapper, combiner or reducer raised or returned something unusable (the "
        "record or key is named), an input is unreadable or malformed, or the results "
        "could not be written (a full disk, a value JSON cannot hold)",
    ),
    (EXIT_USAGE, "bad usage or input (a job without mapper or reducer, a missing extra)"),
    (EXIT_WORKER_DIED, "a task's worker died more often than --retries allows"),
    (EXIT_RUN_DIR, "the --run-dir belongs to another job"),
    INTERRUPTED,
    TERMINATED,
)


def _job_functions(job: str) -> tuple[Any, Any, Any, bool]:
    """``mapper``, ``reducer``, ``combiner`` (or ``None``) and ``batched`` (False unless
    the file sets ``batched = True``: its mapper takes a list of records) of a job file
    or module."""
    mapper = load_function(f"{job}:mapper")
    module = sys.modules[mapper.__module__]
    if not callable(getattr(module, "reducer", None)):
        fail(
            f"{job} defines mapper but no reducer function: a job file defines "
            "mapper(record) and reducer(key, values), and may define combiner(key, values).",
            EXIT_USAGE,
        )
    combiner = getattr(module, "combiner", None)
    if combiner is not None and not callable(combiner):
        fail(f"{job} defines combiner, but it is not a function.", EXIT_USAGE)
    batched = getattr(module, "batched", False)
    if not isinstance(batched, bool):
        fail(f"{job} sets batched = {batched!r}; it must be True or False.", EXIT_USAGE)
    return mapper, module.reducer, combiner, batched


def _full_disk(exc: Exception) -> None:
    """A job that stopped on a full disk exits 1: a failure to retry once there is
    room, not a usage error (the code its RunStoreError would have)."""
    cause = exc.__cause__
    full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
    if full and isinstance(exc, ParalelaError):
        fail(said_with_notes(exc), EXIT_FAILED)


def _print_pairs(result: Any) -> None:
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
    out = sys.stdout
    for key, value in result:
        try:
            line = encode({"key": key, "value": value})
        except (TypeError, ValueError) as exc:
            fail(
                f"The value for key {key!r} cannot be printed as JSON ({exc}). Return "
                "JSON values from the reducer, or use --output DIR --format parquet.",
                EXIT_FAILED,
            )
        out.write(line + "\n")
    out.flush()


def _print_text(result: Any) -> None:
    """The pairs as ``key<TAB>value`` lines (a ``None`` value: the key alone)."""
    out = sys.stdout
    for key, value in result:
        out.write(f"{key}\n" if value is None else f"{key}\t{value}\n")
    out.flush()


@app.command(
    "mapreduce",
    help=MAPREDUCE_HELP,
    short_help="Map, shuffle by key and reduce over files (word counts, vocabularies).",
    epilog=exit_codes_help(
        EXIT_CODES, "With --run-dir, running the same command again resumes the job."
    ),
    no_args_is_help=True,
)
def mapreduce_command(
    input_: InputPaths,
    job: Annotated[
        str | None,
        typer.Argument(
            metavar="[JOB.py]",
            help="A Python file (or module) defining mapper(record), reducer(key, values) "
            "and optionally combiner(key, values). Or give --mapper and --reducer commands.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        output_option(
            "Write part-NNNNN files and _SUCCESS to DIR (atomically). Default: JSON Lines "
            "on stdout."
        ),
    ] = None,
    overwrite: Overwrite = False,
    format_: Annotated[
        Format | None,
        typer.Option(
            "--format",
            "-f",
            help="Format of the --output files. Default: jsonl; text (key<TAB>value "
            "lines) with --mapper/--reducer commands.",
            show_default=False,
        ),
    ] = None,
    mapper_command: Annotated[
        str | None,
        typer.Option(
            "--mapper",
            metavar="CMD",
            help="A command as the mapper (Hadoop Streaming): reads records as lines on "
            "stdin, writes key<TAB>value lines.",
            show_default=False,
        ),
    ] = None,
    reducer_command: Annotated[
        str | None,
        typer.Option(
            "--reducer",
            metavar="CMD",
            help="A command as the reducer: reads key<TAB>value lines sorted by key, "
            "writes key<TAB>value lines.",
            show_default=False,
        ),
    ] = None,
    combiner_command: Annotated[
        str | None,
        typer.Option(
            "--combiner",
            metavar="CMD",
            help="A command as the combiner, run on each batch of the mapper's lines.",
            show_default=False,
        ),
    ] = None,
    input_format: InputFormat = None,
    encoding: Encoding = "utf-8",
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            "-p",
            min=1,
            help="Reduce tasks. Default: 2 x workers.",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[int | None, workers_option()] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            "--memory-limit",
            metavar="SIZE",
            help="Map-side buffer per map task before it spills to disk, e.g. 512MB. "
            "Default: a quarter of this allocation's memory over the workers.",
            show_default=False,
        ),
    ] = None,
    split_bytes: Annotated[str, split_bytes_option("map task")] = "64MiB",
    run_dir: Annotated[
        Path | None,
        run_dir_option(
            "Keep the job's state in DIR; running again with it resumes (needed with "
            "--backend slurm, on a shared filesystem)."
        ),
    ] = None,
    engine: Annotated[
        Engine, typer.Option("--engine", help="local (processes, Slurm) or spark.")
    ] = Engine.local,
    master: Annotated[
        str | None,
        typer.Option(
            "--master",
            metavar="URL",
            help="Spark master for --engine spark: local[*] (default), spark://host:7077, yarn.",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        str | None,
        backend_option("processes (default), threads, sequential, or slurm (see --option)."),
    ] = None,
    option: BackendOptions = None,
    retries: Annotated[int | None, retries_option("task")] = None,
    progress: Annotated[bool | None, progress_option("progress bars")] = None,
) -> None:
    """Run a MapReduce job file; see ``MAPREDUCE_HELP``. Exits through :class:`typer.Exit`
    with the codes of :mod:`paralela.cli._errors`."""
    from paralela.mapreduce import mapreduce

    check_backend(backend)
    backend_options = parse_options(option)
    commands = (mapper_command, reducer_command, combiner_command)
    streaming = any(c is not None for c in commands)
    if job is not None and streaming:
        fail(
            "Give a JOB.py or --mapper/--reducer commands, not both.",
            EXIT_USAGE,
        )
    if job is not None:
        mapper, reducer, combiner, batched = _job_functions(job)
    elif mapper_command is None or reducer_command is None:
        fail(
            "Give a JOB.py defining mapper and reducer, or both --mapper CMD and "
            "--reducer CMD (Hadoop Streaming commands).",
            EXIT_USAGE,
        )
    else:
        mapper, reducer, combiner, batched = mapper_command, reducer_command, combiner_command, True
    fmt = format_ or (Format.text if streaming else Format.jsonl)
    with handling_errors(
        resume_hint(run_dir, "tasks"),
        codes=((MissingExtraError, EXIT_USAGE),),
        say=said_with_notes,
        explain=_full_disk,
    ):
        result = mapreduce(
            mapper,
            reducer,
            input_[0] if len(input_) == 1 else list(input_),
            combiner=combiner,
            partitions=partitions,
            engine=engine.value,
            workers=UNSET if workers is None else workers,
            backend=UNSET if backend is None else backend,
            memory_limit=memory_limit,
            run_dir=run_dir,
            output=output,
            output_format=fmt.value,
            mode="overwrite" if overwrite else "errorifexists",
            input_format=input_format,
            encoding=encoding,
            split_bytes=split_bytes,
            retries=UNSET if retries is None else retries,
            progress=UNSET if progress is None else progress,
            backend_options=backend_options or None,
            master=master,
            batched=batched,
        )
        if output is None:
            _print_text(result) if fmt is Format.text else _print_pairs(result)
    where = f"; {len(result.output_files)} files in {output}" if output is not None else ""
    typer.echo(f"paralela mapreduce: {result.summary}{where}", err=True)
