"""``paralela.compare``: cross-validate many models and grids on every slot at once."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela._files import make_dirs
from paralela.comparing._checks import (
    check_budget,
    check_families,
    check_samples,
    check_target,
    families_given,
    grid_mode,
    make_folds,
    pruning,
    scoring_name,
)
from paralela.comparing._results import check_completed, record_of, result_of, write_results
from paralela.comparing._store import comparison_identity, open_study
from paralela.errors import add_note
from paralela.studies import storage_errors

if TYPE_CHECKING:
    from paralela.comparing._candidates import Candidate, GridSource, SampledSource
    from paralela.comparing._families import Family
    from paralela.comparing._results import CandidateRecord, CompareResult
    from paralela.comparing._schedule import Scheduler
    from paralela.comparing._store import FoldLog

__all__ = ["compare"]


def compare(
    estimators_or_space: Any,
    X: Any,
    y: Any,
    *,
    cv: Any = 5,
    scoring: str | Callable[..., float] | None = None,
    n_trials: int | None = None,
    time_budget: float | None = None,
    sampler: str | Any | None = None,
    pruner: str | Any | None = None,
    halving: bool = False,
    refit: bool = True,
    run_dir: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    seed: int | None = None,
    progress: bool | Callable[[CandidateRecord], None] | None = None,
) -> CompareResult:
    """Cross-validate every candidate (a model family and its parameters) on the slots.

    Each (candidate, fold) pair is one task on a worker process pinned to a slot, its
    BLAS/OpenMP thread pools limited to the slot's CPUs (threadpoolctl); the data set
    reaches each worker once. Families share the slots (no barrier between them).

    Args:
        estimators_or_space: ``{name: estimator}``, ``{name: (estimator or factory,
            grid)}`` (a grid, or a list of grids as ``GridSearchCV``'s ``param_grid``), a
            conditional :class:`~paralela.Space` (or its file) whose
            ``Choice`` names the families, or a list of ``Family`` objects; see
            ``docs/compare.md``.
        X: the data set's features (anything scikit-learn's splitters and estimators take).
        y: the data set's targets (the same).
        cv: folds, as ``GridSearchCV`` takes them (an int: stratified for classifiers),
            computed once, so scores equal ``GridSearchCV``'s on the same grid and folds.
        scoring: ``None`` (the estimator's ``score``), a scikit-learn scorer name, or a
            callable ``scorer(estimator, X, y)``; greater is better (``neg_*`` names).
        n_trials: candidates to run: without it, every grid point of finite spaces; with
            it, that many grid points drawn at random (``seed``), or sampled.
        time_budget: seconds after which no candidate starts; those started finish.
        sampler: ``None`` or ``"grid"``: the grid of every family (each parameter a
            list of values); an Optuna sampler name (``"tpe"``, ``"random"``...) or
            object: sample ``n_trials`` candidates (needed for continuous parameters,
            where ``"tpe"`` is the default).
        pruner: ``None``; ``"median"`` (``True``): after each fold, stop a candidate
            whose mean so far is below the median of the complete ones at that fold;
            ``"halving"``: as ``halving=True``; or an Optuna pruner object.
        halving: successive halving across candidates with folds as the resource:
            every candidate on 1 fold, the best third on 3, ..., the last round on all
            folds (``HalvingGridSearchCV``'s scheme, factor 3).
        refit: fit the best candidate on all the data (in this process, every thread)
            and save it to ``run_dir/best.pkl``.
        run_dir: the comparison's directory; running again with it resumes (finished
            folds are not fitted again). Default ``paralela-runs/compare-<hash>``.
        workers: tasks at once (default: one per CPU); CPUs are shared among them.
        seed: seed of the sampler, or of the draw of ``n_trials`` grid points; also the
            ``random_state`` of estimators that take one and leave it unset (default 0).
        progress: print a line per candidate that ends (default: on a terminal), or a
            function called with each ended candidate's record.

    Returns:
        A :class:`CompareResult`; the run directory holds ``compare.json``,
        ``leaderboard.csv``, ``best.json`` and ``best.pkl``. ``best`` is ``None`` only
        when no candidate ran (a ``time_budget`` spent before the first started).

    Raises:
        ConfigError: bad families or estimators (no ``fit``), a target missing in some
            rows or with one class (one value) in all of them, bad scoring, cv, budget,
            sampler or pruner, a run directory holding another comparison; before any
            task runs.
        CompareError: candidates ran, and none completed (every one failed): names
            how many and the first failure; its ``result`` is what was written.
        KeyboardInterrupt: Ctrl-C (or SIGTERM): the tasks running are stopped; what
            finished is in ``run_dir`` and a rerun with it goes on from there.

    A candidate whose fit or scoring raises ends ``FAIL`` with the error (its other
    folds are stopped); the others go on. A fold whose worker died runs once more.
    """
    return _Comparison(_Args(**locals()), started=time.time()).run()  # locals(): the arguments


@dataclass
class _Args:
    """One ``compare`` call's arguments, as given (:func:`compare` documents them)."""

    estimators_or_space: Any
    X: Any
    y: Any
    cv: Any
    scoring: str | Callable[..., float] | None
    n_trials: int | None
    time_budget: float | None
    sampler: str | Any | None
    pruner: str | Any | None
    halving: bool
    refit: bool
    run_dir: str | os.PathLike[str] | None
    workers: int | None
    seed: int | None
    progress: bool | Callable[[CandidateRecord], None] | None


class _Comparison:
    """One ``compare`` call in named steps.

    ``__init__`` checks the input before anything is written (the data, the families, the
    target, the scoring, the folds, the budget, the pruning); :meth:`run` opens the run
    directory, the workers and the study, schedules the (candidate, fold) tasks and
    writes the result.
    """

    def __init__(self, args: _Args, started: float) -> None:
        self.args = a = args
        self.t0 = started
        check_samples(a.X, a.y)
        self.families = families_given(a.estimators_or_space, a.y, a.seed)
        self.estimators = check_families(self.families, a.scoring)
        check_target(a.y, self.estimators)
        self.score_name = scoring_name(a.scoring)
        self.folds = make_folds(a.cv, a.X, a.y, self.families, self.estimators)
        self.grid = grid_mode(self.families, a.sampler)
        check_budget(a.n_trials, a.time_budget, grid=self.grid)
        self.halving, self.pruner = pruning(a.pruner, a.halving)
        self.notes: list[str] = []

    def run(self) -> CompareResult:
        """Run every (candidate, fold) task on the slots; write the result. The workers,
        the fold log and the study's database are let go however it ends."""
        a = self.args
        identity = comparison_identity(
            self.families, self.estimators, a.X, a.y, self.folds, self.score_name
        )
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
        root = (
            Path(a.run_dir)
            if a.run_dir is not None
            else Path("paralela-runs") / f"compare-{digest}"
        )
        with storage_errors(root, "comparison"):  # a full disk: one paragraph, the path
            make_dirs(root)
            from paralela.comparing._store import FoldLog, check_identity

            check_identity(root, identity)
            log = FoldLog(root)
            report = _progress(a.progress, len(self.folds))
            backend = database = None
            try:
                from paralela.backends import make_backend
                from paralela.resources import detect, make_slots

                slots = make_slots(detect(), n_slots=a.workers)
                # A pool of its own, shut down below; the workers boot while the study opens.
                backend = make_backend("processes", slots=slots)
                study = None
                if not self.grid or self.pruner is not None:
                    study, database = open_study(
                        root, a.sampler, a.seed, self.pruner, grid=self.grid, notes=self.notes
                    )
                source = self.candidates(log, study)
                scheduler = self.scheduler(backend, source, log, len(slots), study, report)
                self.schedule(scheduler, source, root, len(slots))
                backend.shutdown(wait=False, cancel_futures=True)
                backend = None
                final = self.result(source, root, len(slots), refit_best=a.refit)
                write_results(final)
                check_completed(final)
                return final
            finally:
                log.close()
                if backend is not None:
                    backend.shutdown(wait=False, cancel_futures=True)
                engine = getattr(database, "engine", None)
                if engine is not None:
                    engine.dispose()

    def candidates(self, log: FoldLog, study: Any) -> GridSource | SampledSource:
        """Where the candidates come from: the grid points (all, or ``n_trials`` drawn),
        or the study's sampler."""
        from paralela.comparing._candidates import GridSource, SampledSource

        a, n_folds = self.args, len(self.folds)
        if self.grid:
            return GridSource(self.families, n_folds, log, n_trials=a.n_trials, seed=a.seed)
        return SampledSource(self.families, n_folds, log, study, n_trials=a.n_trials)

    def scheduler(
        self,
        backend: Any,
        source: GridSource | SampledSource,
        log: FoldLog,
        slots: int,
        study: Any,
        report: Callable[[Candidate], None] | None,
    ) -> Scheduler:
        """The scheduler of the (candidate, fold) tasks; the data set is sent once."""
        from paralela.backends import Broadcast
        from paralela.comparing._schedule import Scheduler
        from paralela.comparing._tasks import SharedData

        a = self.args
        makers = {f.name: f.make for f in self.families}
        shared = Broadcast(SharedData(a.X, a.y, self.folds, a.scoring, makers))
        return Scheduler(
            backend=backend,
            shared=shared,
            n_folds=len(self.folds),
            source=source,
            log=log,
            slots=slots,
            study=study,
            stepwise=self.pruner is not None,
            halving=self.halving,
            deadline=None if a.time_budget is None else time.monotonic() + a.time_budget,
            on_end=report,
        )

    def schedule(
        self, scheduler: Scheduler, source: GridSource | SampledSource, root: Path, slots: int
    ) -> None:
        """Run the tasks. Ctrl-C or SIGTERM: write the results so far (no refit), say how
        to go on, raise."""
        from paralela.backends import sigterm_as_interrupt

        try:
            with sigterm_as_interrupt():
                scheduler.run()
        except KeyboardInterrupt as exc:
            write_results(self.result(source, root, slots, refit_best=False))
            add_note(
                exc,
                f"The comparison was interrupted: the folds that finished are in "
                f"{root / 'folds.jsonl'} and the leaderboard so far in "
                f"{root / 'leaderboard.csv'}; run it again with run_dir={str(root)!r} to "
                "go on (finished folds are not fitted again).",
            )
            raise

    def result(
        self, source: GridSource | SampledSource, root: Path, slots: int, *, refit_best: bool
    ) -> CompareResult:
        families, X, y = self.families, self.args.X, self.args.y
        return result_of(
            source.candidates,
            run_dir=root,
            started=self.t0,
            scoring=self.score_name,
            n_folds=len(self.folds),
            slots=slots,
            notes=self.notes,
            refit=(lambda best: _refit(families, best, X, y)) if refit_best else None,
        )


def _refit(families: Sequence[Family], best: CandidateRecord, X: Any, y: Any) -> Any:
    family = next(f for f in families if f.name == best.family)
    estimator = family.make(dict(best.params))
    estimator.fit(X, y)
    return estimator


def _progress(
    progress: bool | Callable[[CandidateRecord], None] | None, n_folds: int
) -> Callable[[Candidate], None] | None:
    if callable(progress):
        call = progress

        def forward(candidate: Candidate) -> None:
            call(record_of(candidate))

        return forward
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None

    def show(candidate: Candidate) -> None:
        record = record_of(candidate)
        score = (
            "-"
            if record.mean is None or math.isnan(record.mean)
            else f"{record.mean:.4f} ± {record.std or 0.0:.4f}"
        )
        done = sum(s is not None for s in record.fold_scores)
        params = json.dumps(record.params, default=repr, sort_keys=True)
        tail = f" ({record.error})" if record.error else ""
        print(
            f"compare: #{record.number} {record.family} {params}: {score} "
            f"[{done}/{n_folds} folds] {record.state}{tail}",
            file=sys.stderr,
        )

    return show
