"""The one way paralela writes a file that must never be seen half-written.

    replacing(path) ──open_new──> DIR/.tmp-HOST-PID-RANDOM   (O_EXCL | O_NOFOLLOW)
                     write, flush, fsync
                     rename ──────> DIR/name, fsync DIR;  any error: the temp file is deleted

Inside ``batched_dir_syncs()`` the directory syncs wait for the end of the block: one
per directory for a batch of files (the run store's chunks written together).

A reader sees either the old file or the whole new one, never a part; a crash leaves at
most a temp file, which readers ignore by its prefix. Rename within one directory is
atomic on local filesystems and on NFS, Lustre, GPFS and BeeGFS, so no lock is needed.

Temp names carry a random part and are created with ``O_EXCL | O_NOFOLLOW``: someone who
can write the directory cannot make paralela write through a symlink planted at a name
it will use (creation fails instead), and ``rename`` replaces a symlink at the final name
rather than following it. Directories paralela makes are never writable by group or
others (:data:`DIR_MODE`, further narrowed by the umask): run directories and Slurm job
directories hold pickles that the driver loads, so writing there means running code.

This module imports nothing of paralela's: backends and capabilities both use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "DIR_MODE",
    "TMP_PREFIX",
    "atomic_write",
    "json_text",
    "batched_dir_syncs",
    "create_exclusive",
    "locked",
    "make_dirs",
    "move_into_place",
    "open_new",
    "replacing",
    "temp_path",
]

TMP_PREFIX = ".tmp-"
LOCK_NAME = ".paralela.lock"  # a run directory's lock file (see locked)
#: Mode of the directories paralela creates, before the umask: the owner alone writes.
DIR_MODE = 0o755
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_path(path: str | os.PathLike[str], prefix: str = TMP_PREFIX) -> Path:
    """A fresh name next to ``path``: ``prefix``, host, pid and 128 random bits, so unique
    across the hosts and processes sharing the directory and not guessable in advance."""
    return Path(path).with_name(f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")


def open_new(path: str | os.PathLike[str], *, buffering: int = -1) -> BinaryIO:
    """Create ``path`` and open it for writing; never opens something already there.

    Raises:
        FileExistsError: anything is at ``path``, a symlink (even a dangling one) too.
    """
    fd = os.open(path, _NEW_FILE, 0o666)
    return os.fdopen(fd, "wb", buffering=buffering)


# Directories whose sync waits for the end of a batched_dir_syncs() block, per thread.
_deferred = threading.local()


def _sync_dir(directory: Path) -> None:
    batch: set[Path] | None = getattr(_deferred, "dirs", None)
    if batch is not None:
        batch.add(directory)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def batched_dir_syncs() -> Iterator[None]:
    """Within the block, files written by this thread (:func:`atomic_write`,
    :func:`replacing`) are synced and renamed as always, but their directories are
    synced once each when the block ends (if it ends without an error): a batch of N
    files costs N + 1 ``fsync`` calls, not 2N. Until then a crash of the machine (not
    of the process) may forget a rename, never show a part of a file."""
    if getattr(_deferred, "dirs", None) is not None:  # nested: the outer block syncs
        yield
        return
    dirs: set[Path] = set()
    _deferred.dirs = dirs
    try:
        yield
    finally:
        _deferred.dirs = None
    for directory in sorted(dirs):
        _sync_dir(directory)


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], prefix: str = TMP_PREFIX) -> Iterator[BinaryIO]:
    """Write ``path`` through the file this yields: on leaving the block it is synced and
    renamed over ``path``; if the block raises, the temp file is deleted and ``path`` is
    left as it was."""
    target = Path(path)
    tmp = temp_path(target, prefix)
    try:
        with open_new(tmp) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            exc.filename = str(target)  # a failed write() names no file: say which
        raise
    _sync_dir(target.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or pieces of it as they come) to ``path`` so that a crash
    leaves the old file or the new one; on any error the temp file is removed."""
    with replacing(path) as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            f.writelines(data)


def json_text(data: dict[str, Any], *, sort_keys: bool = False, default: Any = None) -> str:
    """``data`` (a dict with string keys) as JSON a person can read: a top-level key a
    line, and each item of a top-level list on a line of its own.

    Written by json's C encoder: with ``indent`` json falls back to its pure-Python one,
    which cost ~0.1 ms a trial at the end of a sweep and ~0.6 ms for a map's summary
    of 75 chunks. ``json.loads`` gives back what ``json.dumps(data)`` would.
    """
    import json

    def dumps(value: Any) -> str:
        return json.dumps(value, sort_keys=sort_keys, default=default)

    lines = []
    for key in sorted(data) if sort_keys else data:
        value = data[key]
        if isinstance(value, list) and value:
            items = ",\n    ".join(map(dumps, value))
            lines.append(f"  {dumps(str(key))}: [\n    {items}\n  ]")
        else:
            lines.append(f"  {dumps(str(key))}: {dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n" if lines else "{}\n"


def create_exclusive(path: str | os.PathLike[str], data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists; ``False`` when another process won.

    Uses ``link()`` of a complete temp file, which fails if the name exists: atomic on
    NFS too, where ``O_EXCL`` once was not.
    """
    target = Path(path)
    tmp = temp_path(target)
    try:
        with open_new(tmp) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(target.parent)
    return True


def move_into_place(temp: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Give ``temp``, a complete file this process made with :func:`open_new` (and
    synced), the name ``path`` unless something is there; ``False`` when another process
    won. ``link()`` then unlink: atomic and never replacing, on NFS too. ``temp`` is gone
    either way; the directory is synced."""
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        Path(temp).unlink(missing_ok=True)
    _sync_dir(Path(path).parent)
    return True


def make_dirs(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and its missing parents with :data:`DIR_MODE` (narrowed by the
    umask, never widened); directories already there are left as they are."""
    missing: list[Path] = []
    here = Path(path)
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(DIR_MODE)
        except FileExistsError:  # another process made it, or a file is in the way
            if not directory.is_dir():
                raise


@contextlib.contextmanager
def locked(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``directory``'s lock (``flock`` on its ``.paralela.lock``) for the block: the
    processes sharing a run directory (two drivers of one sweep) take turns. The lock
    file is opened without following a symlink; the lock goes when the file is closed,
    a killed process's too."""
    import fcntl

    fd = os.open(
        Path(directory) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
