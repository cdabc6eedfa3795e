"""Where a comparison's candidates come from: every grid point, or an Optuna sampler.

A candidate is a family and its parameters (branch-local: ``{"C": 1.0}`` for the
family ``logreg``). :class:`GridSource` enumerates each family's grid as scikit-learn's
``ParameterGrid`` does (parameter names sorted, the last one fastest), so candidate
numbers follow ``GridSearchCV``'s order for the same grids. :class:`SampledSource`
asks an Optuna study for each candidate, define-by-run over the conditional space
``model`` -> that family's parameters (flat names ``"model"``, ``"logreg.C"``).

Both hand out the candidates still to run in an order that keeps the slots busy: a
family not yet timed first, then the family whose folds take longest (the longest
tasks first leave the shortest for the end, where they fill the last gaps).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from paralela.comparing._grids import plain_params, points
from paralela.comparing._store import FoldLog, candidate_key
from paralela.errors import ConfigError

if TYPE_CHECKING:
    from paralela.comparing._families import Family
    from paralela.space import Space

__all__ = ["Candidate", "GridSource", "SampledSource", "family_grid", "is_finite"]

MODEL = "model"  # the choice of family in a sampled comparison's Optuna trials


class Candidate:
    """A candidate being run: its finished folds, its futures, its Optuna trial."""

    def __init__(self, number: int, family: str, params: dict[str, Any], n_folds: int) -> None:
        self.number = number
        self.family = family
        self.params = params
        self.key = candidate_key(family, params)
        self.n_folds = n_folds
        self.target = n_folds  # folds wanted now (fewer in early halving rounds)
        self.scores: dict[int, float] = {}
        self.fit_seconds: dict[int, float] = {}
        self.inflight: dict[int, Any] = {}  # fold -> Future
        self.state = "RUNNING"  # then COMPLETE, PRUNED or FAIL
        self.error: str | None = None
        # fold -> its (category, message, count) warnings (a fold restored twice: once)
        self.fold_warnings: dict[int, list[tuple[str, str, int]]] = {}
        self.trial: Any = None
        self.reported = 0  # folds reported to the trial, in order

    def mean(self, folds: int | None = None) -> float | None:
        """Mean score over the finished folds (only the first ``folds`` when given)."""
        values = [s for f, s in self.scores.items() if folds is None or f < folds]
        return sum(values) / len(values) if values else None

    def warned(self, fold: int, warnings: Sequence[Sequence[Any]]) -> None:
        """Keep fold ``fold``'s ``(category, message, count)`` warnings."""
        if warnings:
            self.fold_warnings[fold] = [(str(c), str(m), int(n)) for c, m, n in warnings]

    def warnings(self) -> dict[tuple[str, str], int]:
        """``(category, message)`` -> how many times the candidate's folds raised it."""
        counts: dict[tuple[str, str], int] = {}
        for warned in self.fold_warnings.values():
            for category, message, count in warned:
                counts[(category, message)] = counts.get((category, message), 0) + count
        return counts

    def __repr__(self) -> str:
        return f"Candidate({self.number}, {self.family!r}, {self.params!r}, {self.state})"


def is_finite(space: Space) -> bool:
    """Whether every parameter has a finite list of values (a grid can enumerate it)."""
    try:
        space.grid()
    except ConfigError:
        return False
    return True


def family_grid(space: Space) -> list[dict[str, Any]]:
    """Every grid point of one family, fixed values added: in ``ParameterGrid``'s order
    (each grid of a list in turn, names sorted, the last one fastest), or
    :meth:`Space.grid`'s for a family whose space has choices of its own."""
    return points(space)


class _Order:
    """Candidates waiting to run, handed out family by family, longest tasks first:
    each family's first candidate in turn (to time it), then the family whose tasks
    took longest so far (a family not timed yet counts as the mean of the others)."""

    def __init__(self, families: Sequence[str]) -> None:
        self.waiting: dict[str, deque[Candidate]] = {name: deque() for name in families}
        self.started: set[str] = set()

    def add(self, candidate: Candidate) -> None:
        self.waiting[candidate.family].append(candidate)

    def take(self, costs: Mapping[str, float]) -> Candidate | None:
        ready = [name for name, queue in self.waiting.items() if queue]
        if not ready:
            return None
        fresh = [name for name in ready if name not in self.started]
        if fresh:
            name = fresh[0]
        else:
            guess = sum(costs.values()) / len(costs) if costs else 0.0
            name = max(ready, key=lambda n: costs.get(n, guess))
        self.started.add(name)
        return self.waiting[name].popleft()


