"""``paralela.serve``: a model class behind HTTP, one model worker per slot, with dynamic
batching.

::

    serve(Model)
      check_model, options ──> ConfigError before anything starts
      slots = worker_slots(...)        one per GPU (x workers_per_device), or CPU shares
      socket bound on host:port        127.0.0.1 unless told otherwise (elsewhere without a
                                       token: a warning); port 0: a free one
      connections (_serve_http)        each request read within read_timeout (else 408), at
                                       most max_connections open within the descriptor limit
      uvicorn ── lifespan: WorkerPool.start() ── workers set up in the background
          /health 503 "starting" until every worker is ready, then the ready line on stderr
      SIGINT / SIGTERM ──> stop accepting, answer every request in flight, stop the workers,
                           return (the CLI exits 0)
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError, MissingExtraError
from paralela.serving._model import ModelError, check_model

if TYPE_CHECKING:
    from paralela.serving._serve_http import ConnectionLimits

__all__ = ["CPUS_PER_WORKER", "ExposedServerWarning", "serve"]

#: Without GPUs, a worker per this many CPUs by default: a batched model uses threads
#: well, and the server's event loop needs a CPU too. On 2 CPUs one worker with 2 threads
#: answered 1.9x the requests/s of two with one thread each (the embedding example), and
#: bench/results/serve.md has it at 85 % of the model's own batched ceiling. It assumes the
#: CPUs are the server's alone: an OpenMP team waits at each barrier for a thread that lost
#: its core, so beside other load (bench_serve.py's crowded run) --workers N with one
#: thread each degrades more gently. Measured again on the anchors' machine (AMD EPYC, 2
#: CPUs, bench/results/round8-serve-workers.md and round8-serve-full-2workers.md): two
#: workers of one thread were ahead at c=8 and c=64 (+10-20 %) and behind at c=32 (-10 %,
#: their batches stayed at 5-6 inputs), so the default stays.
CPUS_PER_WORKER = 4


class ExposedServerWarning(UserWarning):
    """``serve`` listens beyond this machine with no token: anyone who reaches it may use
    the model."""


def serve(
    model: type,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int | None = None,
    workers_per_device: int = 1,
    gpus: str | Sequence[str | int] | None = None,
    max_batch: int = 32,
    max_wait_ms: float = 0.0,
    max_queue: int = 1024,
    timeout: float = 30.0,
    token: str | None = None,
    max_body_bytes: int = 1 << 20,
    read_timeout: float = 30.0,
    max_connections: int | None = None,
    log_level: str = "warning",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``model`` over HTTP until SIGINT or SIGTERM; then drain and return.

    ``POST /predict`` takes ``{"input": x}`` and answers ``{"output": y}``, or takes
    ``{"inputs": [x, ...]}`` and answers ``{"outputs": [y, ...]}``. Inputs from every
    request queue together and go to the model workers in batches.

    Args:
        model: a class with ``predict(self, batch) -> list`` and optionally
            ``setup(self, device)``, ``input_model`` and ``output_model`` (pydantic
            models: the body is validated against them, and ``/docs`` shows them).
        host: the address to listen on; the default answers this machine only. Give
            ``0.0.0.0`` to expose the server (with a ``token``: without one, an
            :class:`ExposedServerWarning`).
        port: the TCP port; 0 takes a free one (the ready line names it).
        workers: model worker processes. Default: one per GPU times
            ``workers_per_device``; without GPUs, one per 4 CPUs (at least one), each
            with its share of the CPUs as its thread limit.
        workers_per_device: workers sharing each GPU (small models).
        gpus: the GPUs to use (``"0,2"``), or ``"none"`` for CPUs only.
        max_batch: the most inputs per ``predict`` call.
        max_wait_ms: how long a batch smaller than ``max_batch`` waits for more inputs,
            from its first input's arrival (default: not at all). Under load batches
            fill without waiting, as inputs queue while the workers are busy.
        max_queue: the most inputs waiting; beyond, requests get 503 with Retry-After.
        timeout: seconds a request waits for its answer before a 504; a batch that takes
            longer than this (plus 10 s) has its worker killed and restarted.
        token: when set, ``/predict`` and ``/metrics`` require the header
            ``Authorization: Bearer <token>`` (compared in constant time).
        max_body_bytes: the largest request body; larger ones get 413.
        read_timeout: seconds a client has to send a whole request, headers and body, from
            its connection (or, on a kept-alive one, from the request's first byte);
            beyond, it gets 408 and its connection is closed.
        max_connections: the most connections open at once. Beyond, the connection that
            has waited longest without sending a whole request (or idles between two) is
            closed for the new one, so stalled clients never keep others out. Default:
            10,000, or what the file descriptor limit allows (the soft limit is raised to
            the hard one as far as needed).
        log_level: uvicorn's log level (``"info"`` logs each request).
        on_ready: called with the server's URL once every worker has finished setup
            (default: a line on stderr).

    Raises:
        ConfigError: a bad model class or option, the port is taken, or
            ``max_connections`` does not fit in the file descriptor limit.
        MissingExtraError: FastAPI or uvicorn is not installed.
        ModelError: a worker's setup failed at start (the server stops).
    """
    check_model(model)
    _check_options(max_batch, max_wait_ms, max_queue, timeout, max_body_bytes, port)
    _check_connections(read_timeout, max_connections)
    _check_extra()
    from paralela.serving._serve_app import ServeOptions, build_app
    from paralela.serving._serve_batcher import Batcher
    from paralela.serving._serve_http import connection_limits, guarded_protocol, is_loopback
    from paralela.serving._serve_metrics import Metrics
    from paralela.serving._serve_pool import WorkerPool, worker_envs
    from paralela.serving._slots import worker_slots

    slots = worker_slots(
        workers,
        gpus,
        workers_per_device,
        option="workers_per_device",
        cpus_per_worker=CPUS_PER_WORKER,
    )
    if token is None and not is_loopback(_resolve(host, port)[3]):
        _warn_exposed(host)
    limits = connection_limits(max_connections, read_timeout, len(slots))
    sock = _bind(host, port, limits.backlog)
    url = _url(host, sock.getsockname()[1])
    batcher = Batcher(max_batch, max_wait_ms / 1000, max_queue)  # the pool counts workers
    metrics = Metrics()
    fatal: list[ModelError] = []
    server: Any = None

    def ready() -> None:
        if on_ready is not None:
            on_ready(url)
        else:
            print(f"paralela serve: ready on {url} ({len(slots)} workers, max batch "
                  f"{max_batch})", file=sys.stderr, flush=True)  # fmt: skip

    def stop(error: ModelError) -> None:
        fatal.append(error)
        server.should_exit = True

    pool = WorkerPool(model, worker_envs(slots), batcher, metrics,
                      hang_timeout=timeout + 10, stall_after=timeout, on_ready=ready,
                      on_fatal=stop)  # fmt: skip
    app = build_app(model, pool, batcher, metrics, ServeOptions(timeout, token, max_body_bytes))
    server = _Server(_uvicorn_config(app, guarded_protocol(limits), limits, log_level, timeout))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        pool.kill()  # after a forced exit (a second Ctrl-C) the lifespan did not stop them
    if fatal:
        raise fatal[0]


