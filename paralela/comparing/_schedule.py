"""The driver loop of a comparison: (candidate, fold) tasks on every slot at once.

::

    source ──take──> candidate ──folds──> backend.submit(run_fold, shared, ...) ─┐
       ^                 │   (at most WINDOW_PER_SLOT tasks per slot in flight)  │
       │                 │                                                       v
       │   folds.jsonl <─┴── outcome: log the fold, report the running mean <── wait
       │                     to the trial; prune? cancel its other folds;
       └──── a slot is free: the next fold of a running candidate, else a new one

Families share the slots: there is no barrier between them. Modes:

- plain: a candidate's folds are all queued at once.
- pruned (an Optuna pruner): one fold of a candidate at a time, in order; after each,
  ``trial.report(mean so far, step=fold)`` and ``trial.should_prune()``: a candidate
  pruned is ``PRUNED`` with the folds it ran.
- halving: successive halving across candidates with folds as the resource, as
  ``HalvingGridSearchCV`` with ``factor``: round 0 runs every candidate on 1 fold, then
  the best ``1/factor`` (by mean over the round's folds; ties: the lower number) go on
  to ``factor`` times the folds (at most all), until a round with every fold; the
  others end ``PRUNED``. Folds are never refitted from one round to the next.

Failures: a fold that raises ends its candidate ``FAIL`` (its other folds are
cancelled); a fold whose worker died (a crash in native code, out of memory) runs
once more on a fresh worker, then fails its candidate with ``WorkerDiedError``.

Resume: the folds and ended candidates in ``folds.jsonl`` are taken as they are; in
halving mode the rounds are decided again from the logged folds (the same decisions).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from typing import Any

from paralela.backends import Backend, Broadcast
from paralela.comparing._candidates import Candidate, GridSource, SampledSource
from paralela.comparing._store import FoldLog
from paralela.comparing._tasks import FoldOutcome, SharedData, run_fold
from paralela.errors import WorkerDiedError

__all__ = ["HALVING_FACTOR", "Scheduler", "halving_rounds"]

# Tasks in flight per slot: one running, one queued behind it (the backend's PREFETCH),
# so a worker never idles for a round trip; more would only delay pruning decisions.
WINDOW_PER_SLOT = 2
HALVING_FACTOR = 3
# A (candidate, fold) whose worker died is run again this many times, then fails.
RETRIES = 1


def halving_rounds(n_folds: int, factor: int = HALVING_FACTOR) -> list[int]:
    """Folds per round: 1, factor, factor**2, ... and a last round with all ``n_folds``."""
    rounds = [1]
    while rounds[-1] < n_folds:
        rounds.append(min(n_folds, rounds[-1] * factor))
    return rounds


class Scheduler:
    """Run the candidates of ``source`` on ``backend``; see the module docstring.

    ``on_end(candidate)`` is called once per candidate that ends in this run. A
    ``KeyboardInterrupt`` while waiting cancels the tasks in flight and propagates;
    what finished is in the log.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        shared: Broadcast[SharedData],
        n_folds: int,
        source: GridSource | SampledSource,
        log: FoldLog,
        slots: int,
        study: Any = None,
        stepwise: bool = False,
        halving: bool = False,
        factor: int = HALVING_FACTOR,
        deadline: float | None = None,
        on_end: Callable[[Candidate], None] | None = None,
    ) -> None:
        self.backend = backend
        self.shared = shared
        self.n_folds = n_folds
        self.source = source
        self.log = log
        self.window = max(1, slots) * WINDOW_PER_SLOT
        self.study = study
        self.stepwise = stepwise
        self.halving = halving
        self.factor = factor
        self.deadline = deadline
        self.on_end = on_end
        self.costs: dict[str, float] = {}  # family -> mean seconds per task
        self._timed: dict[str, int] = {}
        self.futures: dict[Future[FoldOutcome], tuple[Candidate, int]] = {}
        self.retries: dict[tuple[str, int], int] = {}
        self.outcomes: list[FoldOutcome] = []  # this run's, for diagnostics and tests
        for candidate in source.candidates:
            self._restore(candidate)

    # -- state ---------------------------------------------------------------------

    def _restore(self, candidate: Candidate) -> None:
        """Take the candidate's logged folds (and, but in halving, its logged end)."""
        logged = self.log.candidates.get(candidate.key)
        if logged is None:
            return
        candidate.number = logged.number
        for fold, entry in logged.folds.items():
            candidate.warned(fold, entry.get("warnings") or ())
            if entry.get("error") is None and entry.get("score") is not None:
                candidate.scores[fold] = float(entry["score"])
                candidate.fit_seconds[fold] = float(entry.get("fit_seconds", 0.0))
        if logged.state is not None and (not self.halving or logged.state == "FAIL"):
            candidate.state = logged.state
            candidate.error = logged.error
        elif any(e.get("error") is not None for e in logged.folds.values()):
            failed = next(e for e in logged.folds.values() if e.get("error") is not None)
            candidate.state, candidate.error = "FAIL", failed["error"]

    def _end(self, candidate: Candidate, state: str, error: str | None = None) -> None:
        candidate.state = state
        candidate.error = error
        self._cancel(candidate)
        logged = self.log.candidates.get(candidate.key)
        if logged is None or logged.state != state:
            self.log.append(
                {
                    "kind": "end",
                    "key": candidate.key,
                    "number": candidate.number,
                    "family": candidate.family,
                    "params": candidate.params,
                    "state": state,
                    "error": error,
                }
            )
        self._tell(candidate)
        if self.on_end is not None:
            self.on_end(candidate)

    def _tell(self, candidate: Candidate) -> None:
        """Tell the candidate's Optuna trial how it ended (once: the trial is let go)."""
        if candidate.trial is None or self.study is None:
            return
        from optuna.trial import TrialState

        trial, candidate.trial = candidate.trial, None
        mean = candidate.mean()
        if candidate.state == "COMPLETE" and mean is not None:
            self.study.tell(trial, mean)
        elif candidate.state == "PRUNED":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            if candidate.error:
                trial.set_user_attr("paralela:error", candidate.error[:1000])
            self.study.tell(trial, state=TrialState.FAIL)

    def _cancel(self, candidate: Candidate) -> None:
        if candidate.inflight:
            futures = list(candidate.inflight.values())
            candidate.inflight.clear()
            for future in futures:
                self.futures.pop(future, None)
            self.backend.cancel(futures)

    def _report(self, candidate: Candidate) -> bool:
        """Report the folds finished in order to the trial; ``True`` when it is pruned."""
        trial = candidate.trial
        if trial is None:
            return False
        reported = False
        while candidate.reported in candidate.scores:
            step = candidate.reported
            trial.report(candidate.mean(step + 1), step=step)
            candidate.reported += 1
            reported = True
        return reported and candidate.reported < candidate.n_folds and trial.should_prune()

    def _settle(self, candidate: Candidate) -> None:
        """End the candidate if its folds say so (pruned, or every fold done)."""
        if candidate.state != "RUNNING":
            return
        if self.stepwise and self._report(candidate):
            self._end(candidate, "PRUNED")
        elif not self.stepwise and candidate.trial is not None:
            self._report(candidate)
        if (
            candidate.state == "RUNNING"
            and candidate.target >= candidate.n_folds
            and len(candidate.scores) >= candidate.n_folds
        ):
            self._end(candidate, "COMPLETE")

    # -- tasks ---------------------------------------------------------------------

    def _next_fold(self, candidate: Candidate, *, eager: bool = False) -> int | None:
        """The next fold to run; with a pruner, only after the previous one reported,
        unless ``eager`` (nothing else is left to run: a free slot is worth more)."""
        if candidate.state != "RUNNING" or (self.stepwise and candidate.inflight and not eager):
            return None
        for fold in range(min(candidate.target, candidate.n_folds)):
            if fold not in candidate.scores and fold not in candidate.inflight:
                return fold
        return None

    def _submit(self, candidate: Candidate, fold: int) -> None:
        future = self.backend.submit(
            run_fold, self.shared, candidate.family, candidate.params, fold
        )
        candidate.inflight[fold] = future
        self.futures[future] = (candidate, fold)

    def _fill(self, active: list[Candidate], *, new: bool) -> bool:
        """Submit tasks until the window is full; ``False`` once the source is empty."""
        more = new
        while len(self.futures) < self.window:
            task = self._task(active, eager=False)
            if task is None and more and not self._past_deadline():
                candidate = self.source.take(self.costs)
                if candidate is None:
                    more = False
                else:
                    if candidate.state == "RUNNING":
                        self._restore(candidate)  # a sampled one may have logged folds
                    if candidate.state != "RUNNING":
                        self._tell(candidate)  # a logged failure: its new trial fails too
                    if candidate.state == "RUNNING" and candidate.trial is None and self.study:
                        candidate.trial = self.study.ask()  # a grid point, for the pruner
                    if candidate.state == "RUNNING":
                        self._settle(candidate)  # its logged folds may finish or prune it
                    if candidate.state == "RUNNING":
                        active.append(candidate)
                    continue
            if task is None:
                task = self._task(active, eager=True)
            if task is None:
                break
            self._submit(*task)
        return more

    def _task(self, active: Sequence[Candidate], *, eager: bool) -> tuple[Candidate, int] | None:
        for candidate in active:
            fold = self._next_fold(candidate, eager=eager)
            if fold is not None:
                return candidate, fold
        return None

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _wait(self) -> None:
        done, _ = wait(list(self.futures), return_when=FIRST_COMPLETED)
        for future in done:
            task = self.futures.pop(future, None)
            if task is not None:
                self._handle(future, *task)

    def _handle(self, future: Future[FoldOutcome], candidate: Candidate, fold: int) -> None:
        candidate.inflight.pop(fold, None)
        if candidate.state != "RUNNING":
            return
        try:
            outcome = future.result()
        except CancelledError:
            return
        except WorkerDiedError as exc:
            tries = self.retries.get((candidate.key, fold), 0)
            if tries < RETRIES:
                self.retries[(candidate.key, fold)] = tries + 1
                self._submit(candidate, fold)
                return
            outcome = FoldOutcome(score=None, error=f"WorkerDiedError: {exc}")
        except Exception as exc:  # e.g. the result could not be rebuilt here
            outcome = FoldOutcome(score=None, error=f"{type(exc).__name__}: {exc}")
        self.outcomes.append(outcome)
        self.log.append(
            {
                "kind": "fold",
                "key": candidate.key,
                "number": candidate.number,
                "family": candidate.family,
                "params": candidate.params,
                "fold": fold,
                "score": outcome.score,
                "error": outcome.error,
                "fit_seconds": outcome.fit_seconds,
                "score_seconds": outcome.score_seconds,
                "threads": outcome.threads,
                "slot_threads": outcome.slot_threads,
                "pid": outcome.pid,
                "data_loads": outcome.data_loads,
                "warnings": [list(w) for w in outcome.warnings],
            }
        )
        candidate.warned(fold, outcome.warnings)
        if outcome.error is not None or outcome.score is None:
            self._end(candidate, "FAIL", outcome.error or "no score")
            return
        candidate.scores[fold] = outcome.score
        candidate.fit_seconds[fold] = outcome.fit_seconds
        seconds = outcome.fit_seconds + outcome.score_seconds
        n = self._timed.get(candidate.family, 0)
        self.costs[candidate.family] = (self.costs.get(candidate.family, 0.0) * n + seconds) / (
            n + 1
        )
        self._timed[candidate.family] = n + 1
        self._settle(candidate)

    # -- the loops -----------------------------------------------------------------

    def run(self) -> None:
        """Run until every candidate has ended (or the deadline stopped new ones)."""
        try:
            if self.halving:
                self._run_halving()
            else:
                self._run_stream()
        except BaseException:
            self.backend.cancel(list(self.futures))
            self.futures.clear()
            raise

    def _run_stream(self) -> None:
        active: list[Candidate] = []
        more = True
        while True:
            more = self._fill(active, new=more)
            active = [c for c in active if c.state == "RUNNING"]
            if not self.futures:
                # Nothing in flight: the source is empty (or past the deadline) and every
                # candidate taken has ended.
                return
            self._wait()

    def _run_halving(self) -> None:
        taken = self.source.take_all()
        for candidate in taken:
            if candidate.state == "RUNNING":
                self._restore(candidate)
        alive = [c for c in taken if c.state == "RUNNING"]
        for target in halving_rounds(self.n_folds, self.factor):
            for candidate in alive:
                candidate.target = target
                self._settle(candidate)
            self._drain(alive)
            alive = [c for c in alive if c.state == "RUNNING"]
            if target >= self.n_folds or not alive:
                return
            keep = max(1, math.ceil(len(alive) / self.factor))
            ranked = sorted(alive, key=lambda c: (-(c.mean(target) or -math.inf), c.number))
            for candidate in ranked[keep:]:
                self._end(candidate, "PRUNED")
            alive = sorted(ranked[:keep], key=lambda c: c.number)

    def _drain(self, candidates: Sequence[Candidate]) -> None:
        """Run the candidates' folds up to their target, and wait for all of them."""
        while True:
            self._fill(list(candidates), new=False)
            if not self.futures:
                return
            self._wait()
