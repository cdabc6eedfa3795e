"""What a comparison returns and writes: candidates, leaderboards, the best model.

Files in the run directory: ``compare.json`` (every candidate), ``leaderboard.csv``
(best first), ``best.json`` (the best candidate) and ``best.pkl`` (the best candidate
refit on all the data, when refit).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import pickle
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from paralela._files import atomic_write
from paralela.comparing._store import jsonable
from paralela.errors import ParalelaError

if TYPE_CHECKING:
    from paralela.comparing._candidates import Candidate

__all__ = [
    "CandidateRecord",
    "CompareError",
    "CompareResult",
    "check_completed",
    "last_line",
    "record_of",
    "result_of",
    "write_results",
]

State = Literal["COMPLETE", "PRUNED", "FAIL"]
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")  # one number in a warning's message


@dataclass(frozen=True)
class CandidateRecord:
    """One candidate: a family and its parameters, scored on the folds it ran.

    Attributes:
        number: its number in the comparison (grid order for a grid).
        family: the family's name.
        params: its parameters, as the family's ``make`` takes them.
        fold_scores: one score per fold, ``None`` for a fold not run (pruned, failed).
        mean, std: over the folds run (``std`` as numpy's, ddof 0, as scikit-learn's
            ``std_test_score``); ``None`` when no fold finished.
        fit_seconds: mean fit time per fold run.
        state: ``"COMPLETE"`` (every fold), ``"PRUNED"`` (stopped early by the pruner
            or a halving round), ``"FAIL"`` (a fold raised: ``error`` says what).
        error: the error of a failed candidate.
        warnings: the warnings its folds raised, ``{"category", "message", "count"}``
            for each distinct one (``ConvergenceWarning``: raise ``max_iter``).
    """

    number: int
    family: str
    params: dict[str, Any]
    fold_scores: list[float | None]
    mean: float | None
    std: float | None
    fit_seconds: float
    state: State
    error: str | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def folds_run(self) -> int:
        """How many folds finished (fewer than ``len(fold_scores)`` when pruned or failed)."""
        return sum(score is not None for score in self.fold_scores)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))  # type: ignore[no-any-return]


def _rank_key(record: CandidateRecord) -> tuple[int, float, int]:
    order = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2}[record.state]
    mean = record.mean if record.mean is not None and not math.isnan(record.mean) else -math.inf
    return (order, -mean, record.number)


@dataclass(frozen=True)
class CompareResult:
    """The outcome of :func:`paralela.compare`.

    Attributes:
        candidates: every candidate, by number.
        best: the complete candidate with the highest mean score (ties: the lower
            number, as ``GridSearchCV`` does); ``None`` when no candidate completed.
        best_estimator: ``best`` refit on all the data, or ``None`` (``refit=False``).
        run_dir: the run directory (resume from it; the files above are there).
        wall_seconds: wall time of this call.
        scoring: the scoring's name (``"score"``: the estimators' own ``score``).
        n_folds: folds per candidate.
        slots: tasks run at once.
    """

    candidates: list[CandidateRecord]
    best: CandidateRecord | None
    best_estimator: Any
    run_dir: Path
    wall_seconds: float
    scoring: str
    n_folds: int = 0
    slots: int = 0
    notes: list[str] = field(default_factory=list)

    def leaderboard(self, family: str | None = None) -> list[CandidateRecord]:
        """Candidates best first (complete, then pruned, then failed), of one family or all."""
        chosen = [c for c in self.candidates if family is None or c.family == family]
        return sorted(chosen, key=_rank_key)

    def families(self) -> dict[str, CandidateRecord]:
        """The best candidate of each family, in the order the families were given."""
        names = dict.fromkeys(c.family for c in sorted(self.candidates, key=lambda c: c.number))
        return {name: self.leaderboard(name)[0] for name in names}

    def warnings(self) -> list[dict[str, Any]]:
        """Each distinct warning the candidates raised, once: ``{"category", "message",
        "count", "candidates"}`` (the numbers of the candidates that raised it), the most
        frequent first. Messages that differ only in their numbers are one warning
        (``failed to converge after 3 iterations`` and ``after 4``), shown with the first
        candidate's message. Each candidate's own are in its ``warnings`` (and
        compare.json)."""
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for record in sorted(self.candidates, key=_number):
            for w in record.warnings:
                entry = seen.setdefault(
                    (w["category"], _NUMBER.sub("N", w["message"])),
                    {"category": w["category"], "message": w["message"], "count": 0,
                     "candidates": []},
                )  # fmt: skip
                entry["count"] += w["count"]
                entry["candidates"].append(record.number)
        return sorted(seen.values(), key=lambda e: -e["count"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "scoring": self.scoring,
            "greater_is_better": True,
            "cv": self.n_folds,
            "candidates": [c.to_dict() for c in sorted(self.candidates, key=lambda c: c.number)],
            "best": None if self.best is None else self.best.number,
            "wall_seconds": self.wall_seconds,
            "slots": self.slots,
            "notes": list(self.notes),
        }


class CompareError(ParalelaError):
    """No candidate of a comparison completed: every one failed (or failed and the rest
    were stopped). The message names how many failed and the first failure's error.

    Attributes:
        result: the :class:`CompareResult` written to the run directory (``best`` is
            ``None``; each failed candidate's ``error`` says what happened).
    """

    def __init__(self, message: str, result: CompareResult) -> None:
        super().__init__(message)
        self.result = result


def check_completed(result: CompareResult) -> None:
    """Raise :class:`CompareError` when candidates ran, some failed and none completed."""
    failed = [c for c in result.candidates if c.state == "FAIL"]
    if result.best is not None or not failed:
        return  # a best, or nothing failed (a time budget spent before any start)
    total = len(result.candidates)
    what = (
        f"every candidate failed ({len(failed)} of {total})"
        if len(failed) == total
        else f"no candidate completed ({len(failed)} of {total} failed, the others stopped)"
    )
    first = min(failed, key=_number)
    params = json.dumps(jsonable(first.params), sort_keys=True)
    raise CompareError(
        f"The comparison ended with no best model: {what}. The first, #{first.number} "
        f"{first.family} {params}: {last_line(first.error)}\nEvery candidate's error is in "
        f"{result.run_dir / 'compare.json'}. Fix the estimators or the data (fitting one "
        "candidate by hand shows the whole traceback), then run again in a new run "
        "directory: ended candidates are not run again in the same one.",
        result,
    )


def last_line(text: str | None) -> str:
    """The last line of an error (a traceback's is the exception), at most 300 chars."""
    line = str(text or "").strip().splitlines()[-1:] or ["(no error recorded)"]
    return line[0][:300]


def _csv_number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def write_results(result: CompareResult) -> None:
    """Write compare.json, leaderboard.csv, best.json and (with a refit) best.pkl."""
    root = result.run_dir
    atomic_write(root / "compare.json", json.dumps(result.to_dict(), indent=1).encode())
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    folds = [f"fold_{i}" for i in range(result.n_folds)]
    writer.writerow(
        ["rank", "number", "family", "params", "mean", "std", "fit_seconds", "state", *folds]
    )
    for rank, c in enumerate(result.leaderboard(), 1):
        writer.writerow(
            [
                rank,
                c.number,
                c.family,
                json.dumps(jsonable(c.params), sort_keys=True),
                _csv_number(c.mean),
                _csv_number(c.std),
                f"{c.fit_seconds:.6f}",
                c.state,
                *(_csv_number(s) for s in c.fold_scores),
            ]
        )
    atomic_write(root / "leaderboard.csv", out.getvalue().encode())
    best = result.best
    best_json = (
        None
        if best is None
        else {
            "number": best.number,
            "family": best.family,
            "params": jsonable(best.params),
            "mean": best.mean,
            "std": best.std,
            "scoring": result.scoring,
            "refit": result.best_estimator is not None,
        }
    )
    atomic_write(root / "best.json", json.dumps(best_json, indent=1).encode())
    if result.best_estimator is not None:
        try:
            data = pickle.dumps(result.best_estimator, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # e.g. made by a factory defined in __main__
            import cloudpickle

            data = cloudpickle.dumps(result.best_estimator, protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write(root / "best.pkl", data)


def result_of(
    candidates: Sequence[Candidate],
    *,
    refit: Callable[[CandidateRecord], Any] | None,
    started: float,
    **fields: Any,
) -> CompareResult:
    """The ended candidates as a result; the best one refit with ``refit`` if given;
    ``wall_seconds`` from ``started`` (``time.time()``) to the end of the refit."""
    records = sorted((record_of(c) for c in candidates if c.state != "RUNNING"), key=_number)
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


def record_of(candidate: Candidate) -> CandidateRecord:
    import numpy as np

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
        warnings=[
            {"category": category, "message": message, "count": count}
            for (category, message), count in candidate.warnings().items()
        ],
    )
