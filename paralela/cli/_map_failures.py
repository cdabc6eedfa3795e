"""Why a ``paralela map`` failed, as the command says it: a message and an exit code.

::

    the function raised ──> its own exception (paralela_index, a RemoteTraceback cause)
                        or a TaskError (also each record of MapError.failures)
        ──> failure_of ──> Failed: the item's index, its "error" field, the line for
                           stderr and the tail of the traceback              ──> exit 1
    anything else that stopped the map ──> fail_for:
        an initializer's TaskError ──> exit 1      --run-dir full or read-only ──> 1 or 2
        WorkerDiedError ──> 3 (hint: --retries)    FingerprintMismatchError ──> 4
        another ParalelaError ──> 2                anything unknown: returns (a bug)
"""

from __future__ import annotations

import errno
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from paralela import runs as runs_package
from paralela.backends import RemoteTraceback
from paralela.cli._errors import EXIT_FAILED, EXIT_USAGE, exit_code_for, tail
from paralela.cli._errors import fail as _fail
from paralela.errors import (
    FingerprintMismatchError,
    ParalelaError,
    RunStoreError,
    TaskError,
    WorkerDiedError,
)
from paralela.tasks import short_repr

__all__ = ["Failed", "fail_for", "failure_of"]


@dataclass(frozen=True)
class Failed:
    """A failed item, as the command reports it."""

    index: int
    error: str  # the "error" field of its output line
    head: str  # its message on stderr
    detail: str = ""  # what follows the message: the tail of a traceback


def _function_failed(
    items: list[Any], index: int, item_repr: str, kind: str, message: str, tb: str, remote: bool
) -> Failed:
    item = short_repr(items[index]) if 0 <= index < len(items) else item_repr
    said = f": {message}" if message else ""  # KeyboardInterrupt() says nothing
    label = "Remote traceback" if remote else "Traceback"
    detail = f"{label} (last lines):\n{tail(tb)}" if tb else ""
    return Failed(index, f"{kind}{said}", f"{kind} in item {index} ({item}){said}", detail)


def failure_of(exc: BaseException, items: list[Any]) -> Failed | None:
    """The failed item that ``exc`` reports, or ``None``: ``exc`` is not an item failure.

    ``paralela.map`` raises the function's own exception, with ``paralela_index`` and
    (from a worker process) a :class:`RemoteTraceback` as its cause; or a
    :class:`TaskError` (also the records of ``MapError.failures``).
    """
    if isinstance(exc, TaskError):
        if exc.index is None:
            return None
        return _function_failed(
            items, exc.index, exc.item_repr, exc.exc_type, str(exc.args[0]),
            exc.remote_traceback, remote=True,
        )  # fmt: skip
    index = getattr(exc, "paralela_index", None)
    if not isinstance(exc, Exception) or not isinstance(index, int):
        return None
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):  # from a worker process
        tb, remote = cause.tb, True
    else:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
        remote = False
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    item_repr = str(getattr(exc, "paralela_item_repr", "?"))
    return _function_failed(items, index, item_repr, kind, str(exc), tb, remote)


_RUN_STORE_CODE = os.path.dirname(os.path.abspath(runs_package.__file__)) + os.sep
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _run_dir_error(exc: BaseException, run_dir: Path | None) -> OSError | None:
    """The ``OSError`` of writing the run directory (a full disk) that ``exc`` is."""
    if run_dir is None:
        return None
    cause = exc.__cause__
    if isinstance(exc, RunStoreError) and isinstance(cause, OSError) and cause.errno in _DISK_FULL:
        return cause
    if isinstance(exc, OSError) and any(
        frame.f_code.co_filename.startswith(_RUN_STORE_CODE)
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    ):
        return exc  # raised while the run store wrote, not by a backend
    return None


def fail_for(exc: Exception, items: list[Any], run_dir: Path | None, kept: str = "") -> None:
    """Exit with the message and code for ``exc``, which stopped the map, and ``kept``
    (what was kept of the results that finished) under it. Returns only for an
    exception that no message here explains (a bug: the caller re-raises it)."""

    def fail(message: str, code: int, detail: str | None = None) -> NoReturn:
        _fail(message, code, "\n".join(filter(None, [kept, detail])))

    failed = failure_of(exc, items)
    if failed is not None:
        fail(failed.head, EXIT_FAILED, failed.detail)
    if isinstance(exc, TaskError):  # a chunk failed outside the function (initializer)
        fail(str(exc.args[0]), EXIT_FAILED, tail(exc.remote_traceback))
    disk = _run_dir_error(exc, run_dir)
    if disk is not None:
        permission = disk.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        fail(
            f"Cannot write to --run-dir {run_dir}: {disk.strerror or disk}. Finished "
            f"chunks are kept in {run_dir}: once it can be written again, run the same "
            "command to resume.",
            EXIT_USAGE if permission else EXIT_FAILED,
        )
    if isinstance(exc, WorkerDiedError):
        fail(
            str(exc),
            exit_code_for(exc),
            "Hint: --retries K runs a dead worker's chunk K more times; fewer --workers "
            "leave each worker more memory.",
        )
    if isinstance(exc, FingerprintMismatchError):
        fail(
            str(exc),
            exit_code_for(exc),
            f"Hint: pass another --run-dir, or delete {run_dir} to start afresh. Runs with "
            "and without --unordered keep different results and need their own --run-dir.",
        )
    if isinstance(exc, ParalelaError):  # ConfigError, UnpicklableError, RunStoreError: exit 2
        fail(str(exc), exit_code_for(exc))
