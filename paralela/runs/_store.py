"""The run directory: a manifest and one file per finished chunk.

::

    run_dir/
      manifest.json                        what ran: function and shared-data fingerprints
      chunks/000000000000-000000001000.pkl results of items [0, 1000), their input
                                           digest, and where and when the chunk ran
      summary.json                         written when a run ends: items, wall, workers

Each chunk file is written atomically and names the item range it covers, so several
processes (on several hosts) can write to one directory without locks, a crash loses
nothing that finished, and a chunk finished twice is stored once. Resuming reads the
finished ranges and computes only the items they do not cover.

Reusing a directory: its ``manifest.json`` holds the ``identity`` it was made for (names
mapped to digests, e.g. ``{"function": ..., "shared": ...}``). Every key of the old and
the new identity must have the same digest, else
:class:`~paralela.errors.FingerprintMismatchError`; nothing else in the manifest is
compared. For an identity value that is a
:class:`~paralela.runs._fingerprint.Fingerprint`, the manifest also records its
``dependencies``, only to name in that error which ones changed.

A run directory is paralela's own: an existing directory without a manifest is taken only
when it is empty (or holds what a claim cut short left: an empty ``chunks/``, a temp
file), so that a ``run_dir`` pointed at a directory of the user's never has its files
replaced (``summary.json``) or removed (mapreduce's ``spills/``).

A directory that cannot be written (read-only media, an archive) is opened for reading
when its manifest matches: finished chunks are read back, ``summary.json`` is left as it
is, and storing a new chunk raises :class:`~paralela.errors.RunStoreError` naming it.
Files of the wrong shape (a manifest without an identity, a chunk whose results do not
fit its item range) raise :class:`~paralela.errors.RunStoreError` naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela._files import (
    LOCK_NAME,
    TMP_PREFIX,
    atomic_write,
    batched_dir_syncs,
    create_exclusive,
    json_text,
    make_dirs,
)
from paralela._version import __version__
from paralela.backends import dumps
from paralela.errors import FingerprintMismatchError, RunStoreError
from paralela.runs._fingerprint import Fingerprint, describe_changes

__all__ = ["ChunkRecord", "RunStore", "StoredChunk"]

_CHUNK_NAME = re.compile(r"^(\d{12})-(\d{12})\.pkl$")
# A temp file of paralela._files.temp_path: prefix, host, pid and 128 random bits.
_TEMP_NAME = re.compile(re.escape(TMP_PREFIX) + r".+-\d+-[0-9a-f]{32}$")
_SHOWN = 5  # files named when a directory is refused
FORMAT = 1
# Compiled code, so function fingerprints, differ between Python minor versions.
_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
# A directory that may not be written here: read-only media, permissions.
_CANNOT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _empty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


@dataclass(frozen=True)
class ChunkRecord:
    """A finished chunk on disk: items ``[start, end)``."""

    start: int
    end: int
    path: Path


@dataclass(frozen=True)
class StoredChunk:
    """What a chunk file holds."""

    start: int
    end: int
    input_digest: str
    results: list[Any]
    timing: dict[str, Any]


class RunStore:
    """A run directory for one ``map`` (or any chunked computation).

    Args:
        path: the directory; created if missing.
        identity: what must match for the directory to be reused, e.g. the function's
            fingerprint. A directory made for another identity raises
            :class:`~paralela.errors.FingerprintMismatchError`.
        describe: extra, informative manifest fields (never compared).

    Raises:
        RunStoreError: the directory cannot be made, or its manifest is unreadable or
            not a run manifest.
        FingerprintMismatchError: the directory was made for another identity.
    """

    def __init__(
        self, path: str | os.PathLike[str], identity: dict[str, str], describe: dict[str, Any]
    ):
        self.path = Path(path)
        self.chunks_dir = self.path / "chunks"
        self.identity = identity
        existing = self._read_manifest()
        if existing is None:
            self._refuse_others_files()
            self._make_directory()
            existing = self._claim_manifest(describe)
        if existing is not None:
            self._check_identity(existing)
            if not self.chunks_dir.is_dir():  # emptied by hand: nothing finished
                with contextlib.suppress(OSError):  # read-only: nothing to read back
                    make_dirs(self.chunks_dir)
        #: The directory cannot be written: finished chunks can still be read back.
        self.read_only = not os.access(self.path, os.W_OK)

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def _refuse_others_files(self) -> None:
        """Refuse an existing directory without a manifest that holds anything a claim of
        paralela's would not have left (see the module docstring)."""
        try:
            entries = list(os.scandir(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return  # made below (a file in the way: that error names it)
        except OSError:
            return  # unreadable: making or claiming it says why
        names = {entry.name for entry in entries}
        if "manifest.json" in names:
            return  # another process claimed it meanwhile: its manifest is checked
        others = sorted(
            entry.name
            for entry in entries
            if not (
                entry.name == LOCK_NAME
                or _TEMP_NAME.match(entry.name)
                or (entry.name == "chunks" and _empty_dir(entry.path))
            )
        )
        if others:
            more = f" and {len(others) - _SHOWN} more" if len(others) > _SHOWN else ""
            raise RunStoreError(
                f"The run directory {self.path} holds files paralela did not write "
                f"({', '.join(others[:_SHOWN])}{more}) and no manifest.json of a run: a "
                "run directory holds one run's state, which paralela writes, replaces and "
                "removes. Pass a new or empty directory (a subdirectory of this one, say)."
            )

    def _make_directory(self) -> None:
        try:
            make_dirs(self.chunks_dir)
        except OSError as exc:
            raise RunStoreError(
                f"Cannot create the run directory {self.path}: {exc.strerror}. "
                "Pass a run_dir= you can write to."
            ) from exc

    def _claim_manifest(self, describe: dict[str, Any]) -> dict[str, Any] | None:
        """Write the manifest; ``None`` when this call made it, else the one that another
        process made first."""
        manifest = {
            "format": FORMAT,
            "identity": self.identity,
            "dependencies": {
                key: value.dependencies
                for key, value in self.identity.items()
                if isinstance(value, Fingerprint)
            },
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": socket.gethostname(),
            "paralela": __version__,
            "python": _PYTHON,
            **describe,
        }
        data = json.dumps(manifest, indent=2, sort_keys=True).encode()
        try:
            if create_exclusive(self.manifest_path, data):
                return None
        except OSError as exc:
            raise RunStoreError(
                f"Cannot create {self.manifest_path}: {exc.strerror}. "
                "Pass a run_dir= you can write to."
            ) from exc
        return self._read_manifest()

    def _read_manifest(self) -> dict[str, Any] | None:
        """The manifest, checked for shape; ``None`` where there is none yet."""
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as exc:
            raise RunStoreError(
                f"The run directory {self.path} has an unreadable manifest.json ({exc}). "
                "Move it away or pass another run_dir=."
            ) from exc
        identity = manifest.get("identity") if isinstance(manifest, dict) else None
        if not isinstance(identity, dict) or not all(
            isinstance(value, str) for value in identity.values()
        ):
            found = (
                f"a JSON {type(manifest).__name__}"
                if not isinstance(manifest, dict)
                else "no identity"
                if identity is None
                else f"an identity of {json.dumps(identity)[:80]}"
            )
            raise RunStoreError(
                f"{self.manifest_path} is not a paralela run manifest: it should be a JSON "
                "object whose identity maps names to fingerprints, and it holds "
                f"{found}. Move it away or pass another run_dir=."
            )
        return dict(manifest)

    def _check_identity(self, existing: dict[str, Any]) -> None:
        theirs: dict[str, str] = existing["identity"]
        if theirs == self.identity:
            return
        diffs = [
            k
            for k in sorted(set(theirs) | set(self.identity))
            if theirs.get(k) != self.identity.get(k)
        ]
        made_for = existing.get("function_name", "?")
        details = ""
        if "function" in diffs:
            details = self._function_changes(existing)
            if "function" in theirs:
                details += (
                    " If the change cannot alter any result (a comment, a log message), "
                    f"pass fingerprint={theirs['function']!r} to map or imap to resume "
                    "with the results already there."
                )
        raise FingerprintMismatchError(
            f"The run directory {self.path} holds results of another computation: "
            f"{', '.join(diffs)} differ (it was made for {made_for}, "
            f"on {existing.get('created', '?')}). Reusing it would mix results. "
            "Pass a new run_dir= to start afresh, or delete the directory if its "
            f"results are no longer wanted.{details}"
        )

    def _function_changes(self, existing: dict[str, Any]) -> str:
        """`` What changed: mathhelp.scale (code).``, as far as the manifests tell."""
        ours = self.identity.get("function")
        recorded = existing.get("dependencies")
        theirs = recorded.get("function") if isinstance(recorded, dict) else None
        if not isinstance(ours, Fingerprint):
            return " The fingerprint= given differs from the one the directory was made with."
        if not isinstance(recorded, dict):
            return (
                f" The directory was made by paralela {existing.get('paralela', '?')}, "
                "which fingerprinted functions otherwise and did not record what they "
                "depend on."
            )
        if not isinstance(theirs, dict):
            return " The directory was made with a fingerprint= given, not computed."
        changes = describe_changes(theirs, ours.dependencies)
        text = f" What changed: {changes}." if changes else ""
        python = existing.get("python")
        if isinstance(python, str) and python != _PYTHON:
            text += (
                f" It was made with Python {python}, this is {_PYTHON}: compiled code "
                "differs between Python versions."
            )
        return text

    def finished(self) -> dict[int, ChunkRecord]:
        """Finished chunks by start index, without overlaps (first written wins)."""
        records = []
        try:
            entries = list(os.scandir(self.chunks_dir))
        except FileNotFoundError:
            return {}
        for entry in entries:
            match = _CHUNK_NAME.match(entry.name)
            if match:
                start, end = int(match[1]), int(match[2])
                records.append(ChunkRecord(start, end, Path(entry.path)))
        records.sort(key=lambda r: (r.start, r.end))
        accepted: dict[int, ChunkRecord] = {}
        covered_to = -1
        for record in records:
            if record.start >= covered_to:  # overlapping ranges: two drivers raced
                accepted[record.start] = record
                covered_to = record.end
        return accepted

    def load(self, record: ChunkRecord) -> StoredChunk:
        try:
            with open(record.path, "rb") as f:
                stored = pickle.load(f)
        except Exception as exc:
            raise RunStoreError(
                f"Cannot read {record.path} ({exc}). Delete that file and run again: "
                "its items will be computed anew."
            ) from exc
        if not isinstance(stored, StoredChunk):
            raise RunStoreError(f"{record.path} is not a paralela chunk file; remove it.")
        size = record.end - record.start
        what = f"the {size} items {record.start}..{record.end - 1}"
        if (stored.start, stored.end) != (record.start, record.end):
            raise RunStoreError(
                f"{record.path} holds items {stored.start}..{stored.end - 1}, not {what} "
                "that its name says: it was renamed or copied over. Delete that file and "
                "run again: its items will be computed anew."
            )
        if not isinstance(stored.results, list) or len(stored.results) != size:
            count = len(stored.results) if isinstance(stored.results, list) else "no list of"
            raise RunStoreError(
                f"{record.path} holds {count} results for {what}: it is damaged or was "
                "written by other code. Delete that file and run again: its items will be "
                "computed anew."
            )
        return stored

    def write(self, chunk: StoredChunk) -> None:
        """Store a finished chunk.

        Raises:
            RunStoreError: the directory cannot be written here (read-only media,
                permissions). Other ``OSError`` (a full disk) pass through.
        """
        self.write_many([chunk])

    def write_many(self, chunks: list[StoredChunk]) -> None:
        """Store finished chunks, each in its own file (synced, then renamed), and make
        the renames durable with one sync of the directory for them all: a batch costs
        one ``fsync`` a file and one more, not two a file. Raises as :meth:`write`."""
        with batched_dir_syncs():
            for chunk in chunks:
                name = f"{chunk.start:012d}-{chunk.end:012d}.pkl"
                try:
                    atomic_write(self.chunks_dir / name, dumps(chunk))
                except OSError as exc:
                    if exc.errno not in _CANNOT_WRITE:
                        raise
                    raise RunStoreError(
                        f"Cannot write {self.chunks_dir}: {exc.strerror}. Items "
                        f"{chunk.start}..{chunk.end - 1} were computed but cannot be stored; "
                        f"the chunks already in {self.path} are kept. To compute the rest, "
                        "pass a run_dir= on writable storage (a copy of this one keeps its "
                        "results)."
                    ) from exc

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json``; skipped where the directory cannot be written (a
        finished run read back from read-only media: the results carry the summary)."""
        if self.read_only:
            return
        try:
            text = json_text(summary, sort_keys=True)  # a chunk of the timeline a line
            atomic_write(self.path / "summary.json", text.encode())
        except OSError as exc:
            if exc.errno not in _CANNOT_WRITE:
                raise
            self.read_only = True

    def clean_temporaries(self, older_than: float = 3600.0) -> None:
        """Remove temp files that crashed writers left behind (only old ones: a live
        writer on another host may own a fresh one)."""
        now = time.time()
        for directory in (self.path, self.chunks_dir):
            for entry in os.scandir(directory):
                if entry.name.startswith(TMP_PREFIX):
                    try:
                        if now - entry.stat().st_mtime > older_than:
                            os.unlink(entry.path)
                    except OSError:
                        pass
