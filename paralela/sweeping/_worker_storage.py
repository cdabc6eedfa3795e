"""A function trial's view of the study in its worker: reports written with one SQL
statement, the database read again only when it changed.

::

    trial.report(v, step) ──> WorkerStorage ── one INSERT (only while the trial runs)
                                 │                on its own connection ──> database
                                 └─ cache: the trial's own reports, added at once
    trial.should_prune()  ──> pruner ── study.get_trials(...) ──> WorkerStorage
        finished trials only (a median or percentile pruner): read again only when the
            count of finished trials moved (finished trials never change)
        any other read: read again only when ``PRAGMA data_version`` moved (another
            connection, here or in any process, committed something since the last read)

An Optuna objective that reports every step paid, per report, Optuna's ORM write of the
value (a read of the trial, a look for the row, the insert; in SQLite's default
``synchronous=FULL`` an fsync of the WAL on top) and, for ``should_prune``, a read of
every unfinished trial with all its reports: 15-50 ms a report on the benchmark's VM,
growing with the steps. Both answers stay exact: a write that finds the trial no longer
running (the driver gave up on it) or its step already there goes through Optuna, which
raises or updates as before; a read is skipped only when nothing the pruner may look at
can have changed. SQLite only: a server database keeps Optuna's own cached storage.
"""

from __future__ import annotations

import copy
import sqlite3
import threading
from collections.abc import Container
from typing import Any

from optuna.storages import RDBStorage, _CachedStorage
from optuna.trial import FrozenTrial, TrialState

from paralela.sweeping._sql import TrialWriter

__all__ = ["WorkerStorage", "synchronous_normal", "worker_storage"]

_FINISHED = frozenset({TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL})


def worker_storage(backend: Any, *, wal: bool) -> Any:
    """``backend`` seen through a :class:`WorkerStorage` where it is a SQLite file; else
    as Optuna would see it (its own cached storage)."""
    if not isinstance(backend, RDBStorage):
        return backend
    url = backend.engine.url
    path = url.database
    if backend.engine.dialect.name != "sqlite" or not path or path == ":memory:":
        return backend
    return WorkerStorage(backend, path, wal=wal)


def synchronous_normal(study: Any) -> bool:
    """The driver commits to its SQLite database with ``synchronous=NORMAL`` (its own
    database in the run directory, in WAL mode): its workers then commit the same way."""
    engine = getattr(getattr(study._storage, "backend", None), "engine", None)
    if engine is None or engine.dialect.name != "sqlite":
        return False
    connection = engine.raw_connection()
    try:
        cursor = connection.cursor()
        try:
            row = cursor.execute("PRAGMA synchronous").fetchone()
        finally:
            cursor.close()
    finally:
        connection.close()  # back to the pool
    return row is not None and int(row[0]) == 1  # NORMAL


class WorkerStorage(_CachedStorage):
    """Optuna's cached storage with cheap reports and reads (see the module).

    Args:
        backend: the study's ``RDBStorage`` (a SQLite file).
        path: the database file.
        wal: the sweep's own database (in WAL mode): this connection commits with
            ``synchronous=NORMAL`` as the driver's do (a report survives the worker's and
            the driver's death; only a power cut can lose the last ones).
    """

    def __init__(self, backend: RDBStorage, path: str, *, wal: bool) -> None:
        super().__init__(backend)
        self._writer = TrialWriter(backend.engine)
        # Autocommit: each statement is its own transaction, and this connection never
        # holds a read snapshot between calls (data_version sees every commit).
        self._connection = sqlite3.connect(
            path, timeout=60, isolation_level=None, check_same_thread=False
        )
        if wal:
            mode = self._connection.execute("PRAGMA journal_mode").fetchone()
            if mode is not None and str(mode[0]).lower() == "wal":
                self._connection.execute("PRAGMA synchronous=NORMAL")
        self._connection_lock = threading.Lock()
        self._seen: dict[int, int] = {}  # study id -> data_version before its last read

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        with self._connection_lock:
            return self._connection.execute(sql, args).fetchone()[0]

    # -- reads ----------------------------------------------------------------------

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        # Read before the trials: a commit made while they are read is read next time.
        version = int(self._one("PRAGMA data_version"))
        with self._lock:
            info = self._studies.get(study_id)
            finished = (
                0 if info is None else sum(t.state.is_finished() for t in info.trials.values())
            )
        seen = self._seen.get(study_id)
        if info is None or seen is None:
            fresh = False
        elif version == seen:  # no other connection, of any process, committed since
            fresh = True
        elif states is not None and all(s in _FINISHED for s in _states_of(states)):
            # Finished trials never change and never run again: the same count in the
            # database as here is the same trials (the unfinished ones stay unread).
            sql, args = self._writer.count_finished(study_id)
            fresh = int(self._one(sql, args)) == finished
        else:
            fresh = False
        if not fresh:
            self._read_trials_from_remote_storage(study_id)
            self._seen[study_id] = version
        with self._lock:
            trials = self._studies[study_id].trials.values()
            chosen = trials if states is None else [t for t in trials if t.state in states]
            listed = sorted(chosen, key=lambda t: t.number)
        return copy.deepcopy(listed) if deepcopy else listed

    # -- writes ---------------------------------------------------------------------

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        sql, args = self._writer.report_if_running(trial_id, step, intermediate_value)
        with self._connection_lock:
            added = self._connection.execute(sql, args).rowcount == 1
        if not added:  # finished (UpdateFinishedTrialError), or that step is there already
            self._backend.set_trial_intermediate_value(trial_id, step, intermediate_value)
            return
        with self._lock:  # this connection's own write: the next read will not see it
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            if key is not None:  # (not cached yet: its next read has it)
                trials = self._studies[key[0]].trials
                trial = copy.copy(trials[key[1]])
                trial.intermediate_values = {**trial.intermediate_values, step: intermediate_value}
                trials[key[1]] = trial  # lists handed out earlier keep the old object


_ALL_STATES = tuple(TrialState)


def _states_of(states: Container[TrialState]) -> list[TrialState]:
    return [s for s in _ALL_STATES if s in states]
