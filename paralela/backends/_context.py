"""Whether the running code is a paralela worker, and how many CPUs it has to itself.

A ``map`` called inside a worker (nested parallelism) must neither deadlock on the pool
that runs it nor start a pool per worker that oversubscribes the machine. Backends mark
their workers here; ``paralela.map`` reads :func:`worker_share` and then runs the inner
map sequentially by default (as joblib does), or on a private pool no larger than the
worker's share when a backend is asked for by name.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["mark_process_worker", "worker_context", "worker_share"]

_local = threading.local()
_process_share: int | None = None


def worker_share() -> int | None:
    """The CPUs the current worker may use, or ``None`` outside any paralela worker."""
    share: int | None = getattr(_local, "share", None)
    return share if share is not None else _process_share


def mark_process_worker(share: int) -> None:
    """Called once by a worker process: everything it runs is inside a worker."""
    global _process_share
    _process_share = max(1, share)


@contextlib.contextmanager
def worker_context(share: int) -> Iterator[None]:
    """Mark the current thread as a worker with ``share`` CPUs while the block runs."""
    previous = getattr(_local, "share", None)
    _local.share = max(1, share)
    try:
        yield
    finally:
        _local.share = previous
