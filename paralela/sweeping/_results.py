"""What a sweep returns and leaves in its run directory: every trial, the best one,
a leaderboard, CSV/JSON exports and plots."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from paralela._files import atomic_write, json_text

__all__ = ["SweepResult", "TrialRecord", "last_error"]


@dataclass
class TrialRecord:
    """One trial as it ended (or as it runs, while the sweep goes on)."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING
    values: list[float] | None
    params: dict[str, Any]
    started: float | None = None
    finished: float | None = None
    slot: int | None = None
    devices: str | None = None
    exit_code: int | None = None
    log_path: str | None = None
    error: str | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    host: str | None = None  # the host of the trial's slot (timelines per host)

    @property
    def value(self) -> float | None:
        return self.values[0] if self.values else None

    @property
    def duration(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return self.finished - self.started

    def to_dict(self) -> dict[str, Any]:
        """Its fields, the value and the duration: plain data (JSON-ready), copied
        (as ``dataclasses.asdict``, without its deep copy of every field)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["values"] = None if self.values is None else list(self.values)
        data["params"] = copy.deepcopy(self.params)  # (a categorical may be a list)
        data["intermediate"] = {str(k): v for k, v in self.intermediate.items()}
        data["value"] = self.value
        data["duration"] = self.duration
        return data


@dataclass
class SweepResult:
    """The outcome of :func:`paralela.sweep`.

    Attributes:
        study_name, storage, run_dir: where the study lives (run again to continue it).
        directions: ``"minimize"``/``"maximize"`` per objective.
        trials: every trial of the study, in number order (earlier runs included).
        wall_seconds: this run's duration; ``slots``: how many trials ran at once.
        busy_fraction: share of slot time this run spent inside trials.
        notes: things the user should know (storage choice, recovered trials...).
    """

    study_name: str
    storage: str
    run_dir: Path
    directions: list[str]
    trials: list[TrialRecord]
    wall_seconds: float
    slots: int
    busy_fraction: float
    notes: list[str] = field(default_factory=list)

    def _sign(self) -> float:
        return -1.0 if self.directions[0] == "maximize" else 1.0

    @property
    def completed(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.state == "COMPLETE" and t.values]

    @property
    def failed(self) -> list[TrialRecord]:
        """The trials that failed (errors, diverged losses), in number order."""
        return [t for t in self.trials if t.state == "FAIL"]

    @property
    def all_failed(self) -> bool:
        """No trial completed or was pruned, and at least one failed: nothing to learn
        from; most often the command or the objective itself is broken."""
        return bool(self.failed) and not any(t.state in ("COMPLETE", "PRUNED") for t in self.trials)

    def failure_report(self, tail_lines: int = 15) -> str | None:
        """The first failed trial: its parameters, its error (the end of it) and its log."""
        if not self.failed:
            return None
        first = self.failed[0]
        error = (first.error or "no error text was recorded").strip().splitlines()
        shown = "\n".join("  " + line for line in error[-tail_lines:])
        log = f"\nIts log: {first.log_path}" if first.log_path else ""
        return f"trial #{first.number} ({json.dumps(first.params)}) failed:\n{shown}{log}"

    def leaderboard(self, n: int = 10) -> list[TrialRecord]:
        """The ``n`` best completed trials, best first (by the first objective)."""
        sign = self._sign()
        return sorted(
            self.completed, key=lambda t: math.inf if t.value is None else sign * t.value
        )[:n]

    def pareto_front(self) -> list[TrialRecord]:
        """The completed trials that no other completed trial dominates (as good in every
        objective and better in one), by the first objective, best first: Optuna's
        ``study.best_trials``. With one objective: the trials of the best value."""
        signs = [-1.0 if d == "maximize" else 1.0 for d in self.directions]
        scored = sorted(
            (
                ([s * v for s, v in zip(signs, t.values, strict=True)], t)
                for t in self.completed
                if t.values is not None and len(t.values) == len(signs)
            ),
            key=lambda pair: pair[0],
        )
        # In that order a trial can only be dominated by one before it, and then by one
        # of the front (domination is transitive): n x (front size) comparisons.
        front: list[tuple[list[float], TrialRecord]] = []
        for costs, trial in scored:
            if not any(
                kept != costs and all(k <= c for k, c in zip(kept, costs, strict=True))
                for kept, _ in front
            ):
                front.append((costs, trial))
        return [trial for _, trial in front]

    @property
    def best_trial(self) -> TrialRecord | None:
        board = self.leaderboard(1)
        return board[0] if board else None

    @property
    def best_params(self) -> dict[str, Any] | None:
        best = self.best_trial
        return None if best is None else best.params

    @property
    def best_value(self) -> float | None:
        best = self.best_trial
        return None if best is None else best.value

    def to_json(self, path: str | Path) -> Path:
        out = Path(path)
        data: dict[str, Any] = {
            "study_name": self.study_name,
            "storage": self.storage,
            "directions": self.directions,
            "best": None if self.best_trial is None else self.best_trial.to_dict(),
            "wall_seconds": self.wall_seconds,
            "slots": self.slots,
            "busy_fraction": self.busy_fraction,
            "notes": self.notes,
        }
        data["trials"] = [t.to_dict() for t in self.trials]
        text = json_text(data, default=str)  # a trial a line
        atomic_write(out, text.encode())  # never half a file
        return out

    def to_csv(self, path: str | Path) -> Path:
        out = Path(path)
        names = sorted({k for t in self.trials for k in t.params})
        with io.StringIO(newline="") as f:
            writer = csv.writer(f)
            writer.writerow(
                ["number", "state", "value", *names, "duration", "slot", "devices", "exit_code"]
            )
            for t in self.trials:
                writer.writerow(
                    [
                        t.number,
                        t.state,
                        "" if t.value is None else t.value,
                        *(t.params.get(k, "") for k in names),
                        "" if t.duration is None else round(t.duration, 4),
                        "" if t.slot is None else t.slot,
                        t.devices or "",
                        "" if t.exit_code is None else t.exit_code,
                    ]
                )
            atomic_write(out, f.getvalue().encode())  # never half a file
        return out

    def summary(self) -> str:
        best = self.best_trial
        states: dict[str, int] = {}
        for t in self.trials:
            states[t.state] = states.get(t.state, 0) + 1
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
        line = (
            f"{len(self.trials)} trials ({counts}) on {self.slots} slots in "
            f"{self.wall_seconds:.1f} s, slots {self.busy_fraction:.0%} busy"
        )
        if len(self.directions) > 1:  # no single best: the trade-offs
            front = len(self.pareto_front())
            if front:
                line += f"; Pareto front: {front} trial{'s' if front > 1 else ''}"
        elif best is not None:
            line += f"; best #{best.number}: {best.value:.6g} with {best.params}"
        return line


def last_error(records: list[TrialRecord], chars: int) -> str:
    """The end (``chars`` characters) of the last failed trial's error, for a message."""
    for record in reversed(records):
        if record.state == "FAIL" and record.error:
            return record.error.strip()[-chars:]
    return "(no error text)"
