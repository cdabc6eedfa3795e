"""The driver's view of the study: Optuna's cached storage that also remembers its writes.

::

    oracle / driver ── ask, tell, report ──> DriverStorage ── every write ──> database
                                               │  cache: every trial, kept up to date
                                               │  by this driver's own writes
                                               └─ reads: from the cache; the database is
                                                  read again (new and unfinished trials
                                                  only) at most every SYNC_SECONDS

Optuna's ``_CachedStorage`` keeps finished trials in memory but reads every unfinished
trial, and every newer one, back from the database on each ``get_all_trials`` and
``get_trial`` of an unfinished trial. TPE does that about five times per ``ask``: with
two trials running and two asked ahead, 20-25 ms of SQLAlchemy per trial (measured with
``bench/bench_sweep.py``'s space and 200 trials), spent on the cores the trials run on.

The driver writes nearly all of a study itself (the trials it asks, their parameters,
states, values, and the command trials' reports), so this storage applies each of its
own writes to its cache too and needs the database only for what others write: function
trials' reports (written by the workers), other drivers' trials on a shared database,
trials enqueued from elsewhere. Those it reads every ``SYNC_SECONDS``; the driver also
reads a trial back before telling that it was pruned (its value is its last report) and
everything at the end of the run (:meth:`DriverStorage.sync`). Writes go to the database
at once, as before: a driver that dies loses nothing it has told. On SQLite, the rows of
the trials this driver asks are written by ``_sql.TrialWriter`` (one statement each
instead of Optuna's ORM round trips); every other write is Optuna's own.

Per trial of the benchmark's space (200 trials, TPE), the driver's ask and tell went from
~35 ms of CPU (Optuna's cached storage, SQLite in its default journal mode) to ~3.5 ms,
most of it TPE's own sampling (~2.5 ms on Optuna's in-memory storage), with the same
parameters drawn (same seed, same trials).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Container, Sequence
from datetime import datetime
from typing import Any

from optuna.distributions import (
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.storages import RDBStorage, _CachedStorage
from optuna.storages._cached_storage import _StudyInfo
from optuna.trial import FrozenTrial, TrialState

from paralela.sweeping._sql import TrialWriter

__all__ = ["FIRST_RESYNC_SECONDS", "SYNC_SECONDS", "DriverStorage"]

# How stale the driver's view of other writers may be. TPE on another driver's results a
# few seconds late samples as well as Optuna's own processes sharing a study do (each
# samples while the others' trials run); one read of the new trials every 5 s costs
# ~0.1 ms per trial of a 200-trial sweep instead of ~20 ms.
SYNC_SECONDS = 5.0
# The second read comes this soon after the first. The first finds a new study empty; a
# read that finds trials runs the ORM's loaders of every trial table for the first time
# in the process, which compiles their statements: 25-45 ms of CPU, once. Done while the
# first trials run (the sampler's thread reads while it asks ahead), not at the end of a
# sweep shorter than SYNC_SECONDS, where the last read waited on it with the slots idle
# (bench_sweep.py --quick: 40 trials of 0.2 s).
FIRST_RESYNC_SECONDS = 0.3


def _clone(trial: FrozenTrial) -> FrozenTrial:
    """A copy whose dictionaries can be changed without touching ``trial``."""
    new = copy.copy(trial)
    new._params = dict(trial._params)
    new._distributions = dict(trial._distributions)
    new._user_attrs = dict(trial._user_attrs)
    new._system_attrs = dict(trial._system_attrs)
    new.intermediate_values = dict(trial.intermediate_values)
    return new


class DriverStorage(_CachedStorage):
    """An Optuna storage for the sweep driver (one per run, any thread).

    Args:
        backend: the database (the study's ``RDBStorage``).
        sync_seconds: the longest time between two reads of what others wrote.
        new_trial_attrs: system attributes of every trial this storage creates for
            ``ask`` (written with the trial).
    """

    def __init__(
        self,
        backend: RDBStorage,
        *,
        sync_seconds: float = SYNC_SECONDS,
        new_trial_attrs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(backend)
        self._sync_seconds = sync_seconds
        self._new_trial_attrs = dict(new_trial_attrs or {})
        self._synced_at: dict[int, float] = {}
        self._asking: set[int] = set()  # trials created here for ask: see _own_running
        self._sql = TrialWriter(backend.engine) if TrialWriter.usable(backend.engine) else None

    @property
    def backend(self) -> RDBStorage:
        """The database behind the cache."""
        return self._backend

    def sync(self, study_id: int) -> None:
        """Read the new and unfinished trials from the database now."""
        first = study_id not in self._synced_at
        self._skip_finished(study_id)
        self._read_trials_from_remote_storage(study_id)
        now = time.monotonic()
        if first:  # the next read soon (see FIRST_RESYNC_SECONDS)
            now -= max(0.0, self._sync_seconds - FIRST_RESYNC_SECONDS)
        self._synced_at[study_id] = now

    def _skip_finished(self, study_id: int) -> None:
        """Let the next read skip the trials this cache holds finished.

        Optuna's read takes every trial newer than the last finished one a read saw, and
        the unfinished ones: the trials this driver ended itself were read again at each
        sync (all of a sweep's trials at the end of one shorter than SYNC_SECONDS: 16 ms
        for 40 trials). A finished trial never changes, and one this driver ended is
        complete in the cache: the driver wrote it, and read back what others wrote to it
        before ending it (``Oracle.tell``'s ``wrote``). So the read now starts after the
        longest run of consecutive trial ids held finished here, from the first (databases
        number rows from 1); an id missing from the cache (another study's, another
        driver's trial not read yet, a gap a sequence left) ends the run."""
        with self._lock:
            study = self._studies.get(study_id)
            if study is None:
                return
            where = self._trial_id_to_study_id_and_number
            for trial_id in list(study.unfinished_trial_ids):
                key = where.get(trial_id)
                if key is not None and study.trials[key[1]].state.is_finished():
                    study.unfinished_trial_ids.discard(trial_id)
            last = max(study.last_finished_trial_id, 0)
            while True:
                key = where.get(last + 1)
                if key is None or key[0] != study_id:
                    break
                trial = study.trials.get(key[1])
                if trial is None or not trial.state.is_finished():
                    break
                last += 1
            study.last_finished_trial_id = max(study.last_finished_trial_id, last)

    def refresh(self, trial_id: int) -> None:
        """Read one trial from the database now (e.g. reports a worker wrote)."""
        trial = self._backend.get_trial(trial_id)
        with self._lock:
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            if key is not None:
                self._studies[key[0]].trials[key[1]] = trial

    # -- reads ----------------------------------------------------------------------

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        last = self._synced_at.get(study_id)
        if last is None or time.monotonic() - last >= self._sync_seconds:
            self.sync(study_id)
        with self._lock:
            cached = self._studies[study_id].trials.values()
            chosen = cached if states is None else [t for t in cached if t.state in states]
            trials = sorted(chosen, key=lambda t: t.number)
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._lock:
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            if key is not None:
                trial = self._studies[key[0]].trials[key[1]]
                # Optuna's Trial changes the unfinished trial it holds: give it its own.
                return trial if trial.state.is_finished() else _clone(trial)
        return self._backend.get_trial(trial_id)

    # -- writes: to the database, then to the cache -----------------------------------

    def _change(self, trial_id: int, apply: Callable[[FrozenTrial], None]) -> None:
        with self._lock:
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            if key is None:  # not cached yet: the next sync reads it
                return
            trials = self._studies[key[0]].trials
            trial = _clone(trials[key[1]])
            apply(trial)
            trials[key[1]] = trial  # lists handed out earlier keep the old object

    def _own_running(self, trial_id: int) -> FrozenTrial | None:
        """The cached trial, if this driver asked it, still runs it, and writes SQL itself."""
        if self._sql is None:
            return None
        with self._lock:
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            if key is None or trial_id not in self._asking:
                return None
            trial = self._studies[key[0]].trials[key[1]]
        return trial if trial.state == TrialState.RUNNING else None

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        if template_trial is not None or self._sql is None:  # enqueued, added; or a server
            trial_id = super().create_new_trial(study_id, template_trial)
            if template_trial is None:
                for key, value in self._new_trial_attrs.items():
                    self.set_trial_system_attr(trial_id, key, value)
            return trial_id
        return self.create_new_trials(study_id, 1)[0]

    def create_new_trials(self, study_id: int, count: int) -> list[int]:
        """``count`` new running trials, written in one transaction where the driver
        writes SQL itself (else one by one): what a driver reserves under the shared
        budget's lock (see ``_budget``)."""
        if self._sql is None:
            return [self.create_new_trial(study_id) for _ in range(count)]
        made, started = self._sql.create_many(study_id, self._new_trial_attrs, count)
        trials = [
            FrozenTrial(
                number=number,
                state=TrialState.RUNNING,
                value=None,
                datetime_start=started,
                datetime_complete=None,
                params={},
                distributions={},
                user_attrs={},
                system_attrs=dict(self._new_trial_attrs),
                intermediate_values={},
                trial_id=trial_id,
            )
            for trial_id, number in made
        ]
        with self._lock:
            if study_id not in self._studies:
                self._studies[study_id] = _StudyInfo()
            self._add_trials_to_cache(study_id, trials)
            self._asking.update(trial_id for trial_id, _ in made)
        return [trial_id for trial_id, _ in made]

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: Any
    ) -> None:
        trial = self._own_running(trial_id)
        with self._lock:
            key = self._trial_id_to_study_id_and_number.get(trial_id)
            study = None if key is None else self._studies[key[0]]
            first = None if study is None else study.param_distribution.get(param_name)
        if trial is None or param_name in trial.params:
            super().set_trial_param(trial_id, param_name, param_value_internal, distribution)
        elif first is None:  # checked against the study's earlier value, as Optuna does
            assert self._sql is not None
            assert key is not None  # (_own_running found it cached)

            def check(earlier: str) -> None:
                check_distribution_compatibility(json_to_distribution(earlier), distribution)

            self._sql.first_param(
                key[0],
                trial_id,
                param_name,
                param_value_internal,
                distribution_to_json(distribution),
                check,
            )
            with self._lock:  # as Optuna's cache remembers it
                self._studies[key[0]].param_distribution.setdefault(param_name, distribution)
        else:
            check_distribution_compatibility(first, distribution)  # as Optuna's cache does
            assert self._sql is not None
            self._sql.param(
                trial_id, param_name, param_value_internal, distribution_to_json(distribution)
            )

        def apply(t: FrozenTrial) -> None:
            t._params[param_name] = distribution.to_external_repr(param_value_internal)
            t._distributions[param_name] = distribution

        self._change(trial_id, apply)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        trial = self._own_running(trial_id)
        if trial is None or key in trial.system_attrs:
            self._backend.set_trial_system_attr(trial_id, key=key, value=value)
        else:
            assert self._sql is not None
            self._sql.system_attr(trial_id, key, value)
        self._change(trial_id, lambda t: t._system_attrs.__setitem__(key, value))

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        trial = self._own_running(trial_id)
        if trial is None or step in trial.intermediate_values:
            self._backend.set_trial_intermediate_value(trial_id, step, intermediate_value)
        else:
            assert self._sql is not None
            self._sql.report(trial_id, step, intermediate_value)
        self._change(
            trial_id, lambda t: t.intermediate_values.__setitem__(step, intermediate_value)
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._backend.set_trial_user_attr(trial_id, key=key, value=value)
        self._change(trial_id, lambda t: t._user_attrs.__setitem__(key, value))

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        trial = self._own_running(trial_id)
        listed = None if values is None else [float(v) for v in values]
        if trial is not None and state.is_finished() and trial.values is None:
            assert self._sql is not None
            changed = self._sql.finish(trial_id, state, listed)
            if not changed:  # no longer running: Optuna says why
                changed = self._backend.set_trial_state_values(trial_id, state, values)
        else:
            changed = self._backend.set_trial_state_values(trial_id, state=state, values=values)
        if not changed:  # another process took this waiting trial first
            self.refresh(trial_id)
            return False
        now = datetime.now()

        def apply(t: FrozenTrial) -> None:
            if state == TrialState.RUNNING and t.state == TrialState.WAITING:
                t.datetime_start = now
            t.state = state
            if listed is not None:
                t._values = listed
            if state.is_finished():
                t.datetime_complete = now

        self._change(trial_id, apply)
        return True
