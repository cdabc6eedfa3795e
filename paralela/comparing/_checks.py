"""What ``compare`` checks before any task runs: families, data, scoring, folds, budget
and pruning. Every problem is a :class:`~paralela.errors.ConfigError` that says what was
wrong and what to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError

if TYPE_CHECKING:
    from paralela.comparing._families import Family

__all__ = [
    "check_budget",
    "check_families",
    "check_samples",
    "check_target",
    "families_given",
    "first_candidate",
    "grid_mode",
    "make_folds",
    "pruning",
    "scoring_name",
]

SHOWN_ROWS = 5  # rows named when several targets are missing
# The median pruner's settings for folds: a candidate is compared with the complete
# ones from its first fold on (folds are few; waiting a step would cost a whole fold),
# once this many candidates are complete.
MEDIAN_STARTUP = 5


def families_given(estimators_or_space: Any, y: Any, seed: int | None) -> list[Family]:
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
            classification=is_classification(y),
            seed=DEFAULT_SEED if seed is None else seed,
        )
    if not families:
        raise ConfigError("No family to compare; give at least one estimator.")
    names = [f.name for f in families]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"Family name(s) {', '.join(map(repr, twice))} given twice; rename one.")
    return families


def is_classification(y: Any) -> bool:
    """Whether an alias means a classifier: the command line's rule for a target column
    (:func:`paralela.comparing._data.is_classification`: labels, or whole numbers with at
    most 20 distinct values), so that a whole-number regression target (counts, prices)
    is not taken for classes; a 2-D target by scikit-learn's ``type_of_target``."""
    import numpy as np

    from paralela.comparing import _data

    values = np.asarray(y)
    if values.ndim == 1:
        return _data.is_classification(values)
    from sklearn.utils.multiclass import type_of_target

    try:
        return type_of_target(y) in ("binary", "multiclass", "multilabel-indicator")
    except ValueError:
        return False


def check_samples(X: Any, y: Any) -> int:
    from sklearn.utils.validation import _num_samples

    try:
        n, m = _num_samples(X), _num_samples(y)
    except TypeError as exc:
        raise ConfigError(f"X and y must be array-like (rows of samples): {exc}") from exc
    if n != m:
        raise ConfigError(f"X has {n} rows but y has {m} values; give one target per row.")
    return int(n)


def check_target(y: Any, estimators: Sequence[Any]) -> None:
    """A target with a value in every row and at least two distinct ones (1-D ``y``;
    a 2-D, multi-output target is left to the estimators)."""
    import numpy as np
    from sklearn.base import is_classifier

    values = np.asarray(y)  # None or pandas.NA among the values: an object array
    if values.ndim != 1:
        return
    if values.dtype.kind in "fc":
        missing = [int(i) for i in np.flatnonzero(np.isnan(values))]
    elif values.dtype.kind == "O":
        missing = [i for i, v in enumerate(values) if _is_missing(v)]
    else:  # whole numbers, booleans, strings: nothing can be missing
        missing = []
    if missing:
        rows = [str(i) for i in missing[:SHOWN_ROWS]]
        if len(missing) > SHOWN_ROWS:
            rows.append(f"{len(missing) - SHOWN_ROWS} more")
        where = rows[0] if len(rows) == 1 else f"{', '.join(rows[:-1])} and {rows[-1]}"
        raise ConfigError(
            f"y is missing (None or NaN) at row{'s' if len(missing) > 1 else ''} {where} "
            "(positions from 0): every row needs a class or a value to learn from. Drop "
            "those rows from X and y, or fill them in."
        )
    if not len(values):
        return
    first = values[0]
    if values.dtype.kind == "O":
        one = not any(v != first for v in values)
    else:
        one = bool(np.all(values == first))
    if one:
        what = "one class" if any(is_classifier(e) for e in estimators) else "one value"
        raise ConfigError(
            f"y has {what} ({_plain(first)!r}) in all {len(values)} rows: there is nothing to "
            "learn, and every candidate would score the same. A comparison needs at least "
            "two classes (or, for regression, two distinct values); check that y is the "
            "column you meant."
        )


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (np.int64(2) -> 2), for messages."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN, of any float type
    except (TypeError, ValueError):  # pandas.NA: its comparison is NA, which has no truth
        return True


def check_families(families: Sequence[Family], scoring: Any) -> list[Any]:
    """One estimator per family (built with its fixed parameters), checked to be usable."""
    import cloudpickle

    estimators = []
    for family in families:
        params = first_candidate(family)
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


def first_candidate(family: Family) -> dict[str, Any]:
    """Parameters of one of the family's candidates: its first grid point, or one drawn
    from its space (on a trial of a throwaway in-memory study, seeded)."""
    from paralela.comparing._candidates import family_grid, is_finite
    from paralela.comparing._grids import plain_params

    if is_finite(family.space):
        return family_grid(family.space)[0]
    from paralela.studies import import_optuna

    optuna = import_optuna()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return plain_params({**family.space.fixed(), **family.space.sample(study.ask())})


def scoring_name(scoring: Any) -> str:
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


def make_folds(
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


def grid_mode(families: Sequence[Family], sampler: Any) -> bool:
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


def pruning(pruner: Any, halving: bool) -> tuple[bool, Any]:
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
        from paralela.studies import import_optuna, make_pruner

        optuna = import_optuna()
        if key == "median":
            return False, optuna.pruners.MedianPruner(
                n_startup_trials=MEDIAN_STARTUP, n_warmup_steps=0
            )
        return False, make_pruner(name)
    if halving:
        raise ConfigError("halving=True and a pruner both stop candidates; choose one.")
    return False, pruner
