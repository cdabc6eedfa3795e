"""``n_trials`` over all the drivers of one run directory.

Each driver asks its trials ahead (see ``_oracle``). Counting only its own, two drivers
started at once on one run directory would each run ``n_trials``. So before each ask the
oracle takes the run directory's lock (``flock`` on ``.paralela.lock``), counts the
trials the study has claimed (running or ended, less those asked but never started and
those cut short by a dying driver, which do not count against the budget), and reserves
trials only while the count is below ``n_trials``; the new trials are in the database
before the lock is let go, so the next driver counts them. It reserves one trial per
slot of its own at a time (in one transaction), and takes the lock again only once it
has asked them all: with 64 drivers on 2 cores one lock per ask was near its capacity
and the asks queued for it. Once a wave of trials or fewer is left (no more than the
study runs now), it reserves one at a time, so that the last trials go to the slots
that free first. On SQLite a count reads only the trials from the first unfinished one
on (those before are finished for good and counted once): counting every trial of the
study made each hold O(trials), 28 ms at 100,000. Under the lock there are only these few
queries (the count, whether a queued trial waits, the new row): the sampler, and the
driver's reading back of the other drivers' trials, run after it is let go. Drivers
sharing a database from different run directories (``--storage postgresql://...``) count
the same way, without the lock: they may overshoot by one trial each, as Optuna's own
processes do.

``Budget`` is what one sweep was given (trials, time, failures, time per trial);
``check_budget`` checks the user's figures before anything starts.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela._files import locked
from paralela.errors import ConfigError
from paralela.studies import INTERRUPTED_ATTR, UNUSED_ATTR

__all__ = ["Budget", "SharedBudget", "check_budget"]

_CLAIMED = ("RUNNING", "COMPLETE", "PRUNED", "FAIL")
_COUNT_SQL = (
    "SELECT COUNT(*), SUM(CASE WHEN state = 'RUNNING' THEN 1 ELSE 0 END) FROM trials "
    "WHERE study_id = :study_id AND state IN ('RUNNING', 'COMPLETE', 'PRUNED', 'FAIL') "
    "AND trial_id NOT IN (SELECT trial_id FROM trial_system_attributes "
    "WHERE key IN (:unused, :interrupted))"
)

# SQLite: the study's trials from one id on, each with whether it was given back. Ids
# there are handed out and committed in order (one writer at a time), so every trial
# below the first unfinished one is finished for good and counted once (see counts()).
_TAIL_SQLITE = (
    "SELECT trial_id, state, EXISTS (SELECT 1 FROM trial_system_attributes a "
    "WHERE a.trial_id = t.trial_id AND a.key IN (?, ?)) FROM trials t "
    "WHERE study_id = ? AND trial_id >= ? ORDER BY trial_id"
)
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")
_WAITING_SQL = "SELECT 1 FROM trials WHERE study_id = :study_id AND state = 'WAITING' LIMIT 1"


@dataclass
class Budget:
    n_trials: int | None
    timeout: float | None
    max_failures: int | None
    trial_timeout: float | None = None  # seconds one trial may run (Slurm: its --time)


def check_budget(n_trials: object, timeout: float | None) -> None:
    if n_trials is None and timeout is None:
        raise ConfigError(
            "Give a trial budget (n_trials=, --trials) or a time budget (timeout=, "
            "--timeout), or both."
        )
    if n_trials is not None and (
        isinstance(n_trials, bool) or not isinstance(n_trials, numbers.Integral) or n_trials < 1
    ):
        raise ConfigError(
            f"n_trials must be a positive whole number (an int), got {n_trials!r}; "
            "round it yourself (the budget is a count of trials)."
        )
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}.")


class SharedBudget:
    """How many trials the study may still be given, counted in its storage."""

    def __init__(self, study: Any, n_trials: int, run_dir: Path | None) -> None:
        self._study = study
        self._n_trials = n_trials
        self._run_dir = run_dir
        # SQLite: the trials below _from_id are finished (a finished trial never changes
        # again), and _below of them count against the budget; each count reads only the
        # trials from _from_id on (those running, and the newer ones), not the study's
        # every trial: ~0.3 ms a count at 1,000 trials, 28 ms at 100,000 before.
        self._from_id = 0
        self._below = 0
        self._waiting: bool | None = None  # seen by the count made in this claim

    @contextlib.contextmanager
    def claim(self, want: int = 1) -> Iterator[int]:
        """Hold the budget lock; yield how many trials (of the ``want`` asked, 0 when
        the budget is spent) may be reserved now: all of them while more than a wave of
        trials is left (more than the study runs now), else one, so that the last trials
        go to whichever slot frees first, not to a driver holding them in reserve."""
        with locked(self._run_dir) if self._run_dir is not None else contextlib.nullcontext():
            try:
                claimed, running, self._waiting = self._counts()
                left = self._n_trials - claimed
                yield max(0, min(want if left > running else 1, left))
            finally:
                self._waiting = None

    def claimed(self) -> int:
        """The trials that count against the budget, as the storage has them now."""
        return self.counts()[0]

    def waiting(self) -> bool:
        """Whether the study may hold a queued (WAITING) trial: asked of the database in
        one query, so that taking a trial under the lock needs Optuna's queue pop (which
        reads every new and unfinished trial of every driver back into this driver's
        cache) only when there is one to take. Without a database to ask: ``True``.
        Inside :meth:`claim` on SQLite, its count has seen it already."""
        if self._waiting is not None:
            return self._waiting
        backend = getattr(self._study._storage, "backend", None)  # a DriverStorage's
        if backend is None:
            return True
        from sqlalchemy import text

        with backend.engine.connect() as connection:
            row = connection.execute(
                text(_WAITING_SQL), {"study_id": self._study._study_id}
            ).first()
        return row is not None

    def _count_tail(self, rows: list[tuple[int, str, int]]) -> tuple[int, int, bool]:
        """(claimed, running, whether one waits) from the trials from ``_from_id`` on, in
        id order; moves ``_from_id`` up to the first of them not finished."""
        claimed, running, waiting = self._below, 0, False
        first_open: int | None = None
        for trial_id, state, given_back in rows:
            counts = state in _CLAIMED and not given_back
            claimed += counts
            running += state == "RUNNING"
            waiting |= state == "WAITING"
            if first_open is None:
                if state in _FINISHED:
                    self._below += counts
                else:
                    first_open = trial_id
        if first_open is not None:
            self._from_id = first_open
        elif rows:
            self._from_id = rows[-1][0] + 1
        return claimed, running, waiting

    def counts(self) -> tuple[int, int]:
        """The trials that count against the budget, and those of them still running
        (asked or reserved included), as the storage has them now: one query."""
        claimed, running, _ = self._counts()
        return claimed, running

    def _counts(self) -> tuple[int, int, bool | None]:
        """:meth:`counts`, and whether a queued trial waits where the same query saw it
        (SQLite; else ``None``: :meth:`waiting` asks)."""
        storage = self._study._storage
        backend = getattr(storage, "backend", None)  # a DriverStorage's database
        study_id = self._study._study_id
        if backend is not None and backend.engine.dialect.name == "sqlite":
            # Through the DB-API: ~50 us, not ~200 us through SQLAlchemy (once per hold).
            connection = backend.engine.raw_connection()
            try:
                cursor = connection.cursor()
                try:
                    args = (UNUSED_ATTR, INTERRUPTED_ATTR, study_id, self._from_id)
                    rows = cursor.execute(_TAIL_SQLITE, args).fetchall()
                finally:
                    cursor.close()
            finally:
                connection.close()  # back to the pool
            return self._count_tail(rows)
        if backend is not None:  # one query, not every trial back from the database
            from sqlalchemy import text

            with backend.engine.connect() as connection:
                count, running = connection.execute(
                    text(_COUNT_SQL),
                    {"study_id": study_id, "unused": UNUSED_ATTR, "interrupted": INTERRUPTED_ATTR},
                ).one()
            return int(count or 0), int(running or 0), None
        from optuna.trial import TrialState

        states = tuple(TrialState[name] for name in _CLAIMED)
        counted = [
            t
            for t in storage.get_all_trials(study_id, deepcopy=False, states=states)
            if UNUSED_ATTR not in t.system_attrs and INTERRUPTED_ATTR not in t.system_attrs
        ]
        return len(counted), sum(t.state == TrialState.RUNNING for t in counted), None
