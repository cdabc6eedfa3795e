"""A run directory that cannot be written (full disk, read-only, no permission, quota):
one paragraph naming the path and the real cause, instead of a database traceback.

The cause hides at the bottom of a chain: SQLite says "database or disk is full",
SQLAlchemy wraps it, and Optuna wraps that again as "An exception is raised during the
commit. This typically happens due to invalid data in the commit, e.g. exceeding max
length." :func:`storage_errors` walks the chain to the OS's or SQLite's own words.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from paralela.errors import RunStoreError

__all__ = ["storage_errors", "storage_problem"]

# OS errors that mean "this place cannot be written", whatever the sweep does.
_UNWRITABLE = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}
# What SQLite says (through sqlite3.OperationalError) for the same situations.
_SQLITE = (
    "database or disk is full",
    "attempt to write a readonly database",
    "unable to open database file",
    "disk i/o error",
    "readonly database",
)


def storage_problem(exc: BaseException) -> tuple[str, str | None] | None:
    """``(reason, path or None)`` if ``exc`` (or what caused it) is an unwritable place."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _UNWRITABLE:
            filename = current.filename
            return current.strerror or str(current), None if filename is None else str(filename)
        text = str(current).lower()
        if type(current).__name__ == "OperationalError" and any(s in text for s in _SQLITE):
            orig = getattr(current, "orig", None)  # SQLAlchemy's wrapper: SQLite's words
            return str(orig if orig is not None else current).splitlines()[0], None
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def storage_errors(root: Path, what: str = "sweep") -> Iterator[None]:
    """Turn an unwritable run directory, anywhere in the block, into a :class:`RunStoreError`
    (``what``: the sweep, the comparison, whose directory it is).

    Raises:
        RunStoreError: the run directory (or the file named) cannot be written.
    """
    try:
        yield
    except Exception as exc:
        problem = storage_problem(exc)
        if problem is None:
            raise
        reason, path = problem
        where = f" ({path})" if path and Path(path) != root else ""
        raise RunStoreError(
            f"The {what} cannot write its run directory {root}{where}: {reason}. Free space "
            "there or make it writable, or pass another --run-dir (run_dir=); running the "
            f"same {what} again continues it from what it saved."
        ) from exc
