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

:func:`make_backend` is the one place a capability gets a pool of its own (a sweep's
trial workers, predict's pinned workers, a data stage's processes); ``slots`` pins
worker ``i`` to ``slots[i]`` (GPUs and thread limits, see :func:`paralela.make_slots`).

The public seam, for the capabilities above (names from heavier modules load on first
use, so importing this package stays cheap):

- the backends: :class:`ProcessBackend`, :class:`ThreadBackend`,
  :class:`SequentialBackend`, and :class:`RemoteTraceback` (a worker's traceback, the
  ``__cause__`` of the error it raised);
- the wire format between driver and workers: :func:`dumps`, :func:`loads`,
  :func:`dumps_with_buffers` (large buffers out of band), :func:`zero_copy_available`;
- worker processes: :func:`worker_envs`, :func:`thread_limits_env`, ``SLOT_VARIABLE``,
  :func:`kill_descendants`, :class:`TaskLoadError`, :func:`worker_share`,
  :func:`mark_process_worker`, :func:`usable_cpus`;
- signals: :func:`sigterm_as_interrupt`, :func:`marking_sigint`, :func:`real_interrupt`,
  :class:`Terminated`;
- process groups: :func:`stop_group` / :func:`stop_groups` (SIGTERM, a grace period,
  SIGKILL to what is left of the group), :func:`kill_group`, :func:`group_alive`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

from paralela.errors import ConfigError

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from paralela.backends._base import (
        Backend,
        Broadcast,
        Capabilities,
        RemoteTraceback,
        usable_cpus,
    )
    from paralela.backends._context import mark_process_worker, worker_share
    from paralela.backends._environment import SLOT_VARIABLE, thread_limits_env, worker_envs
    from paralela.backends._groups import group_alive, kill_group, stop_group, stop_groups
    from paralela.backends._interrupt import (
        Terminated,
        marking_sigint,
        real_interrupt,
        sigterm_as_interrupt,
    )
    from paralela.backends._processes import ProcessBackend
    from paralela.backends._sequential import SequentialBackend
    from paralela.backends._threads import ThreadBackend
    from paralela.backends._wire import dumps, dumps_with_buffers, loads, zero_copy_available
    from paralela.backends._worker import TaskLoadError, kill_descendants
    from paralela.resources import Slot

__all__ = [
    "Backend",
    "Broadcast",
    "LOCAL_POOLS",
    "Capabilities",
    "ProcessBackend",
    "RemoteTraceback",
    "SLOT_VARIABLE",
    "SequentialBackend",
    "TaskLoadError",
    "Terminated",
    "ThreadBackend",
    "available_backends",
    "discard_backend",
    "dumps",
    "dumps_with_buffers",
    "get_backend",
    "group_alive",
    "keeping_pools",
    "kill_descendants",
    "kill_group",
    "loads",
    "make_backend",
    "mark_process_worker",
    "marking_sigint",
    "real_interrupt",
    "register_backend",
    "shutdown_shared_backends",
    "sigterm_as_interrupt",
    "stop_group",
    "stop_groups",
    "thread_limits_env",
    "usable_cpus",
    "using",
    "worker_envs",
    "worker_share",
    "zero_copy_available",
]

