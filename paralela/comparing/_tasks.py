"""The task of a comparison: fit one candidate on one fold and score it, in a worker.

::

    driver ── Broadcast(SharedData: X, y, folds, scoring, makers) ──> each worker, once
    driver ── run_fold(shared, family, params, fold) ────────────────> any worker
                 make(params) -> estimator
                 threadpool_limits(slot's threads): fit(X[train]), score(X[test])
             <── FoldOutcome (score or error text, seconds, threads seen, and the
                 warnings raised, each distinct one once with a count: not printed by
                 the worker, the driver reports them once for the whole comparison)

The data set's arrays are written once into a shared memory block that each worker maps
read-only (the processes backend's broadcasts; one copy for all the workers), and the
rest of it is unpickled once per worker, however many (candidate, fold) tasks run there:
:class:`SharedData` counts its own unpickling in each worker (``data_loads``), so a run
can show that it was not sent again.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FoldOutcome", "SharedData", "run_fold"]

# How many times each SharedData (by token) was unpickled in this process.
_LOADS: dict[str, int] = {}


class SharedData:
    """What every task of a comparison needs, sent to each worker once.

    Attributes:
        X, y: the data set.
        folds: ``(train indices, test indices)`` per fold, as the driver computed them.
        scoring: ``None`` (the estimator's ``score``), a scorer name, or a callable
            ``scorer(estimator, X, y)``.
        makers: family name -> ``make(params)``, a new unfitted estimator.
    """

    def __init__(
        self,
        X: Any,
        y: Any,
        folds: Sequence[tuple[Any, Any]],
        scoring: str | Callable[..., float] | None,
        makers: Mapping[str, Callable[[dict[str, Any]], Any]],
    ) -> None:
        self.X = X
        self.y = y
        self.folds = list(folds)
        self.scoring = scoring
        self.makers = dict(makers)
        self.token = uuid.uuid4().hex

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _LOADS[self.token] = _LOADS.get(self.token, 0) + 1

    @property
    def loads(self) -> int:
        """How many times this data set was unpickled in this process (0 in the driver)."""
        return _LOADS.get(self.token, 0)


@dataclass(frozen=True)
class FoldOutcome:
    """One (candidate, fold) pair's result.

    Attributes:
        score: the test fold's score (greater is better); ``None`` when ``error``.
        error: ``"ExceptionType: message"`` when building, fitting or scoring raised.
        traceback: the formatted traceback with ``error``.
        fit_seconds, score_seconds: wall time of ``fit`` and of scoring.
        threads: the most threads any BLAS/OpenMP pool had inside the task's limit, as
            threadpoolctl reports it (``None``: no pool loaded).
        slot_threads: the thread limit the task ran under (its slot's thread count).
        pid: the worker process.
        data_loads: how many times the worker unpickled the data set (1: sent once).
        warnings: the warnings raised while building, fitting and scoring (a
            ``ConvergenceWarning``): ``(category, message, count)`` for each distinct
            one, as the warning filters let them through (once per place by default).
    """

    score: float | None
    error: str | None = None
    traceback: str | None = None
    fit_seconds: float = 0.0
    score_seconds: float = 0.0
    threads: int | None = None
    slot_threads: int = 1
    pid: int = field(default_factory=os.getpid)
    data_loads: int = 0
    warnings: tuple[tuple[str, str, int], ...] = ()


def slot_threads() -> int:
    """The thread count of the slot this worker serves (its ``OMP_NUM_THREADS``)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def run_fold(shared: SharedData, family: str, params: dict[str, Any], fold: int) -> FoldOutcome:
    """Build the candidate, fit it on fold ``fold``'s training part and score it on its
    test part, with BLAS/OpenMP pools limited to the slot's threads.

    Never raises for the user's errors: an exception while building, fitting or scoring
    comes back as ``FoldOutcome(score=None, error=...)`` (the candidate fails, the
    comparison goes on). A score that is not a real number is an error too. Warnings are
    recorded in the outcome instead of printed (see :attr:`FoldOutcome.warnings`).
    """
    with warnings.catch_warnings(record=True) as caught:
        outcome = _fit_and_score(shared, family, params, fold)
    if not caught:
        return outcome
    seen = Counter((w.category.__name__, str(w.message).strip()) for w in caught)
    distinct = tuple((category, message, n) for (category, message), n in seen.items())
    return dataclasses.replace(outcome, warnings=distinct)


def _fit_and_score(
    shared: SharedData, family: str, params: dict[str, Any], fold: int
) -> FoldOutcome:
    from sklearn.metrics import check_scoring
    from sklearn.utils.metaestimators import _safe_split
    from threadpoolctl import threadpool_info, threadpool_limits  # type: ignore[import-untyped]

    limit = slot_threads()
    fit_seconds = score_seconds = 0.0
    threads: int | None = None
    try:
        estimator = shared.makers[family](dict(params))
        train, test = shared.folds[fold]
        # As GridSearchCV's _fit_and_score: pairwise estimators get the kernel's blocks.
        X_train, y_train = _safe_split(estimator, shared.X, shared.y, train)
        X_test, y_test = _safe_split(estimator, shared.X, shared.y, test, train)
        scorer = check_scoring(estimator, scoring=shared.scoring)
        with threadpool_limits(limits=limit):
            t0 = time.perf_counter()
            estimator.fit(X_train, y_train)
            t1 = time.perf_counter()
            score = scorer(estimator, X_test, y_test)
            t2 = time.perf_counter()
            # Pools loaded during fit (first use of a library) count too.
            threads = max((p["num_threads"] for p in threadpool_info()), default=None)
        fit_seconds, score_seconds = t1 - t0, t2 - t1
        value = float(score)
        if value != value:  # NaN
            raise ValueError(f"the scorer returned {score!r}, not a number")
    except Exception as exc:
        return FoldOutcome(
            score=None,
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            fit_seconds=fit_seconds,
            score_seconds=score_seconds,
            threads=threads,
            slot_threads=limit,
            data_loads=shared.loads,
        )
    return FoldOutcome(
        score=value,
        fit_seconds=fit_seconds,
        score_seconds=score_seconds,
        threads=threads,
        slot_threads=limit,
        data_loads=shared.loads,
    )
