"""The sampler and the database, in a thread of their own.

Asking Optuna for a trial costs ~3 ms of CPU with TPE (20-30 ms with Optuna's own
SQLite storage; the driver's ``DriverStorage`` spares most of it) and telling it a
result well under 1 ms. The oracle keeps one trial asked ahead per slot and tells
results in the background, so a slot that frees starts its next trial at once, never
waiting on the sampler or the database.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paralela.studies import DRIVER_ATTR, driver_identity

if TYPE_CHECKING:
    from paralela.sweeping._budget import SharedBudget
    from paralela.sweeping._worker_trial import TrialOutcome

__all__ = ["Oracle"]

LOG_ERROR_CHARS = 4000


class Oracle:
    """Asks trials ahead and tells outcomes, in order, from one thread."""

    def __init__(
        self,
        study: Any,
        distributions: dict[str, Any],
        ahead: int,
        limit: int | None,
        budget: SharedBudget | None = None,
        read_back: bool = False,
        sample: Callable[[Any], object] | None = None,
    ) -> None:
        self._study = study
        self._distributions = distributions
        # A conditional space's sample(trial): what to ask depends on what was drawn, so
        # the trial is asked empty and sampled define-by-run (Space.sample); else one
        # ask(distributions), which is faster.
        self._sample = sample
        self._ahead = ahead
        self._limit = limit  # how many trials this run may still ask (None: no limit)
        self._budget = budget  # n_trials over every driver of the study (see _budget)
        # Read each trial back before telling how it ended: its worker wrote to it
        # (define-by-run parameters); else only pruned ones (their last report).
        self._read_back = read_back
        self._exhausted = False  # the shared budget is spent: nothing more to ask
        self._identity = driver_identity()
        self._cv = threading.Condition()
        self._asked: collections.deque[Any] = collections.deque()
        self._tells: collections.deque[tuple[Any, TrialOutcome]] = collections.deque()
        self._n_asked = 0
        # Trials reserved under the shared budget's lock (one per slot at a time), not
        # yet sampled: RUNNING in the study, so every driver counts them (see _budget).
        self._reserved: collections.deque[int] = collections.deque()
        self._held = False  # the driver is starting trials: leave it the GIL (hold())
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="paralela-oracle", daemon=True)
        self._thread.start()

    def take(self) -> Any:
        """The next trial (asked ahead, or as soon as the sampler gives one)."""
        with self._cv:
            if not self._asked:  # nothing ahead: the sampler must work now, held or not
                self._held = False
                self._cv.notify_all()
            self._cv.wait_for(lambda: self._asked or self._error is not None or self._exhausted)
            if self._error is not None:
                raise self._error
            return self._asked.popleft() if self._asked else None

    @property
    def exhausted(self) -> bool:
        """Nothing left to take: the budget shared with other drivers is spent."""
        with self._cv:
            return self._exhausted and not self._asked

    def tell(self, trial: Any, outcome: TrialOutcome) -> None:
        """Tell how ``trial`` ended (a trial that wrote to the study itself, or may have,
        ``outcome.wrote``, is read back first)."""
        with self._cv:
            self._tells.append((trial, outcome))
            self._cv.notify_all()

    def hold(self) -> None:
        """Do no new work until :meth:`resume`: the driver is starting trials.

        The sampler and the database need a few ms of CPU per trial, in Python: run while
        the driver hands a freed slot its next trial, they would hold the GIL the driver
        needs (up to 5 ms at a time, Python's switch interval), with the slot idle.
        """
        with self._cv:
            self._held = True

    def resume(self) -> None:
        with self._cv:
            self._held = False
            self._cv.notify_all()

    def stop_asking(self) -> None:
        with self._cv:
            self._limit = self._n_asked
            self._cv.notify_all()

    def close(self) -> tuple[list[Any], list[int]]:
        """Tell what is left to tell; return the trials asked but never taken, and the
        ids of those reserved but never asked: both to give back to the budget."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return list(self._asked), list(self._reserved)

    def _want_ask(self) -> bool:
        if self._closing or self._exhausted or len(self._asked) >= self._ahead:
            return False
        return self._limit is None or self._n_asked < self._limit

    def _ask(self) -> Any:
        if self._sample is None:
            return self._study.ask(self._distributions)
        trial = self._study.ask()
        self._sample(trial)
        return trial

    def _batch(self) -> int:
        """How many trials to reserve at once: one per slot, no more than this run may
        still ask (the ask being made counted)."""
        want = self._ahead
        if self._limit is not None:
            want = min(want, self._limit - self._n_asked + 1)
        return max(1, want)

    def _reserve(self, count: int) -> list[int]:
        """Trials of the study's, RUNNING from now on (so the shared budget counts them):
        one popped from its queue (``enqueue_trial``), or ``count`` new rows. The first
        half of Optuna's ``Study.ask``, and the only half that needs the budget's lock."""
        study = self._study
        if self._budget is None or self._budget.waiting():
            # (Optuna's pop reads the study back first: with 64 drivers, doing that
            # under the lock made the others queue behind it; only when a trial waits)
            trial_id = study._pop_waiting_trial_id()
            if trial_id is not None:
                return [trial_id]
        create_many = getattr(study._storage, "create_new_trials", None)  # a DriverStorage's
        if create_many is not None:
            return [int(t) for t in create_many(study._study_id, count)]
        return [int(study._storage.create_new_trial(study._study_id)) for _ in range(count)]

    def _ask_reserved(self, trial_id: int) -> Any:
        """The second half of ``Study.ask`` for a reserved trial: the sampler's work (it
        reads every trial of the study: the costly half), outside the budget's lock, so
        that drivers sharing a run directory sample at the same time and take the lock
        only to count and reserve (with 64 drivers the asks had queued for the lock)."""
        from optuna.trial import Trial

        study = self._study
        study._thread_local.cached_all_trials = None  # as Study.ask: sample on fresh trials
        trial = Trial(study, trial_id)
        if self._sample is None:
            for name, distribution in self._distributions.items():
                trial._suggest(name, distribution)
        else:
            self._sample(trial)
        return trial

    def _run(self) -> None:
        from optuna.trial import TrialState

        states = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED}
        storage = self._study._storage
        refresh = getattr(storage, "refresh", None)  # a DriverStorage's
        # Samplers may call study.stop() once they run out (GridSampler does, at the last
        # point), which Optuna allows only inside its own optimize loop, else raises. This
        # thread is the sweep's loop: let stop() set its flag; the budget ends the sweep.
        self._study._thread_local.in_optimize_loop = True
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(
                        lambda: (
                            self._closing or (not self._held and (self._tells or self._want_ask()))
                        )
                    )
                    tells = list(self._tells)
                    self._tells.clear()
                    ask = self._want_ask()
                    if ask:
                        self._n_asked += 1
                    if not tells and not ask and self._closing:
                        return
                for trial, outcome in tells:
                    state = states.get(outcome.state, TrialState.FAIL)
                    values, error = outcome.values, outcome.error
                    if refresh is not None and (
                        self._read_back or outcome.wrote is not False or state == TrialState.PRUNED
                    ):  # what it wrote (a pruned trial's value is its last report): read it
                        refresh(trial._trial_id)
                    if error:
                        storage.set_trial_system_attr(
                            trial._trial_id, "paralela:error", error[-LOG_ERROR_CHARS:]
                        )
                    self._study.tell(
                        trial, values if state == TrialState.COMPLETE else None, state=state
                    )
                if ask and self._budget is not None:
                    if not self._reserved:
                        with self._budget.claim(self._batch()) as allowed:
                            if allowed:
                                self._reserved.extend(self._reserve(allowed))
                    if self._reserved:
                        trial = self._ask_reserved(self._reserved.popleft())
                    else:  # other drivers took the rest of the budget
                        with self._cv:
                            self._exhausted = True
                            self._n_asked -= 1
                            self._cv.notify_all()
                        continue
                elif ask:
                    trial = self._ask()
                if ask:
                    if storage.get_trial(trial._trial_id).system_attrs.get(DRIVER_ATTR) is None:
                        # (a DriverStorage writes it with each new trial; not with a
                        # trial taken from the queue, nor with a journal file)
                        storage.set_trial_system_attr(trial._trial_id, DRIVER_ATTR, self._identity)
                    with self._cv:
                        self._asked.append(trial)
                        self._cv.notify_all()
        except BaseException as exc:  # surfaces in the driver's next take() or close()
            with self._cv:
                self._error = exc
                self._cv.notify_all()
