"""Advice on where files live: is a path on a filesystem that suits what a job does there?

The usual mistakes on a cluster, and what is checked:

==========  ==========================================  ================================
role        wrong place                                  why it hurts
==========  ==========================================  ================================
data        many small files on a network filesystem    a server round trip per file:
                                                         hundreds of times slower reads
run_dir     a SQLite database on a network filesystem   unreliable locks: a hang or a
                                                         damaged database
run_dir     node-local scratch of a job, or a tmpfs     erased when the job ends; tmpfs
                                                         holds the files in memory
scratch     a network filesystem (stage target)          staging there gains nothing
scratch     a tmpfs (stage target)                       the files count as memory
==========  ==========================================  ================================

The data check lists at most :data:`SCAN_LIMIT` entries or :data:`SCAN_SECONDS` seconds,
so that checking a huge dataset on a slow filesystem stays quick.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from paralela.resources._filesystems import FilesystemInfo, filesystem_of
from paralela.resources._mounts import Mount, read_mounts

__all__ = [
    "MANY_FILES",
    "SCAN_LIMIT",
    "SCAN_SECONDS",
    "SMALL_FILE",
    "FilesystemAdvice",
    "advise_filesystems",
]

# "Many small files": at least MANY_FILES files with a median size under SMALL_FILE.
# A network filesystem serves each open/stat/close with round trips of 0.2-2 ms (more
# on a busy Lustre metadata server); 1,000 files then cost 1 s or more per pass over
# the data, and at about 1 GB/s a file under 1 MiB spends longer in those round trips
# than in moving its bytes.
MANY_FILES = 1000
SMALL_FILE = 1 << 20
SCAN_LIMIT = 5000  # entries listed at most when sizing up a dataset
SCAN_SECONDS = 2.0  # and for at most this long
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


@dataclass(frozen=True)
class FilesystemAdvice:
    """One warning about where a path lives.

    Attributes:
        role: ``"data"``, ``"run_dir"`` or ``"scratch"`` (a stage's target).
        path: the path, as given.
        fstype: its filesystem type (``""`` when unknown).
        kind: ``"local"``, ``"tmpfs"``, ``"network"``, ``"other"``, or ``"missing"``.
        message: what is wrong and what to do, in full sentences.
    """

    role: str
    path: str
    fstype: str
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


def _where(fs: FilesystemInfo) -> str:
    source = f" from {fs.source}" if fs.source else ""
    return f"{fs.fstype} (mounted at {fs.mount_point}{source})"


def _size_up(path: str, limit: int, seconds: float) -> tuple[int, list[int], bool]:
    """Count files under ``path`` and collect their sizes; stop at a limit.

    Returns:
        Files seen, their sizes, and whether the whole tree was seen.
    """
    deadline = time.monotonic() + seconds
    sizes: list[int] = []
    stack, listed = [path], 0
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    listed += 1
                    if listed > limit or time.monotonic() > deadline:
                        return len(sizes), sizes, False
                    try:
                        if entry.is_dir(follow_symlinks=True):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=True):
                            sizes.append(entry.stat().st_size)
                    except OSError:
                        continue
        except OSError:
            continue
    return len(sizes), sizes, True


def _is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _sqlite_files(run_dir: str, limit: int) -> list[str]:
    """SQLite databases in ``run_dir`` and its direct subdirectories (named ``*.db`` &c.)."""
    found: list[str] = []
    dirs, listed = [run_dir], 0
    for depth in range(2):
        below: list[str] = []
        for directory in dirs:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                listed += 1
                if listed > limit:
                    return found
                if depth == 0 and entry.is_dir():
                    below.append(entry.path)
                elif entry.name.endswith(_SQLITE_SUFFIXES) and _is_sqlite(entry.path):
                    found.append(os.path.relpath(entry.path, run_dir))
        dirs = below
    return sorted(found)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _data(path: str, fs: FilesystemInfo, limit: int, seconds: float) -> str | None:
    if fs.kind != "network" or not os.path.isdir(path):
        return None
    count, sizes, complete = _size_up(path, limit, seconds)
    if count < MANY_FILES:
        return None
    median = int(statistics.median(sizes))
    if median >= SMALL_FILE:
        return None
    from paralela.resources._render import format_bytes

    many = f"{count:,}" if complete else f"at least {count:,}"
    return (
        f"{path} holds {many} files (median {format_bytes(median)}) on the network "
        f"filesystem {_where(fs)}. Every file read from it costs round trips to its "
        "server, so a job reading many small files there can run hundreds of times "
        "slower than from a local disk, and slows the filesystem for everyone. Copy "
        f"the data to node-local scratch when the job starts: paralela stage {path} "
        "(it prints the path to read), or pack the files into a few large ones."
    )


def _run_dir(path: str, fs: FilesystemInfo, env: Mapping[str, str], limit: int) -> str | None:
    if fs.kind == "network":
        databases = _sqlite_files(path, limit) if os.path.isdir(path) else []
        if databases:
            return (
                f"{path} is on the network filesystem {_where(fs)} and holds SQLite "
                f"database(s) {', '.join(databases)}. SQLite's file locking is unreliable "
                "there: several processes writing can hang or damage the database. Put "
                "the run directory on a local disk, or use a database server "
                "(paralela sweep --storage postgresql://...); new paralela sweeps on a "
                "network filesystem use a journal file instead of SQLite."
            )
        return None
    job_scratch = env.get("SLURM_TMPDIR")
    if env.get("SLURM_JOB_ID") and job_scratch and _inside(fs.path, os.path.realpath(job_scratch)):
        return (
            f"{path} is in this job's node-local scratch ($SLURM_TMPDIR): other nodes "
            "cannot see it and it is erased when the job ends. Keep the run directory on "
            "the shared filesystem, or copy it home before the job ends: paralela stage "
            "--back HOME_DIR."
        )
    if fs.kind == "tmpfs":
        return (
            f"{path} is on a tmpfs ({fs.mount_point}): its files are held in memory (they "
            "count against this job's memory limit) and are lost at a reboot, often at the "
            "end of a job. Keep the run directory on a disk."
        )
    return None


def _scratch(path: str, fs: FilesystemInfo, staged_bytes: int) -> str | None:
    if fs.kind == "network":
        return (
            f"{path} is on the network filesystem {_where(fs)}: staging there gains "
            "nothing. Stage to a node-local disk: set SLURM_TMPDIR or pass DEST."
        )
    if fs.kind == "tmpfs" and staged_bytes > 0:
        from paralela.resources._render import format_bytes

        return (
            f"{path} is on a tmpfs ({fs.mount_point}): the {format_bytes(staged_bytes)} "
            "staged there are held in memory and count against this job's memory limit."
        )
    return None


def advise_filesystems(
    *,
    data: Iterable[str | os.PathLike[str]] = (),
    run_dirs: Iterable[str | os.PathLike[str]] = (),
    scratch: Iterable[str | os.PathLike[str]] = (),
    staged_bytes: int = 0,
    mounts: list[Mount] | None = None,
    env: Mapping[str, str] | None = None,
    scan_limit: int = SCAN_LIMIT,
    scan_seconds: float = SCAN_SECONDS,
) -> tuple[FilesystemAdvice, ...]:
    """Warn about paths whose filesystem is wrong for what the job does with them.

    Args:
        data: datasets the job reads (directories or files).
        run_dirs: run directories the job writes (results, a sweep's database).
        scratch: directories data is staged into.
        staged_bytes: bytes staged into ``scratch`` (for the tmpfs memory warning).
        mounts: the mount table; :func:`read_mounts` of this process when ``None``.
        env: the environment (``SLURM_JOB_ID``, ``SLURM_TMPDIR``); ``os.environ`` when
            ``None``.
        scan_limit: entries listed at most per path (datasets, run directories).
        scan_seconds: seconds spent at most sizing up each dataset.

    Returns:
        One :class:`FilesystemAdvice` per problem found, in argument order; empty when
        every path is fine. A dataset that does not exist gets one too; a run directory
        that does not exist yet is judged by the filesystem it will be made on. Never
        raises for unreadable paths: they are judged by what can be read.
    """
    env = os.environ if env is None else env
    table = read_mounts() if mounts is None else mounts
    found: list[FilesystemAdvice] = []
    groups: list[tuple[str, Iterable[str | os.PathLike[str]]]] = [
        ("data", data), ("run_dir", run_dirs), ("scratch", scratch),
    ]  # fmt: skip
    for role, paths in groups:
        for raw in paths:
            path = os.fspath(raw)
            fs = filesystem_of(role, path, table)
            message: str | None
            if role == "data" and not os.path.exists(path):
                message = f"{path} does not exist."
                found.append(FilesystemAdvice(role, path, fs.fstype, "missing", message))
                continue
            if role == "data":
                message = _data(path, fs, scan_limit, scan_seconds)
            elif role == "run_dir":
                message = _run_dir(path, fs, env, scan_limit)
            else:
                message = _scratch(path, fs, staged_bytes)
            if message:
                found.append(FilesystemAdvice(role, path, fs.fstype, fs.kind, message))
    return tuple(found)