# Public names, imported on first use (PEP 562): a worker process imports this package
# before its own module (_worker), and must not pay for concurrent.futures or dataclasses
# (_base) that only the driver's side uses.
_LAZY: dict[str, str] = {
    "Backend": "_base",
    "Broadcast": "_base",
    "Capabilities": "_base",
    "RemoteTraceback": "_base",
    "usable_cpus": "_base",
    "mark_process_worker": "_context",
    "worker_share": "_context",
    "SLOT_VARIABLE": "_environment",
    "thread_limits_env": "_environment",
    "worker_envs": "_environment",
    "group_alive": "_groups",
    "kill_group": "_groups",
    "stop_group": "_groups",
    "stop_groups": "_groups",
    "Terminated": "_interrupt",
    "marking_sigint": "_interrupt",
    "real_interrupt": "_interrupt",
    "sigterm_as_interrupt": "_interrupt",
    "ProcessBackend": "_processes",
    "SequentialBackend": "_sequential",
    "ThreadBackend": "_threads",
    "dumps": "_wire",
    "dumps_with_buffers": "_wire",
    "loads": "_wire",
    "zero_copy_available": "_wire",
    "TaskLoadError": "_worker",
    "kill_descendants": "_worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"paralela.backends.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _processes(
    workers: int | None, *, slots: Sequence[Slot] | None = None, preload: Sequence[str] = ()
) -> Backend:
    from paralela.backends._processes import ProcessBackend

    return ProcessBackend(workers, slots=slots, preload=preload)


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
# Backends whose factory pins workers to slots (``factory(..., slots=slots)``).
_TAKES_SLOTS = {"processes"}
# Backends with worker processes that import ``preload`` as they start (others ignore it).
_TAKES_PRELOAD = {"processes"}
# Local pools hold idle workers between calls: at most one shared pool per name.
LOCAL_POOLS = frozenset({"processes", "threads"})
_shared: dict[tuple[str, int | None, str], Backend] = {}
_shared_lock = threading.Lock()
_runs: dict[int, int] = {}  # id(backend) -> runs using it now
_keeping = 0  # keeping_pools() blocks open


def register_backend(
    name: str,
    factory: Callable[..., Backend],
    *,
    takes_options: bool = False,
    takes_slots: bool = False,
) -> None:
    """Make ``factory(workers)`` available as ``backend=name``; with ``takes_options``
    it is called as ``factory(workers, options)``; with ``takes_slots`` it is also
    given ``slots=`` (a list of :class:`~paralela.Slot`) when a caller pins workers."""
    _FACTORIES[name] = factory
    for flag, names in ((takes_options, _TAKES_OPTIONS), (takes_slots, _TAKES_SLOTS)):
        if flag:
            names.add(name)
        else:
            names.discard(name)


def available_backends() -> list[str]:
    """The names ``backend=`` accepts."""
    return sorted(_FACTORIES)


def get_backend(
    backend: str | Backend,
    workers: int | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    slots: Sequence[Slot] | None = None,
) -> Backend:
    """The shared backend for ``backend``, ``workers``, ``options`` and ``slots``, started
    on first use.

    Raises:
        ConfigError: unknown backend name, ``workers`` below 1, options or slots for a
            backend that takes none, or options the backend rejects.
    """
    from paralela.backends._base import Backend

    if isinstance(backend, Backend):
        if options or slots is not None:
            raise ConfigError(
                f"{'backend_options' if options else 'slots'} apply to a backend given by "
                f"name; pass them to the {type(backend).__name__} you constructed instead."
            )
        return backend
    _check(backend, workers, options, slots)
    key = (backend, workers, repr(sorted((options or {}).items())))
    if slots is not None:
        key = (backend, workers, key[2] + repr(list(slots)))
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
            found = _shared[key] = _make(backend, workers, options, slots)
    for old in retired:
        old.shutdown(wait=False, cancel_futures=True)
    return found


def make_backend(
    backend: str,
    workers: int | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    slots: Sequence[Slot] | None = None,
    preload: Sequence[str] = (),
) -> Backend:
    """A new backend of its own for ``backend`` (never shared); the caller shuts it down.

    With ``slots``, worker ``i`` serves ``slots[i % len(slots)]``: its GPUs
    (``CUDA_VISIBLE_DEVICES``) and thread limits are in its environment before it
    imports anything, and ``workers`` defaults to one per slot.

    ``preload``: modules each worker process imports as it starts, before its first task
    (as multiprocessing's ``set_forkserver_preload``): the caller's set-up and the
    workers' imports then overlap. A module that fails to import is skipped there (the
    task that imports it raises the error). Backends without worker processes ignore it.

    Raises:
        ConfigError: as :func:`get_backend`; also an empty ``slots``.
    """
    _check(backend, workers, options, slots)
    return _make(backend, workers, options, slots, preload)


def _check(
    backend: str,
    workers: int | None,
    options: Mapping[str, Any] | None,
    slots: Sequence[Slot] | None = None,
) -> None:
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
    if slots is not None and backend not in _TAKES_SLOTS:
        raise ConfigError(
            f"Backend {backend!r} cannot pin workers to slots; "
            f"backends that can: {', '.join(sorted(_TAKES_SLOTS)) or 'none'}."
        )


def _make(
    backend: str,
    workers: int | None,
    options: Mapping[str, Any] | None,
    slots: Sequence[Slot] | None = None,
    preload: Sequence[str] = (),
) -> Backend:
    factory = _FACTORIES[backend]
    given: dict[str, Any] = {} if slots is None else {"slots": slots}
    if preload and backend in _TAKES_PRELOAD:
        given["preload"] = tuple(preload)
    if backend in _TAKES_OPTIONS:
        return factory(workers, options, **given)
    return factory(workers, **given)


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
                from paralela.backends._base import usable_cpus

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
