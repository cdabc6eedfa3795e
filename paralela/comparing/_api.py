"""``paralela.compare``: cross-validate many models and grids on every slot at once."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela._files import make_dirs
from paralela.errors import ConfigError, add_note

if TYPE_CHECKING:
    from paralela.comparing._candidates import Candidate
    from paralela.comparing._families import Family
    from paralela.comparing._results import CandidateRecord, CompareResult

__all__ = ["compare"]

# The median pruner's settings for folds: a candidate is compared with the complete
# ones from its first fold on (folds are few; waiting a step would cost a whole fold),
# once this many candidates are complete.
MEDIAN_STARTUP = 5


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
            grid)}``, a conditional :class:`~paralela.Space` (or its file) whose
            ``Choice`` names the families, or a list of ``Family`` objects; see
            ``docs/compare.md``.
        X, y: the data set (anything scikit-learn's splitters and estimators take).
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
        ``leaderboard.csv``, ``best.json`` and ``best.pkl``. ``best`` is ``None`` when no
        candidate completed (every one failed or was stopped).

    Raises:
        ConfigError: bad families or estimators (no ``fit``), bad scoring, cv, budget,
            sampler or pruner, a run directory holding another comparison; before any
            task runs.
        KeyboardInterrupt: Ctrl-C (or SIGTERM): the tasks running are stopped; what
            finished is in ``run_dir`` and a rerun with it goes on from there.

    A candidate whose fit or scoring raises ends ``FAIL`` with the error (its other
    folds are stopped); the others go on. A fold whose worker died runs once more.
    """
    t0 = time.time()
    families = _families(estimators_or_space, y, seed)
    _n_samples(X, y)
    estimators = _check_families(families, scoring)
    scoring_name = _scoring_name(scoring)
    folds = _folds(cv, X, y, families, estimators)
    grid = _grid_mode(families, sampler)
    check_budget(n_trials, time_budget, grid=grid)
    halving, pruner_obj = _pruning(pruner, halving)

    identity = _identity(families, estimators, X, y, folds, scoring_name)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    root = Path(run_dir) if run_dir is not None else Path("paralela-runs") / f"compare-{digest}"
    make_dirs(root)
    from paralela.comparing._store import FoldLog, check_identity

    check_identity(root, identity)
    log = FoldLog(root)
    notes: list[str] = []
    report = _progress(progress, len(folds))
    backend = database = None
    try:
        from paralela.backends._processes import ProcessBackend
        from paralela.resources import detect, make_slots

        slots = make_slots(detect(), n_slots=workers)
        backend = ProcessBackend(slots=slots)  # the workers boot while the study opens
        study = None
        if not grid or pruner_obj is not None:
            study, database = _study(root, sampler, seed, pruner_obj, grid=grid, notes=notes)
        from paralela.comparing._candidates import GridSource, SampledSource

        source: GridSource | SampledSource
        if grid:
            source = GridSource(families, len(folds), log, n_trials=n_trials, seed=seed)
        else:
            source = SampledSource(families, len(folds), log, study, n_trials=n_trials)

        from paralela.backends._base import Broadcast
        from paralela.backends._interrupt import sigterm_as_interrupt
        from paralela.comparing._schedule import Scheduler
        from paralela.comparing._tasks import SharedData

        shared = Broadcast(SharedData(X, y, folds, scoring, {f.name: f.make for f in families}))
        scheduler = Scheduler(
            backend=backend,
            shared=shared,
            n_folds=len(folds),
            source=source,
            log=log,
            slots=len(slots),
            study=study,
            stepwise=pruner_obj is not None,
            halving=halving,
            deadline=None if time_budget is None else time.monotonic() + time_budget,
            on_end=report,
        )
        from paralela.comparing._results import write_results

        def result(refit_best: bool) -> CompareResult:
            return _result(
                source.candidates,
                run_dir=root,
                started=t0,
                scoring=scoring_name,
                n_folds=len(folds),
                slots=len(slots),
                notes=notes,
                refit=(lambda best: _refit(families, best, X, y)) if refit_best else None,
            )

        try:
            with sigterm_as_interrupt():
                scheduler.run()
        except KeyboardInterrupt as exc:
            write_results(result(refit_best=False))
            add_note(
                exc,
                f"The comparison was interrupted: the folds that finished are in "
                f"{root / 'folds.jsonl'} and the leaderboard so far in "
                f"{root / 'leaderboard.csv'}; run it again with run_dir={str(root)!r} to "
                "go on (finished folds are not fitted again).",
            )
            raise
        backend.shutdown(wait=False, cancel_futures=True)
        backend = None
        final = result(refit_best=refit)
        write_results(final)
        return final
    finally:
        log.close()
        if backend is not None:
            backend.shutdown(wait=False, cancel_futures=True)
        engine = getattr(database, "engine", None)
        if engine is not None:
            engine.dispose()


