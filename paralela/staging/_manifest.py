"""The manifest of a staged directory (a JSON Lines journal), and the lock around it.

``DEST/.paralela-stage.jsonl`` records, per copied file, where it came from and what it
was: source path, size, modification time, the copy's own modification time, and its
checksum. A later stage skips a file whose source and copy still match its record.

::

    {"event": "start", "version": 1, "host": "node01", "pid": 4242, "time": 1.7e9}
    {"path": "a/x.png", "src": "/home/ana/data/a/x.png", "size": 1234, "mtime_ns": ...,
     "dest_mtime_ns": ..., "algorithm": "blake2b", "checksum": "9f2c..."}
    {"event": "forget", "path": "a/y.png"}      (verify_stage found the copy damaged)
    {"event": "end"}

A line is appended after each file is copied, verified and renamed, so a stage that is
killed keeps what it finished (a torn last line is ignored). A journal without an
``end`` after its last ``start`` tells the next stage to remove leftover temporary files.
The journal is rewritten compactly (temp file and rename) when it has grown to more than
twice the lines it needs.

One stage at a time writes a DEST: ``DEST/.paralela-stage.lock`` is held with ``flock``
(several tasks of a job that stage the same data onto one node: the first copies, the
others wait, then find everything up to date).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from paralela._files import atomic_write
from paralela.errors import ConfigError
from paralela.staging._result import StageError

__all__ = [
    "LOCK_NAME",
    "MANIFEST_NAME",
    "TMP_PREFIX",
    "Entry",
    "Manifest",
    "hold_lock",
    "remove_temporaries",
]

MANIFEST_NAME = ".paralela-stage.jsonl"
LOCK_NAME = ".paralela-stage.lock"
# A copy in progress: DIR/.paralela-tmp.HOST-PID-RANDOM (paralela._files.temp_path), renamed
# to DIR/NAME once verified.
TMP_PREFIX = ".paralela-tmp."
VERSION = 1
_LOCK_POLL_S = 0.1  # how often a waiting stage tries the lock again


@dataclass(frozen=True)
class Entry:
    """What was copied to ``path`` (relative to DEST)."""

    path: str
    src: str
    size: int
    mtime_ns: int
    dest_mtime_ns: int
    algorithm: str
    checksum: str


def _as_dict(entry: Entry) -> dict[str, Any]:
    # Not dataclasses.asdict: it deep-copies every field, a third of a small file's cost.
    return {
        "path": entry.path, "src": entry.src, "size": entry.size, "mtime_ns": entry.mtime_ns,
        "dest_mtime_ns": entry.dest_mtime_ns, "algorithm": entry.algorithm,
        "checksum": entry.checksum,
    }  # fmt: skip


class Manifest:
    """The journal of one DEST: load it, append to it, close it.

    Attributes:
        entries: the current record of every copied file, by relative path.
        clean: whether the last stage that wrote here finished (``False``: it was killed,
            and temporary files may be left).
        damaged: files paralela copied whose record a verify dropped (the copy no longer
            matched): still paralela's, for the next stage to copy anew.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / MANIFEST_NAME
        self.entries: dict[str, Entry] = {}
        self.damaged: set[str] = set()
        self.clean = True
        self._lines = 0
        self._file: IO[str] | None = None

    @classmethod
    def load(cls, root: Path) -> Manifest:
        """Read ``root``'s journal; an empty manifest where there is none.

        Lines that are not JSON (a torn last line after a crash) or of an unknown kind
        are skipped.
        """
        manifest = cls(root)
        try:
            text = manifest.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return manifest
        for line in text.splitlines():
            manifest._lines += 1
            try:
                record = json.loads(line)
                event = record.get("event")
                if event == "start":
                    manifest.clean = False
                elif event == "end":
                    manifest.clean = True
                elif event == "forget":
                    manifest.entries.pop(str(record["path"]), None)
                    manifest.damaged.add(str(record["path"]))
                elif event is None:
                    entry = Entry(**record)
                    manifest.entries[entry.path] = entry
                    manifest.damaged.discard(entry.path)
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        return manifest

    @property
    def algorithm(self) -> str | None:
        """The checksum algorithm of the recorded files (the most recent one), if any."""
        for entry in reversed(self.entries.values()):
            return entry.algorithm
        return None

    def _append(self, *records: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in finish)
        self._file.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        self._file.flush()
        self._lines += len(records)

    def begin(self) -> None:
        """Mark the start of a stage (until :meth:`finish`, a crash leaves it unclean)."""
        self._append(
            {"event": "start", "version": VERSION, "host": socket.gethostname(),
             "pid": os.getpid(), "time": time.time()}
        )  # fmt: skip

    def record(self, entries: list[Entry]) -> None:
        """Record files that were copied, verified and renamed (one write for all)."""
        if not entries:
            return
        for entry in entries:
            self.entries[entry.path] = entry
            self.damaged.discard(entry.path)
        self._append(*(_as_dict(entry) for entry in entries))

    def forget(self, path: str) -> None:
        """Drop a file's record, so that the next stage copies it anew."""
        self.entries.pop(path, None)
        self.damaged.add(path)
        self._append({"event": "forget", "path": path})

    def finish(self, complete: bool) -> None:
        """Close the journal; when ``complete``, mark the stage finished and compact it.

        Args:
            complete: the stage ran to its end (with or without failed files); ``False``
                after an interruption, so that the next stage cleans up temporary files.
        """
        if complete:
            self._append({"event": "end"})
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
        if complete and self._lines > 2 * len(self.entries) + 100:
            lines = [json.dumps(_as_dict(e), separators=(",", ":")) for e in self.entries.values()]
            lines += [json.dumps({"event": "forget", "path": p}) for p in sorted(self.damaged)]
            lines.append(json.dumps({"event": "end"}))
            atomic_write(self.path, ("\n".join(lines) + "\n").encode("utf-8"))
            self._lines = len(lines)


