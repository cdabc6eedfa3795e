"""``paralela serve``: a model class behind HTTP, one model worker per GPU or CPU share.

::

    models.py:Embedder ──load (like paralela predict)──> check_model ──> paralela.serve(...)
    --token-file F ──> the token (its first line)       --max-body 1MB ──> bytes
    ready ──> one line on stderr: "paralela serve: ready on http://127.0.0.1:8000 (...)"
    SIGINT / SIGTERM ──> drain, stop the workers, exit 0; a setup that fails ──> exit 1
"""

from __future__ import annotations

import warnings
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
    said_over_lines,
)
from paralela.cli._options import Gpus, ModelArgument, workers_option
from paralela.cli._predict import load_model
from paralela.errors import ConfigError, MissingExtraError

__all__ = ["serve_command"]

SERVE_HELP = (
    "Serve the model class MODULE:CLASS over HTTP on this machine, one model worker per "
    "GPU (or per CPU share), with dynamic batching.\n\n"
    "Example: paralela serve models.py:Embedder --port 8000 --max-batch 64\n\n"
    'POST /predict with {"input": x} answers {"output": y}; with {"inputs": \\[x, ...]} '
    'it answers {"outputs": \\[y, ...]}. GET /health is 200 once every worker has run '
    "setup, GET /metrics is in Prometheus's format, /docs shows the API. It listens on "
    "127.0.0.1 unless --host says otherwise; give --token-file when it does. SIGINT or "
    "SIGTERM stops it after the requests in flight are answered."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "stopped by SIGINT (Ctrl-C) or SIGTERM once the requests in flight were answered"),
    (EXIT_FAILED, "the server could not start or went down (a model worker's setup raised)"),
    (
        EXIT_USAGE,
        "bad usage (MODULE:CLASS is not a model class, an unreadable --token-file, a "
        "missing extra)",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C) while the model still loaded, before serving"),
    (EXIT_TERMINATED, "stopped by SIGTERM while the model still loaded, before serving"),
)


def _read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"Cannot read the token file {path}: {exc}.", EXIT_USAGE)
    if not token or not token[0].strip():
        fail(f"The token file {path} is empty; put the token on its first line.", EXIT_USAGE)
    return token[0].strip()


def _show_warning(message: Warning | str, category: type[Warning], *args: object,
                  **kwargs: object) -> None:  # fmt: skip
    typer.echo(str(message), err=True)


def _parse_bytes(text: str) -> int:
    from paralela.files import parse_size

    try:
        return parse_size(text, "--max-body")
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)


@app.command(
    "serve",
    help=SERVE_HELP,
    short_help="Serve a model class over HTTP, with dynamic batching.",
    epilog=exit_codes_help(EXIT_CODES),
    no_args_is_help=True,
)
def serve_command(
    model: ModelArgument,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port; 0 takes a free one.")
    ] = 8000,
    workers: Annotated[
        int | None,
        workers_option(
            "Model workers. Default: one per GPU (x --workers-per-device), else one per 4 CPUs."
        ),
    ] = None,
    workers_per_device: Annotated[
        int,
        typer.Option("--workers-per-device", min=1, help="Workers sharing each GPU."),
    ] = 1,
    gpus: Gpus = None,
    max_batch: Annotated[
        int, typer.Option("--max-batch", min=1, help="The most inputs per predict call.")
    ] = 32,
    max_wait_ms: Annotated[
        float,
        typer.Option(
            "--max-wait-ms",
            min=0,
            help="How long a free worker waits for a fuller batch (0: takes what is waiting; "
            "batches grow anyway while the workers are busy).",
        ),
    ] = 0.0,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue", min=1, help="The most inputs waiting; beyond, 503 with Retry-After."
        ),
    ] = 1024,
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0, help="Seconds a request waits before a 504."),
    ] = 30.0,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            help="Require 'Authorization: Bearer <token>', the token being FILE's first line.",
            show_default=False,
        ),
    ] = None,
    max_body: Annotated[
        str, typer.Option("--max-body", metavar="SIZE", help="The largest request body.")
    ] = "1MiB",
    read_timeout: Annotated[
        float,
        typer.Option(
            "--read-timeout",
            help="Seconds a client has to send a whole request (headers and body); beyond, "
            "408 and its connection is closed.",
        ),
    ] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            "--max-connections",
            min=1,
            help="Connections open at once, at most; beyond, the one that has waited "
            "longest without a whole request is closed. Default: 10,000, or what the file "
            "descriptor limit (ulimit -n) allows.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", help="uvicorn's log level; 'info' logs every request."),
    ] = "warning",
) -> None:
    """Serve a model class; see ``SERVE_HELP``. Exits through :class:`typer.Exit` with
    the codes of :mod:`paralela.cli._errors`."""
    from paralela.serving import ExposedServerWarning, serve

    cls = load_model(model)
    token = _read_token(token_file) if token_file is not None else None
    usage = ((MissingExtraError, EXIT_USAGE),)
    with handling_errors(codes=usage, say=said_over_lines), warnings.catch_warnings():
        warnings.simplefilter("always", ExposedServerWarning)
        warnings.showwarning = _show_warning  # one line on stderr, not Python's two
        serve(
            cls,
            host=host,
            port=port,
            workers=workers,
            workers_per_device=workers_per_device,
            gpus=gpus,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_queue=max_queue,
            timeout=timeout,
            token=token,
            max_body_bytes=_parse_bytes(max_body),
            read_timeout=read_timeout,
            max_connections=max_connections,
            log_level=log_level,
        )
    typer.echo("paralela serve: stopped", err=True)