def _check_extra() -> None:
    """Raise :class:`MissingExtraError` unless the ``serve`` extra is installed."""
    try:
        import fastapi  # noqa: F401
        import httptools  # noqa: F401  (the HTTP parser the connection limits are made on)
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(exc.name or "fastapi", "serve", "paralela serve") from exc


def _warn_exposed(host: str) -> None:
    warnings.warn(
        f"paralela serve: listening on {host} with no token (token=, --token-file): "
        "anyone who reaches this machine can use the model.",
        ExposedServerWarning,
        stacklevel=3,  # serve's caller
    )


def _uvicorn_config(
    app: Any, protocol: type, limits: ConnectionLimits, log_level: str, timeout: float
) -> Any:
    """uvicorn's configuration: the guarded protocol and backlog of ``limits``, and a
    graceful stop that lets the longest request finish (its timeout, plus 5 s)."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=log_level in ("debug", "trace", "info"),
        lifespan="on",
        http=protocol,
        backlog=limits.backlog,
        timeout_graceful_shutdown=math.ceil(timeout) + 5,
        server_header=False,
    )


class _Server:
    """uvicorn's server, made on demand (uvicorn is imported only when serving), that
    returns after a graceful stop on SIGINT or SIGTERM instead of raising the signal
    again when it is done."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                import signal
                import threading

                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                handled = (signal.SIGINT, signal.SIGTERM)
                previous = {s: signal.signal(s, self.handle_exit) for s in handled}
                try:
                    yield
                finally:
                    for s, handler in previous.items():
                        signal.signal(s, handler)

        return Server(config)


def _check_options(max_batch: int, max_wait_ms: float, max_queue: int, timeout: float,
                   max_body_bytes: int, port: int) -> None:  # fmt: skip
    def whole(name: str, value: Any, minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name} must be an integer of at least {minimum}, got {value!r}.")

    whole("max_batch", max_batch, 1)
    whole("max_queue", max_queue, 1)
    whole("max_body_bytes", max_body_bytes, 1)
    whole("port", port, 0)
    if port > 65535:
        raise ConfigError(f"port must be at most 65535, got {port}.")
    if max_queue < max_batch:
        raise ConfigError(
            f"max_queue ({max_queue}) is smaller than max_batch ({max_batch}): a batch could "
            "never fill. Raise max_queue or lower max_batch."
        )
    for name, value in (("max_wait_ms", max_wait_ms), ("timeout", timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{name} must be a number of at least 0, got {value!r}.")
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be finite, got {value!r}.")
    if timeout <= 0:
        raise ConfigError(f"timeout must be more than 0 seconds, got {timeout!r}.")


def _check_connections(read_timeout: float, max_connections: int | None) -> None:
    if (
        isinstance(read_timeout, bool)
        or not isinstance(read_timeout, (int, float))
        or not 0 < read_timeout < math.inf
    ):
        raise ConfigError(f"read_timeout must be a finite number of seconds above 0, got "
                          f"{read_timeout!r}.")  # fmt: skip
    if max_connections is not None and (
        isinstance(max_connections, bool)
        or not isinstance(max_connections, int)
        or max_connections < 1
    ):
        raise ConfigError(f"max_connections must be an integer of at least 1, got "
                          f"{max_connections!r}.")  # fmt: skip


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port``.

    Raises:
        ConfigError: the address is unknown here or the port is taken.
    """
    family, kind, proto, address = _resolve(host, port)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}. Choose another --port "
            "(0 takes a free one), or stop what listens there."
        ) from None
    sock.set_inheritable(True)
    return sock


def _resolve(host: str, port: int) -> tuple[Any, Any, int, Any]:
    """The family, socket type, protocol and address to listen on ``host:port``.

    Raises:
        ConfigError: the address is unknown here.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ConfigError(f"host {host!r} is not an address of this machine ({exc}).") from None
    return family, kind, proto, address


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
