"""Copying one file: read once, hash while writing a temporary copy, read the copy back,
compare, then rename it into place.

::

    SRC/rel ──read──> hash ──write──> DEST/dir/.paralela-tmp.HOST-PID-RANDOM (O_EXCL|O_NOFOLLOW)
                                           │ read back, hash: same size and checksum?
                                           │   no:  delete it, copy once more, then fail
                                           ▼   yes: set mode and mtime, rename
                                      DEST/dir/name   (never half a file under this name)

Runs in the threads of a stage: file I/O and hashing release the GIL, so threads overlap
the round trips of a network filesystem and the hashing of large files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

from paralela._files import open_new, temp_path
from paralela.errors import ConfigError
from paralela.staging._manifest import TMP_PREFIX, Entry

__all__ = [
    "ALGORITHMS",
    "CHUNK",
    "Job",
    "Outcome",
    "Stopped",
    "copy_file",
    "hash_file",
    "new_hash",
    "transfer",
]

# Read and write in 1 MiB pieces: large enough that the per-call cost of Python and of
# the system call is small next to the copy (64 KiB pieces ran about 10 % slower here
# on large files), small enough that 32 threads hold only 32 MiB of buffers.
CHUNK = 1 << 20
ALGORITHMS = ("blake2b", "sha256")
# Errors after which no other file can be written either: stop the whole stage.
FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


_local = threading.local()


def _buffer() -> tuple[bytearray, memoryview]:
    """This thread's read buffer, made once: a fresh 1 MiB per file costs an mmap, 256
    page faults and an munmap, which doubled the time of a small file's copy."""
    buf: tuple[bytearray, memoryview] | None = getattr(_local, "buf", None)
    if buf is None:
        data = bytearray(CHUNK)
        buf = _local.buf = (data, memoryview(data))
    return buf


class Stopped(Exception):
    """The stage is being interrupted: stop copying at the next piece."""


def new_hash(algorithm: str) -> Any:
    """A fresh hash object: BLAKE2b with a 128-bit digest, or SHA-256.

    Raises:
        ConfigError: an unknown algorithm.
    """
    if algorithm == "blake2b":
        return hashlib.blake2b(digest_size=16)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ConfigError(
        f"unknown checksum {algorithm!r}; valid checksums are: auto, {', '.join(ALGORITHMS)}."
    )


def hash_file(path: str, algorithm: str, stop: threading.Event | None = None) -> tuple[int, str]:
    """Size and hex checksum of a file, read in :data:`CHUNK` pieces.

    Raises:
        OSError: the file cannot be read.
        Stopped: ``stop`` was set.
    """
    digest = new_hash(algorithm)
    size = 0
    buf, view = _buffer()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            if stop is not None and stop.is_set():
                raise Stopped
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def copy_file(
    src: str, dst: str, algorithm: str, stop: threading.Event | None = None, durable: bool = False
) -> tuple[int, str]:
    """Copy ``src`` to a new ``dst``, hashing the bytes read from ``src``.

    Args:
        src: the file to read.
        dst: the file to create; nothing may be there yet (not even a symlink).
        algorithm: the checksum algorithm.
        stop: set when the stage is interrupted; checked between pieces.
        durable: ``fsync`` the copy before returning (copies made to the home
            filesystem, where a node crash must not leave an empty file).

    Returns:
        The number of bytes read, and their checksum.

    Raises:
        OSError: ``src`` cannot be read or ``dst`` written (``FileExistsError``:
            something is already at ``dst``).
        Stopped: ``stop`` was set.
    """
    digest = new_hash(algorithm)
    size = 0
    buf, view = _buffer()
    with open(src, "rb", buffering=0) as fin, open_new(dst, buffering=0) as fout:
        while n := fin.readinto(buf):
            if stop is not None and stop.is_set():
                raise Stopped
            digest.update(view[:n])
            written = 0
            while written < n:
                written += fout.write(view[written:n]) or 0
            size += n
        if durable:
            os.fsync(fout.fileno())
    return size, digest.hexdigest()


