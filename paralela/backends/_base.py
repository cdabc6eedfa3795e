"""The backend seam: run callables on workers and hand back ``concurrent.futures`` futures.

A backend is deliberately tiny (``submit``, ``shutdown``, ``effective_workers``) so that
``map``, batching, retries and the run store are written once, above it. What a backend
can do is declared as data in :class:`Capabilities`; layers above read the flags and
never test a backend's name.

Futures fail with :class:`~paralela.errors.WorkerDiedError` when the worker that ran
them died; the caller decides whether to submit again. A task's own exception comes
back as itself, with the worker's traceback as its ``__cause__`` (a
:class:`RemoteTraceback`) when it ran in another process.
"""

from __future__ import annotations

import itertools
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:  # concurrent.futures loads once a backend is made (see _processes)
    from concurrent.futures import Future

__all__ = ["Backend", "Broadcast", "Capabilities", "RemoteTraceback", "usable_cpus"]

R = TypeVar("R")
T = TypeVar("T")

_broadcast_ids = itertools.count(1)


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


# Tracebacks name it by its public home (``paralela.backends.RemoteTraceback: ...``).
RemoteTraceback.__module__ = "paralela.backends"


class Broadcast(Generic[T]):
    """A read-only object sent to each worker once, however many tasks use it.

    Pass it as a positional argument to :meth:`Backend.submit`; the function receives
    the wrapped value. Process backends ship it to a worker the first time a task there
    needs it and keep it until :meth:`Backend.forget` is called.
    """

    __slots__ = ("_payload", "_payload_lock", "id", "value")

    def __init__(self, value: T) -> None:
        self.value = value
        self.id = next(_broadcast_ids)
        self._payload: bytes | None = None
        self._payload_lock = threading.Lock()

    def payload(self, dumps: Callable[[Any], bytes]) -> bytes:
        """The serialised value, computed once."""
        with self._payload_lock:
            if self._payload is None:
                self._payload = dumps(self.value)
            return self._payload

    def __repr__(self) -> str:
        return f"Broadcast(id={self.id}, value={type(self.value).__name__})"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, as data.

    Attributes:
        name: the name the backend is registered under.
        isolated: tasks run in other processes, so a crash kills a worker, not the caller.
        needs_pickling: tasks and results cross a process boundary.
        retries_dead_workers: a dead worker is replaced and its queued tasks re-run.
        zero_copy_buffers: large buffers (numpy arrays) reach workers without a pickle copy.
        debuggable: tasks run in the calling thread, so ``pdb`` and breakpoints work.
        supports_gpus: workers can be pinned to GPUs through their environment.
        packs_tasks: each task is expensive to start (a cluster job), so a map sends at
            most :meth:`Backend.max_tasks` chunks, each run on a local pool inside the
            task, instead of many small ones.
    """

    name: str
    isolated: bool
    needs_pickling: bool
    retries_dead_workers: bool
    zero_copy_buffers: bool
    debuggable: bool
    supports_gpus: bool
    packs_tasks: bool = False


class Backend(ABC):
    """Run callables on workers. Subclasses set ``capabilities`` and the three methods."""

    capabilities: ClassVar[Capabilities]

    @abstractmethod
    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Schedule ``fn(*args, **kwargs)``; :class:`Broadcast` arguments are unwrapped.

        Raises:
            UnpicklableError: ``fn`` or an argument cannot be sent to a worker (process
                backends check this here, before anything runs).
            RuntimeError: the backend was shut down.
        """

    @abstractmethod
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers. Pending futures are cancelled when ``cancel_futures``."""

    @abstractmethod
    def effective_workers(self) -> int:
        """How many tasks can run at the same time."""

    def healthy(self) -> bool:
        """``False`` once the backend cannot run tasks any more (its workers cannot start)."""
        return True

    def forget(self, broadcast: Broadcast[Any]) -> None:  # noqa: B027  (optional hook)
        """Let workers drop a :class:`Broadcast` value that no task will need again."""

    def cancel(self, futures: Iterable[Future[Any]]) -> None:
        """Stop the tasks of ``futures`` now: those not started never start, and
        backends that can stop a running task (a process's worker) stop it too.

        Every future given is done (cancelled, or failed with ``CancelledError``)
        when this returns, except those of running tasks on backends that cannot stop
        them (threads: they finish, and their results are dropped). The default cancels
        what has not started.
        """
        for future in futures:
            future.cancel()

    def terminate(self) -> None:
        """Stop now, running tasks included, as ``Pool.terminate`` does (interpreter exit:
        nobody will read their results). The default shuts down without waiting."""
        self.shutdown(wait=False, cancel_futures=True)

    def flush(self) -> None:  # noqa: B027  (optional hook)
        """Start the tasks submitted so far now (backends that group submissions)."""

    def max_tasks(self) -> int | None:
        """The most tasks one map should submit (``None``: no limit); see ``packs_tasks``."""
        return None

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown(wait=True, cancel_futures=exc is not None)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; all CPUs where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def unwrap_broadcasts(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Replace each :class:`Broadcast` argument by its value (in-process backends)."""
    return tuple(a.value if isinstance(a, Broadcast) else a for a in args)