# -- checks, before any task runs ------------------------------------------------------


def _families(estimators_or_space: Any, y: Any, seed: int | None) -> list[Family]:
    from paralela.comparing._families import DEFAULT_SEED, Family, families_from

    if isinstance(estimators_or_space, Sequence) and not isinstance(
        estimators_or_space, (str, bytes)
    ):
        given = list(estimators_or_space)
        if given and all(isinstance(f, Family) for f in given):
            families = given
        else:
            raise ConfigError(
                "compare takes a dict of estimators ({name: estimator} or {name: "
                "(estimator, grid)}), a space (or its file) whose choice names the "
                "families, or a list of Family objects; got a "
                f"{type(estimators_or_space).__name__} of other things."
            )
    else:
        families = families_from(
            estimators_or_space,
            classification=_is_classification(y),
            seed=DEFAULT_SEED if seed is None else seed,
        )
    if not families:
        raise ConfigError("No family to compare; give at least one estimator.")
    names = [f.name for f in families]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"Family name(s) {', '.join(map(repr, twice))} given twice; rename one.")
    return families


def _is_classification(y: Any) -> bool:
    from sklearn.utils.multiclass import type_of_target

    try:
        return type_of_target(y) in ("binary", "multiclass", "multilabel-indicator")
    except ValueError:
        return False


def _n_samples(X: Any, y: Any) -> int:
    from sklearn.utils.validation import _num_samples

    try:
        n, m = _num_samples(X), _num_samples(y)
    except TypeError as exc:
        raise ConfigError(f"X and y must be array-like (rows of samples): {exc}") from exc
    if n != m:
        raise ConfigError(f"X has {n} rows but y has {m} values; give one target per row.")
    return int(n)


def _check_families(families: Sequence[Family], scoring: Any) -> list[Any]:
    """One estimator per family (built with its fixed parameters), checked to be usable."""
    import cloudpickle

    estimators = []
    for family in families:
        params = _first_candidate(family)
        try:
            estimator = family.make(params)
        except Exception as exc:
            raise ConfigError(
                f"Family {family.name!r}: building its estimator with {params!r} failed: "
                f"{type(exc).__name__}: {exc}. Give an estimator, or a factory that takes "
                "the family's parameters as keywords and returns one."
            ) from exc
        kind = type(estimator).__name__
        if not callable(getattr(estimator, "fit", None)):
            raise ConfigError(
                f"Family {family.name!r}: {kind} has no fit method; compare takes "
                "scikit-learn-style estimators (fit, predict, score) or factories that "
                "return one."
            )
        if scoring is None and not callable(getattr(estimator, "score", None)):
            raise ConfigError(
                f"Family {family.name!r}: {kind} has no score method and no scoring was "
                "given; pass scoring='accuracy' (or another scorer), or add score()."
            )
        try:
            cloudpickle.dumps(family.make)
        except Exception as exc:
            raise ConfigError(
                f"Family {family.name!r}: its estimator factory cannot be sent to worker "
                f"processes ({type(exc).__name__}: {exc}); use a class or a function "
                "defined at module level."
            ) from exc
        estimators.append(estimator)
    return estimators


def _first_candidate(family: Family) -> dict[str, Any]:
    """Parameters of one of the family's candidates: its first grid point, or one drawn
    from its space (on a trial of a throwaway in-memory study, seeded)."""
    from paralela.comparing._candidates import family_grid, is_finite

    if is_finite(family.space):
        return family_grid(family.space)[0]
    from paralela.sweeping._study import _optuna

    optuna = _optuna()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return {**family.space.fixed(), **family.space.sample(study.ask())}