def remove_temporaries(root: Path) -> int:
    """Delete ``.paralela-tmp.*`` files under ``root`` that a killed stage left.

    Subdirectories with a lock file of their own are other stages' DESTs (a file staged
    next to staged directories) and are left alone: such a stage may be running.

    Returns:
        How many were removed.
    """
    removed = 0
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not os.path.exists(os.path.join(directory, d, LOCK_NAME))]
        for name in files:
            if name.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
    return removed


_NO_LOCKING = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


@contextlib.contextmanager
def hold_lock(
    root: Path,
    timeout: float | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[list[str]]:
    """Hold ``root``'s stage lock for the ``with`` block.

    Args:
        root: the DEST directory (it exists).
        timeout: seconds to wait for another stage that holds the lock; ``None`` waits
            as long as that stage runs.
        on_wait: called once, with who holds the lock, when this call has to wait.

    Yields:
        Warnings (one where the filesystem has no locks: Lustre mounted without
        ``flock``; then nothing keeps two stages apart).

    Raises:
        ConfigError: the lock file cannot be opened (a read-only directory).
        StageError: the lock was not free within ``timeout``.
    """
    warnings: list[str] = []
    try:
        f = open(root / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise ConfigError(
            f"cannot open the lock file {root / LOCK_NAME} ({exc.strerror or exc}); "
            "staging needs a directory you can write."
        ) from exc
    with f:
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        tries = 0
        locked = True
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                if deadline is not None and time.monotonic() >= deadline:
                    raise StageError(
                        f"{root} is being written by another paralela stage ({holder}) and "
                        f"was not free within {timeout:g} s; wait for it, or stage to "
                        "another DEST."
                    ) from None
                # The holder writes its name just after it takes the lock: tell on the
                # second try, when the name is there.
                if on_wait is not None and not told and tries:
                    on_wait(holder)
                    told = True
                tries += 1
                time.sleep(_LOCK_POLL_S)
            except OSError as exc:
                if exc.errno not in _NO_LOCKING:
                    raise
                locked = False
                warnings.append(
                    f"the filesystem of {root} does not support file locks: nothing stops "
                    "two stages from writing it at once, so run one at a time."
                )
                break
        try:
            if locked:
                f.seek(0)
                f.truncate()
                f.write(f"host {socket.gethostname()} pid {os.getpid()}\n")
                f.flush()
            yield warnings
        finally:
            if locked:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