class GridSource:
    """Every grid point of every family (or ``n_trials`` of them, drawn with ``seed``)."""

    def __init__(
        self,
        families: Sequence[Family],
        n_folds: int,
        log: FoldLog,
        *,
        n_trials: int | None = None,
        seed: int | None = None,
    ) -> None:
        points = [(f.name, params) for f in families for params in family_grid(f.space)]
        if n_trials is not None and n_trials < len(points):
            chosen = sorted(random.Random(seed).sample(range(len(points)), n_trials))
            points = [points[i] for i in chosen]
        self.candidates = [
            Candidate(number, family, params, n_folds)
            for number, (family, params) in enumerate(points)
        ]
        self._order = _Order([f.name for f in families])
        for candidate in self.candidates:
            self._order.add(candidate)
        self.log = log

    def take(self, costs: Mapping[str, float]) -> Candidate | None:
        return self._order.take(costs)

    def take_all(self) -> list[Candidate]:
        out = []
        while (candidate := self._order.take({})) is not None:
            out.append(candidate)
        return out


def suggest(trial: Any, space: Space) -> tuple[str, dict[str, Any]]:
    """Sample a family and its parameters on ``trial``, define-by-run over the
    conditional space :func:`choice_space`: ``model``, then ``"<family>.<name>"`` (for
    a list of grids: the grid, then its parameters; the family's are returned plain)."""
    from paralela.space import branch_params

    flat = space.sample(trial)
    family = str(flat[MODEL])
    return family, plain_params(branch_params(flat, family))


def choice_space(families: Sequence[Family]) -> Space:
    """One choice, ``model``, whose options are the families and their spaces."""
    from paralela.space import Choice, Space

    return Space((Choice(MODEL, {f.name: f.space for f in families}),))


class SampledSource:
    """Candidates asked of an Optuna study, ``n_trials`` in all (ended ones count)."""

    def __init__(
        self,
        families: Sequence[Family],
        n_folds: int,
        log: FoldLog,
        study: Any,
        *,
        n_trials: int | None,
    ) -> None:
        self.space = choice_space(families)
        self.n_folds = n_folds
        self.log = log
        self.study = study
        self.n_trials = n_trials
        self.candidates: list[Candidate] = []
        self._keys: dict[str, Candidate] = {}
        for logged in sorted(log.candidates.values(), key=lambda c: c.number):
            if logged.state is not None:  # ended in an earlier run
                self._add(Candidate(logged.number, logged.family, logged.params, n_folds))
        self._next_number = 1 + max((c.number for c in log.candidates.values()), default=-1)

    def _add(self, candidate: Candidate) -> Candidate:
        self.candidates.append(candidate)
        self._keys[candidate.key] = candidate
        return candidate

    def take(self, costs: Mapping[str, float]) -> Candidate | None:
        from optuna.trial import TrialState

        # A sampler may propose a candidate already run: its trial gets that outcome
        # (or fails, when it still runs) and counts; a few in a row end the search.
        for _ in range(100):
            if self.n_trials is not None and len(self.candidates) >= self.n_trials:
                return None
            trial = self.study.ask()
            family, params = suggest(trial, self.space)
            key = candidate_key(family, params)
            known = self._keys.get(key)
            if known is None:
                logged = self.log.candidates.get(key)
                number = logged.number if logged is not None else self._next_number
                self._next_number = max(self._next_number, number + 1)
                candidate = self._add(Candidate(number, family, params, self.n_folds))
                candidate.trial = trial
                return candidate
            mean = known.mean()
            if known.state == "COMPLETE" and mean is not None:
                self.study.tell(trial, mean)
            else:
                trial.set_user_attr("paralela:duplicate_of", known.number)
                self.study.tell(trial, state=TrialState.FAIL)
        return None

    def take_all(self) -> list[Candidate]:
        out = []
        while (candidate := self.take({})) is not None:
            out.append(candidate)
        return out