def _scoring_name(scoring: Any) -> str:
    if scoring is None:
        return "score"
    if isinstance(scoring, str):
        from sklearn.metrics import get_scorer

        try:
            get_scorer(scoring)
        except ValueError as exc:
            raise ConfigError(f"Unknown scoring {scoring!r}: {exc}") from exc
        return scoring
    if callable(scoring):
        return str(getattr(scoring, "__name__", None) or repr(scoring))
    raise ConfigError(
        f"scoring must be None, a scorer name such as 'accuracy', or a callable "
        f"scorer(estimator, X, y); got {scoring!r}."
    )


def _folds(
    cv: Any, X: Any, y: Any, families: Sequence[Family], estimators: Sequence[Any]
) -> list[tuple[Any, Any]]:
    """The folds, once, as GridSearchCV computes them (``check_cv``)."""
    from sklearn.base import is_classifier
    from sklearn.model_selection import check_cv

    kinds = [bool(is_classifier(e)) for e in estimators]
    if (cv is None or isinstance(cv, int)) and len(set(kinds)) > 1:
        classifiers = [f.name for f, k in zip(families, kinds, strict=True) if k]
        others = [f.name for f, k in zip(families, kinds, strict=True) if not k]
        raise ConfigError(
            f"cv={cv!r} splits classifiers' data stratified by class and other "
            f"estimators' not, and the families mix both (classifiers: "
            f"{', '.join(classifiers)}; others: {', '.join(others)}). Give cv as a "
            "splitter (StratifiedKFold(5) or KFold(5)) so that every family gets the "
            "same folds, or compare families of one kind."
        )
    try:
        splitter = check_cv(cv, y, classifier=kinds[0])
        folds = list(splitter.split(X, y))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"cv={cv!r} cannot split this data: {exc}. Give a number of folds (2 or "
            "more, at most the rows of the rarest class), a splitter, or a list of "
            "(train, test) index pairs."
        ) from exc
    if not folds:
        raise ConfigError(f"cv={cv!r} gives no folds; give 2 or more.")
    return folds


def _grid_mode(families: Sequence[Family], sampler: Any) -> bool:
    from paralela.comparing._candidates import is_finite

    finite = all(is_finite(f.space) for f in families)
    if sampler is None:
        return finite
    if isinstance(sampler, str) and sampler.lower() == "grid":
        if not finite:
            bad = [f.name for f in families if not is_finite(f.space)]
            raise ConfigError(
                f"sampler='grid' needs a list of values for every parameter, but family "
                f"{bad[0]!r} has a continuous one; give it values (or a step), or use "
                "sampler='tpe' with n_trials."
            )
        return True
    return False


def check_budget(n_trials: int | None, time_budget: float | None, *, grid: bool) -> None:
    if n_trials is not None and (
        isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1
    ):
        raise ConfigError(f"n_trials must be a positive integer, got {n_trials!r}.")
    if time_budget is not None and (
        isinstance(time_budget, bool)
        or not isinstance(time_budget, (int, float))
        or not time_budget > 0
    ):
        raise ConfigError(f"time_budget must be a positive number of seconds, got {time_budget!r}.")
    if not grid and n_trials is None and time_budget is None:
        raise ConfigError(
            "Sampling candidates (continuous parameters, or a sampler) needs a budget: "
            "give n_trials or time_budget."
        )


def _pruning(pruner: Any, halving: bool) -> tuple[bool, Any]:
    """(halving?, the Optuna pruner or None)."""
    if pruner is None or pruner is False:
        return halving, None
    name = "median" if pruner is True else pruner
    if isinstance(name, str):
        key = name.lower().replace("-", "_")
        if key in ("none", "nop"):
            return halving, None
        if key in ("halving", "successive_halving", "sha"):
            return True, None
        if halving:
            raise ConfigError(
                f"halving=True and pruner={pruner!r} both stop candidates; choose one."
            )
        from paralela.sweeping._study import _optuna, make_pruner

        optuna = _optuna()
        if key == "median":
            return False, optuna.pruners.MedianPruner(
                n_startup_trials=MEDIAN_STARTUP, n_warmup_steps=0
            )
        return False, make_pruner(name)
    if halving:
        raise ConfigError("halving=True and a pruner both stop candidates; choose one.")
    return False, pruner


