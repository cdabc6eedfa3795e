"""Finished chunks on their way to the run directory.

::

    accept(chunk) ──> add() ──┬─ imap: kept until flush(), at the end of each round,
                              │        before the round's results reach the caller
                              └─ map:  a writer thread takes what waits, as it comes
                 batch of chunks ──> RunStore.write_many: a file each (synced, renamed),
                                     one sync of the directory for the batch
    end of the run (finished, failed, Ctrl-C, SIGTERM) ──> flush(): all written, or the
                                                           writer's error raised

Why: every stored chunk cost two ``fsync`` calls (its data, its directory) in the
driver's thread, between one round of results and the next submissions; on trivial
items (``bench/bench_map.py`` workload a, ``paralela_rundir``) they were most of the run
directory's cost per item. Now a batch costs one ``fsync`` a file and one more, and for
``map`` (whose caller sees nothing before the end) they happen in a thread of their own
while the workers compute and the driver submits (``fsync`` releases the GIL).

What a crash keeps is as before: each file is whole or absent (temp name, fsync,
rename), so a killed run resumes from what was written and nothing is stored twice.
A file holds one chunk; with ``chunksize="auto"`` (chunk bounds are the engine's own
choice) chunks next to each other in one batch are one file, for their whole range.
A chunk of a ``map`` is written as soon as the writer is free; one of ``imap`` before
its results are handed out.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.runs import RunStore, StoredChunk

__all__ = ["PendingStores"]

_Part = tuple[int, Sequence[Any], list[Any], dict[str, Any]]


class PendingStores:
    """Chunks that ran without failures, to be written to ``store``: by a writer thread
    of its own (``background``) or when :meth:`flush` is called."""

    def __init__(self, store: RunStore, *, background: bool, merge: bool) -> None:
        self.store = store
        self.background = background
        self.merge = merge
        self._pending: list[_Part] = []
        self._busy = False  # the writer holds a batch it has not written yet
        self._error: BaseException | None = None
        self._failed = False  # the writer's error was raised: nothing more is written
        self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(
        self, start: int, items: Sequence[Any], results: list[Any], timing: dict[str, Any]
    ) -> None:
        """A chunk of ``items`` from index ``start`` ran. Raises what stopped the writer
        (a full disk, a read-only directory): the run stops with it."""
        with self._cond:
            self._raise_error()
            self._pending.append((start, items, results, timing))
            if not self.background:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write_forever, name="paralela-run-store", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self) -> None:
        """Return once every chunk added is written; raise the writer's error if any."""
        if not self.background:
            pending, self._pending = self._pending, []
            if pending:
                self.store.write_many(self._stored(pending))
            return
        with self._cond:
            while (self._pending or self._busy) and self._error is None and not self._failed:
                self._cond.wait()
            self._raise_error()

    def close(self) -> None:
        """Write what is left (as :meth:`flush`), then let the writer thread end."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _raise_error(self) -> None:
        """Raise the writer's error, once: the run stops with it (and its end does not
        report it a second time)."""
        error = self._error
        if error is not None:
            self._error, self._failed = None, True
            self._pending.clear()
            raise error
        if self._failed:
            self._pending.clear()

    def _write_forever(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                batch, self._pending, self._busy = self._pending, [], True
            try:
                self.store.write_many(self._stored(batch))
            except BaseException as exc:  # handed to the run, which stops with it
                with self._cond:
                    self._error, self._busy = exc, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _stored(self, batch: list[_Part]) -> list[StoredChunk]:
        """What to write for ``batch``: a file for each chunk, or with ``merge`` (auto
        chunk sizes, whose bounds are the engine's own choice) one for each run of
        chunks that follow each other."""
        from paralela.runs import StoredChunk, digest_items

        groups = [[part] for part in batch]
        if self.merge:
            batch.sort(key=lambda part: part[0])
            groups = []
            for part in batch:
                last = groups[-1][-1] if groups else None
                if last is not None and last[0] + len(last[1]) == part[0]:
                    groups[-1].append(part)
                else:
                    groups.append([part])
        out = []
        for group in groups:
            start, items, results, timing = group[0]
            if len(group) > 1:
                items = [item for part in group for item in part[1]]
                results = [result for part in group for result in part[2]]
                timing = {
                    "started": min(part[3]["started"] for part in group),
                    "finished": max(part[3]["finished"] for part in group),
                    "chunks": [{"start": p[0], "items": len(p[1]), **p[3]} for p in group],
                }
            out.append(StoredChunk(start, start + len(items), digest_items(items), results, timing))
        return out
