"""Backends: where tasks run. One small interface, capabilities declared as data.

``get_backend(name, workers)`` returns a shared, long-lived backend for a name (workers
are reused across calls and stopped when the interpreter exits); pass a
:class:`Backend` instance instead of a name to manage its life yourself.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Mapping
from typing import Any

from paralela.backends._base import Backend, Broadcast, Capabilities
from paralela.errors import ConfigError

__all__ = [
    "Backend",
    "Broadcast",
    "Capabilities",
    "available_backends",
    "discard_backend",
    "get_backend",
    "register_backend",
    "shutdown_shared_backends",
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
_shared: dict[tuple[str, int | None, str], Backend] = {}
_shared_lock = threading.Lock()


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
    if backend not in _FACTORIES:
        raise ConfigError(
            f"Unknown backend {backend!r}; valid backends are: {', '.join(available_backends())}."
        )
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be a positive integer or None, got {workers!r}.")
    if options and backend not in _TAKES_OPTIONS:
        raise ConfigError(
            f"Backend {backend!r} takes no options, got {', '.join(map(repr, options))}. "
            f"Backends with options: {', '.join(sorted(_TAKES_OPTIONS)) or 'none'}."
        )
    key = (backend, workers, repr(sorted((options or {}).items())))
    with _shared_lock:
        found = _shared.get(key)
        if found is not None and not found.healthy():
            # Broken (workers died at start-up) or shut down: the next call starts afresh.
            found.shutdown(wait=False, cancel_futures=True)
            found = None
        if found is None:
            factory = _FACTORIES[backend]
            made = factory(workers, options) if backend in _TAKES_OPTIONS else factory(workers)
            found = _shared[key] = made
        return found


def discard_backend(backend: Backend) -> None:
    """Forget a shared backend that is broken, so the next call starts a fresh one."""
    with _shared_lock:
        for key, value in list(_shared.items()):
            if value is backend:
                del _shared[key]
    backend.shutdown(wait=False, cancel_futures=True)


@atexit.register
def shutdown_shared_backends() -> None:
    """Stop every shared backend (runs at interpreter exit)."""
    with _shared_lock:
        backends = list(_shared.values())
        _shared.clear()
    for b in backends:
        b.shutdown(wait=True, cancel_futures=True)