def _study(
    root: Path, sampler: Any, seed: int | None, pruner: Any, *, grid: bool, notes: list[str]
) -> tuple[Any, Any]:
    from optuna.trial import TrialState

    from paralela.sweeping._study import (
        _optuna,
        choose_storage,
        make_sampler,
        open_storage,
        recover_interrupted,
    )

    optuna = _optuna()
    if grid or sampler is None:
        sampler_obj = make_sampler("random" if grid else "tpe", seed=seed, grid=None)
    elif isinstance(sampler, str):
        sampler_obj = make_sampler(sampler, seed=seed, grid=None)
    else:
        sampler_obj = sampler
    choice = choose_storage(root, None)
    if choice.note:
        notes.append(choice.note)
    database = open_storage(choice.spec, wal=True)
    study = optuna.create_study(
        study_name="compare",
        storage=database,
        sampler=sampler_obj,
        pruner=pruner or optuna.pruners.NopPruner(),
        direction="maximize",
        load_if_exists=True,
    )
    if grid:  # a dead driver's trials: failed; their candidates come from the grid again
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    else:  # failed, and their parameters asked again first
        recover_interrupted(study)
    return study, database


# -- results -----------------------------------------------------------------------------


def _identity(
    families: Sequence[Family],
    estimators: Sequence[Any],
    X: Any,
    y: Any,
    folds: Sequence[tuple[Any, Any]],
    scoring: str,
) -> dict[str, Any]:
    """What makes two comparisons the same one (see ``_store.check_identity``)."""
    from paralela.comparing._store import data_digest, folds_digest

    return {
        "data": data_digest(X, y),
        "families": [
            {
                "name": f.name,
                "space": f.space.to_dict(),
                "estimator": f"{type(e).__module__}.{type(e).__qualname__}",
            }
            for f, e in zip(families, estimators, strict=True)
        ],
        "folds": {"n": len(folds), "sha256": folds_digest(folds)},
        "scoring": scoring,
    }


def _result(
    candidates: Sequence[Candidate],
    *,
    refit: Callable[[CandidateRecord], Any] | None,
    started: float,
    **fields: Any,
) -> CompareResult:
    """The ended candidates as a result; the best one refit with ``refit`` if given;
    ``wall_seconds`` from ``started`` (``time.time()``) to the end of the refit."""
    import dataclasses

    from paralela.comparing._results import CompareResult

    records = sorted((_record(c) for c in candidates if c.state != "RUNNING"), key=_number)
    result = CompareResult(
        candidates=records, best=None, best_estimator=None, wall_seconds=0.0, **fields
    )
    board = result.leaderboard()
    best = board[0] if board and board[0].state == "COMPLETE" else None
    estimator = refit(best) if best is not None and refit is not None else None
    return dataclasses.replace(
        result, best=best, best_estimator=estimator, wall_seconds=time.time() - started
    )


def _number(record: CandidateRecord) -> int:
    return record.number


def _record(candidate: Candidate) -> CandidateRecord:
    import numpy as np

    from paralela.comparing._results import CandidateRecord

    scores = [candidate.scores.get(f) for f in range(candidate.n_folds)]
    done = [s for s in scores if s is not None]
    fits = list(candidate.fit_seconds.values())
    return CandidateRecord(
        number=candidate.number,
        family=candidate.family,
        params=dict(candidate.params),
        fold_scores=scores,
        mean=float(np.mean(done)) if done else None,
        std=float(np.std(done)) if done else None,
        fit_seconds=float(np.mean(fits)) if fits else 0.0,
        state=candidate.state,  # type: ignore[arg-type]
        error=candidate.error,
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
            call(_record(candidate))

        return forward
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None

    def show(candidate: Candidate) -> None:
        record = _record(candidate)
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
