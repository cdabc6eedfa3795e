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
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela._version import __version__
from paralela.backends._wire import dumps
from paralela.errors import FingerprintMismatchError, RunStoreError
from paralela.runs._atomic import TMP_PREFIX, atomic_write, create_exclusive

__all__ = ["ChunkRecord", "RunStore", "StoredChunk"]

_CHUNK_NAME = re.compile(r"^(\d{12})-(\d{12})\.pkl$")
FORMAT = 1


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
    """

    def __init__(
        self, path: str | os.PathLike[str], identity: dict[str, str], describe: dict[str, Any]
    ):
        self.path = Path(path)
        self.chunks_dir = self.path / "chunks"
        try:
            self.chunks_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunStoreError(
                f"Cannot create the run directory {self.path}: {exc.strerror}. "
                "Pass a run_dir= you can write to."
            ) from exc
        self.identity = identity
        self._claim_manifest(describe)

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def _claim_manifest(self, describe: dict[str, Any]) -> None:
        manifest = {
            "format": FORMAT,
            "identity": self.identity,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": socket.gethostname(),
            "paralela": __version__,
            **describe,
        }
        data = json.dumps(manifest, indent=2, sort_keys=True).encode()
        if create_exclusive(self.manifest_path, data):
            return
        try:
            existing = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise RunStoreError(
                f"The run directory {self.path} has an unreadable manifest.json ({exc}). "
                "Move it away or pass another run_dir=."
            ) from exc
        theirs = existing.get("identity", {})
        if theirs != self.identity:
            diffs = [
                k
                for k in sorted(set(theirs) | set(self.identity))
                if theirs.get(k) != self.identity.get(k)
            ]
            made_for = existing.get("function_name", "?")
            raise FingerprintMismatchError(
                f"The run directory {self.path} holds results of another computation: "
                f"{', '.join(diffs)} differ (it was made for {made_for}, "
                f"on {existing.get('created', '?')}). Reusing it would mix results. "
                "Pass a new run_dir= to start afresh, or delete the directory if its "
                "results are no longer wanted."
            )

    def finished(self) -> dict[int, ChunkRecord]:
        """Finished chunks by start index, without overlaps (first written wins)."""
        records = []
        for entry in os.scandir(self.chunks_dir):
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
        return stored

    def write(self, chunk: StoredChunk) -> None:
        name = f"{chunk.start:012d}-{chunk.end:012d}.pkl"
        atomic_write(self.chunks_dir / name, dumps(chunk))

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(
            self.path / "summary.json", json.dumps(summary, indent=2, sort_keys=True).encode()
        )

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
