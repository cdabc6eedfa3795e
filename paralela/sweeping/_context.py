"""The function-trial side of ``paralela.report``: the worker's running trial.

The worker's trial runner installs a :class:`FunctionTrialContext` before it calls the
objective (:func:`set_function_context`); ``report`` in ``_report`` finds it there and
hands the value over: it goes to the study's storage, and the pruner may stop the trial
by raising :class:`TrialPruned`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

from paralela.errors import ParalelaError
from paralela.sweeping import _report

TYPE_CHECKING = False  # typing is not imported at run time (a worker's start)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "FunctionTrialContext",
    "NonFiniteReport",
    "TrialPruned",
    "non_finite",
    "set_function_context",
]


class TrialPruned(ParalelaError):
    """Raised by :func:`report` in a function trial that the pruner stopped.

    Let it propagate: the trial is recorded as pruned and its slot goes to the next one.
    """


def non_finite(values: Sequence[float], step: int | None = None) -> str | None:
    """Why these values cannot be a trial's result (a diverged loss), or ``None``.

    A NaN or infinite value fails its trial with this reason and the sweep goes on:
    Optuna refuses such a value, and a sampler given one would learn nothing from it.
    """
    bad = next((v for v in values if not math.isfinite(v)), None)
    if bad is None:
        return None
    if step is None:
        return f"the objective's value is {bad} (a diverged loss?): recorded as failed"
    return f"the value reported at step {step} is {bad} (a diverged loss?): the trial stopped"


class NonFiniteReport(Exception):
    """Raised by ``paralela.report`` in a function trial given NaN or an infinity."""


class FunctionTrialContext:
    """The running function trial of this worker (set by the trial runner)."""

    def __init__(
        self,
        open_study: Callable[[], Any],  # the worker's study, opened on the first report
        trial_id: int,
        number: int,
        params: dict[str, Any],
    ) -> None:
        self.open_study = open_study
        self.trial_id = trial_id
        self.number = number
        self.params = params
        self.last_value: float | None = None
        self.next_step = 0
        self._trial: Any = None

    @property
    def wrote(self) -> bool:
        """The trial wrote to the study (it reported)."""
        return self._trial is not None

    def report(self, value: float, step: int | None) -> None:
        import optuna

        if self._trial is None:
            self._trial = optuna.trial.Trial(self.open_study(), self.trial_id)
        step = self.next_step if step is None else step
        problem = non_finite([value], step)
        if problem is not None:
            raise NonFiniteReport(problem)
        self._trial.report(value, step)
        self.last_value = value
        self.next_step = step + 1
        if self._trial.should_prune():
            raise TrialPruned(f"trial {self.number} pruned at step {step} (value {value})")


def set_function_context(context: FunctionTrialContext | None) -> None:
    """Make ``context`` the running trial of this thread (``None``: no trial)."""
    if _report._local is None:
        _report._local = threading.local()
    _report._local.context = context