@dataclass(frozen=True)
class Job:
    """One file to bring up to date: ``src`` (absolute) to ``dst``; ``rel`` names both."""

    rel: str
    src: str
    dst: str
    size: int
    mtime_ns: int
    mode: int


@dataclass(frozen=True)
class Outcome:
    """What happened to one file.

    ``status`` is ``"copied"``, ``"skipped"`` or ``"failed"``; ``entry`` is the new
    manifest record of a copied file; ``reason`` says why a file failed; ``mismatch``
    marks a failed verification; ``fatal`` an error that stops the stage (disk full);
    ``note`` says when a file needed a second try.
    """

    rel: str
    status: str
    size: int
    entry: Entry | None = None
    reason: str = ""
    mismatch: bool = False
    fatal: bool = False
    verified: bool = False
    note: str = ""


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


def up_to_date(job: Job, known: Entry | None, algorithm: str) -> bool:
    """Whether ``job``'s copy matches its record, and the record its source (no reading)."""
    if known is None or (known.src, known.size, known.mtime_ns) != (
        job.src,
        job.size,
        job.mtime_ns,
    ):
        return False
    if known.algorithm != algorithm:
        return False
    try:
        st = os.stat(job.dst)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (
        known.size,
        known.dest_mtime_ns,
    )


def transfer(
    job: Job,
    known: Entry | None,
    algorithm: str,
    *,
    verify: bool,
    durable: bool,
    stop: threading.Event,
) -> Outcome:
    """Bring one file up to date: skip it, or copy, verify and rename it (two tries).

    A second try follows a copy that did not match (the read or the write was damaged)
    or a source that changed while it was read; the temporary copy is deleted whatever
    happens, so DEST never holds a file under its final name that was not verified.

    Raises:
        Stopped: the stage is being interrupted.
    """
    if stop.is_set():
        raise Stopped
    if up_to_date(job, known, algorithm):
        return Outcome(job.rel, "skipped", job.size)
    reason, mismatch, installed = "", False, False
    size, mtime_ns, mode = job.size, job.mtime_ns, job.mode
    tmp = ""
    try:
        for attempt in range(2):
            _remove(tmp)  # the first try's copy, when it did not match
            tmp = str(temp_path(job.dst, TMP_PREFIX))
            copied, checksum = copy_file(job.src, tmp, algorithm, stop, durable)
            st = os.stat(job.src)
            if copied != st.st_size or (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                reason = "the source changed while it was being copied, twice"
                size, mtime_ns, mode = st.st_size, st.st_mtime_ns, st.st_mode
                continue
            if verify:
                back = hash_file(tmp, algorithm, stop)
                if back != (copied, checksum):
                    reason = (
                        f"the copy does not match the source (size {back[0]} vs {copied}, "
                        f"{algorithm} {back[1][:12]}... vs {checksum[:12]}...), twice"
                    )
                    mismatch = True
                    continue
            os.chmod(tmp, stat.S_IMODE(mode))
            os.utime(tmp, ns=(st.st_atime_ns, mtime_ns))
            os.replace(tmp, job.dst)
            installed = True
            dest_mtime_ns = os.stat(job.dst).st_mtime_ns
            entry = Entry(job.rel, job.src, copied, mtime_ns, dest_mtime_ns, algorithm, checksum)
            note = f"{job.rel}: copied on the second try ({reason.removesuffix(', twice')})"
            return Outcome(
                job.rel, "copied", copied, entry, verified=verify, note=note if attempt else ""
            )
    except OSError as exc:
        fatal = exc.errno in FATAL_ERRNOS
        return Outcome(job.rel, "failed", size, reason=_describe(exc), fatal=fatal)
    finally:
        if not installed:
            _remove(tmp)
    return Outcome(job.rel, "failed", size, reason=reason, mismatch=mismatch)


def _remove(path: str) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
