"""Backends: where tasks run. One small interface, capabilities declared as data.

``get_backend(name, workers)`` returns a shared, long-lived backend for a name (workers
are reused across calls and stopped when the interpreter exits); pass a
:class:`Backend` instance instead of a name to manage its life yourself.

Reuse rule for the local pools (``processes``, ``threads``): one shared pool per name.
A call that asks for another worker count gets a new pool, and the old one is stopped
as soon as no run uses it (:func:`using` marks a run); a pool with more workers than
this process's CPUs is stopped when its last run ends. So idle workers never outnumber
the CPUs, however many worker counts one program asks for. Inside
:func:`keeping_pools` (``paralela scale`` measuring several worker counts in turn)
every pool is kept warm until the block ends.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from paralela.backends._base import Backend, Broadcast, Capabilities, usable_cpus
from paralela.errors import ConfigError

__all__ = [
    "Backend",
    "Broadcast",
    "LOCAL_POOLS",
    "Capabilities",
    "available_backends",
    "discard_backend",
    "get_backend",
    "keeping_pools",
    "make_backend",
    "register_backend",
    "shutdown_shared_backends",
    "using",
]


def _processes(workers: int | None) -> Backend:
    from paralela.backends._processes import ProcessBackend

    return ProcessBackend(workers)


def _threads(workers: int | None) -> Backend:
    from paralela.backends._threads import ThreadBackend

    return ThreadBackend(workers)


def _sequential(workers: int | None) -> Backend:
    from paralela.backends._sequential import SequentialBackend

    return SequentialBackend(workers)


def _slurm(workers: int | None, options: Mapping[str, Any] | None = None) -> Backend:
    from paralela.backends.slurm import SlurmBackend

    given = dict(options or {})
    if workers is not None:  # each array task is one (remote) worker
        given.setdefault("max_jobs", workers)
    return SlurmBackend(given)


_FACTORIES: dict[str, Callable[..., Backend]] = {
    "processes": _processes,
    "threads": _threads,
    "sequential": _sequential,
    "slurm": _slurm,
}
# Backends whose factory takes ``options`` (``factory(workers, options)``).
_TAKES_OPTIONS = {"slurm"}
# Local pools hold idle workers between calls: at most one shared pool per name.
LOCAL_POOLS = frozenset({"processes", "threads"})
_shared: dict[tuple[str, int | None, str], Backend] = {}
_shared_lock = threading.Lock()
_runs: dict[int, int] = {}  # id(backend) -> runs using it now
_keeping = 0  # keeping_pools() blocks open


def register_backend(
    name: str, factory: Callable[..., Backend], *, takes_options: bool = False
) -> None:
    """Make ``factory(workers)`` available as ``backend=name``; with ``takes_options``
    it is called as ``factory(workers, options)``."""
    _FACTORIES[name] = factory
    if takes_options:
        _TAKES_OPTIONS.add(name)
    else:
        _TAKES_OPTIONS.discard(name)


def available_backends() -> list[str]:
    """The names ``backend=`` accepts."""
    return sorted(_FACTORIES)


def get_backend(
    backend: str | Backend,
    workers: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> Backend:
    """The shared backend for ``backend``, ``workers`` and ``options``, started on first use.

    Raises:
        ConfigError: unknown backend name, ``workers`` below 1, options for a backend
            that takes none, or options the backend rejects.
    """
    if isinstance(backend, Backend):
        if options:
            raise ConfigError(
                "backend_options apply to a backend given by name; pass them to the "
                f"{type(backend).__name__} you constructed instead."
            )
        return backend
    _check(backend, workers, options)
    key = (backend, workers, repr(sorted((options or {}).items())))
    retired: list[Backend] = []
    with _shared_lock:
        found = _shared.get(key)
        if found is not None and not found.healthy():
            # Broken (workers died at start-up) or shut down: the next call starts afresh.
            found.shutdown(wait=False, cancel_futures=True)
            found = None
        if found is None:
            if backend in LOCAL_POOLS and not _keeping:  # one pool per name: idle others go
                for other_key, other in list(_shared.items()):
                    if other_key[0] == backend and not _runs.get(id(other)):
                        retired.append(_shared.pop(other_key))
            found = _shared[key] = _make(backend, workers, options)
    for old in retired:
        old.shutdown(wait=False, cancel_futures=True)
    return found


def make_backend(
    backend: str, workers: int | None = None, options: Mapping[str, Any] | None = None
) -> Backend:
    """A new backend of its own for ``backend`` (never shared); the caller shuts it down."""
    _check(backend, workers, options)
    return _make(backend, workers, options)


def _check(backend: str, workers: int | None, options: Mapping[str, Any] | None) -> None:
    if backend not in _FACTORIES:
        raise ConfigError(
            f"Unknown backend {backend!r}; valid backends are: {', '.join(available_backends())}."
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ConfigError(f"workers must be a positive integer or None, got {workers!r}.")
    if options and backend not in _TAKES_OPTIONS:
        raise ConfigError(
            f"Backend {backend!r} takes no options, got {', '.join(map(repr, options))}. "
            f"Backends with options: {', '.join(sorted(_TAKES_OPTIONS)) or 'none'}."
        )


def _make(backend: str, workers: int | None, options: Mapping[str, Any] | None) -> Backend:
    factory = _FACTORIES[backend]
    return factory(workers, options) if backend in _TAKES_OPTIONS else factory(workers)


@contextlib.contextmanager
def using(backend: Backend) -> Iterator[Backend]:
    """Mark a run on ``backend`` while the block runs, so the reuse rule (see the module
    docstring) never stops a pool under a run; an oversized shared pool stops after."""
    with _shared_lock:
        _runs[id(backend)] = _runs.get(id(backend), 0) + 1
    try:
        yield backend
    finally:
        retire = False
        with _shared_lock:
            left = _runs.pop(id(backend)) - 1
            if left:
                _runs[id(backend)] = left
            elif not _keeping:
                oversized = backend.effective_workers() > usable_cpus()
                for key, shared in list(_shared.items()):
                    if shared is backend and key[0] in LOCAL_POOLS and oversized:
                        del _shared[key]
                        retire = True
        if retire:
            backend.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def keeping_pools() -> Iterator[None]:
    """Keep every shared pool while the block runs (no reuse rule); when the last such
    block ends, the pools no run uses are stopped but the newest of each name."""
    global _keeping
    with _shared_lock:
        _keeping += 1
    try:
        yield
    finally:
        retired: list[Backend] = []
        with _shared_lock:
            _keeping -= 1
            if not _keeping:
                newest: dict[str, tuple[str, int | None, str]] = {}
                for key in _shared:
                    if key[0] in LOCAL_POOLS:
                        newest[key[0]] = key  # dicts keep insertion order
                for key, other in list(_shared.items()):
                    if key[0] in LOCAL_POOLS and key != newest[key[0]] and not _runs.get(id(other)):
                        retired.append(_shared.pop(key))
        for old in retired:
            old.shutdown(wait=False, cancel_futures=True)


def discard_backend(backend: Backend) -> None:
    """Forget a shared backend that is broken, so the next call starts a fresh one."""
    with _shared_lock:
        for key, value in list(_shared.items()):
            if value is backend:
                del _shared[key]
    backend.shutdown(wait=False, cancel_futures=True)


@atexit.register
def shutdown_shared_backends() -> None:
    """Stop every shared backend (runs at interpreter exit). Tasks still running belong
    to maps that were abandoned (an exception or Ctrl-C between a submit and its
    bookkeeping): nobody will read them, so they are stopped, not waited for."""
    with _shared_lock:
        backends = list(_shared.values())
        _shared.clear()
    for b in backends:
        b.terminate()
        b.shutdown(wait=True, cancel_futures=True)
