"""One failure carrier: a task's paralela error, the user's exception and the worker's
traceback, across the process boundary.

::

    worker:  raise carry(error, cause) ──> TaskFailed(error, cause, traceback text)
               ── pickle (cause as bytes; None when it cannot be rebuilt) ──>
    driver:  except TaskFailed as failed: raise failed.reraise()
               ──> error, __cause__ = the user's exception,
                   whose __cause__ = RemoteTraceback(the worker's traceback)

Used by ``mapreduce`` (a map or reduce task, also shipped through Spark) and ``predict``
(a shard).
"""

from __future__ import annotations

import _pickle as pickle  # the C pickler: pickle.py imports re (see backends._wire)
from collections.abc import Callable

from paralela.errors import ParalelaError

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["TaskFailed", "carry", "exception_bytes"]


class TaskFailed(ParalelaError):
    """Carries a task's paralela error (``error``: a :class:`UserFunctionError`,
    :class:`InputError`, ``ModelError``...) to the driver, with the user's exception that
    caused it (``cause``, ``None`` when it does not pickle) and the worker's traceback
    text (``tb``). Never seen by users: the driver raises :meth:`reraise`."""

    def __init__(self, error: ParalelaError, cause: BaseException | None, tb: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause
        self.tb = tb

    def __reduce__(self) -> Any:
        return (_rebuild, (self.error, exception_bytes(self.cause), self.tb))

    def reraise(self) -> ParalelaError:
        """The error to raise in the driver: ``error``, with the user's exception as its
        ``__cause__`` (and the worker's traceback as that one's cause, shown under it as
        ``paralela.backends.RemoteTraceback``)."""
        from paralela.backends import RemoteTraceback

        error, cause = self.error, self.cause
        if cause is not None:
            if cause.__cause__ is None and cause.__traceback__ is None and self.tb:
                cause.__cause__ = RemoteTraceback(self.tb)
            error.__cause__ = cause
        elif self.tb:
            error.__cause__ = RemoteTraceback(self.tb)
        return error


def carry(error: ParalelaError, cause: BaseException | None) -> TaskFailed:
    """``error`` in a :class:`TaskFailed`, with ``cause`` and its formatted traceback."""
    tb = ""
    if cause is not None:
        import traceback  # only on failure: workers start without it

        tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return TaskFailed(error, cause, tb)


def exception_bytes(
    exc: BaseException | None, dumps: Callable[[Any], bytes] = pickle.dumps
) -> bytes | None:
    """The pickle of ``exc`` (by ``dumps``) when it can be rebuilt from it, else ``None``."""
    if exc is None:
        return None
    try:
        data = dumps(exc)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
    except BaseException:  # a broken __reduce__ may raise anything
        return None
    return data


def _rebuild(error: ParalelaError, cause: bytes | None, tb: str) -> TaskFailed:
    rebuilt: BaseException | None = None
    if cause is not None:
        try:
            rebuilt = pickle.loads(cause)
        except Exception:  # its class may not import in this process
            rebuilt = None
    return TaskFailed(error, rebuilt, tb)
