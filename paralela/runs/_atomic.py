"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A reader sees either the old file or the whole new one, never a part; a crash leaves at
most a ``.tmp-*`` file, which readers ignore. Rename within one directory is atomic on
local filesystems and on NFS, Lustre, GPFS and BeeGFS, so no lock is needed.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TMP_PREFIX", "atomic_write", "create_exclusive"]

TMP_PREFIX = ".tmp-"


def _tmp_path(path: Path) -> Path:
    # Unique across hosts and processes sharing the directory.
    return path.with_name(f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")


def _write_synced(path: Path, data: bytes | Iterable[bytes]) -> None:
    with open(path, "wb") as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            f.writelines(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or pieces of it as they come) to ``path`` so that a crash
    leaves the old file or the new one; on any error the temp file is removed."""
    tmp = _tmp_path(path)
    try:
        _write_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists; ``False`` when another process won.

    Uses ``link()`` of a complete temp file, which fails if the name exists: atomic on
    NFS too, where ``O_EXCL`` once was not.
    """
    tmp = _tmp_path(path)
    try:
        _write_synced(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(path.parent)
    return True
