"""Inside a trial: ``paralela.report(value, step)`` and the parameters of the running trial.

A trial finds its sweep through its environment, so the same call works in a function
trial (run in a pinned worker process) and in a command trial (any program):

- function trials write intermediate values straight to the study's storage (the worker
  opened it once) and raise :class:`TrialPruned` when the pruner says so, as Optuna does;
- command trials send each value as one JSON line down a pipe (``PARALELA_REPORT_FD``)
  to the driver, which records it, asks the pruner and stops the process if needed. A
  command trial therefore never imports Optuna: its start-up stays that of Python.

Outside a sweep, ``report`` prints the value and records nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from paralela.errors import ParalelaError

__all__ = [
    "ENV_PARAMS",
    "ENV_REPORT_FD",
    "ENV_TRIAL_NUMBER",
    "FunctionTrialContext",
    "TrialPruned",
    "current_params",
    "report",
]

ENV_PARAMS = "PARALELA_TRIAL_PARAMS"
ENV_TRIAL_NUMBER = "PARALELA_TRIAL_NUMBER"
ENV_REPORT_FD = "PARALELA_REPORT_FD"


class TrialPruned(ParalelaError):
    """Raised by :func:`report` in a function trial that the pruner stopped.

    Let it propagate: the trial is recorded as pruned and its slot goes to the next one.
    """


@dataclass
class FunctionTrialContext:
    """The running function trial of this worker (set by the trial runner)."""

    open_study: Callable[[], Any]  # the worker's study, opened on the first report
    trial_id: int
    number: int
    params: dict[str, Any]
    last_value: float | None = None
    next_step: int = 0
    _trial: Any = field(default=None, repr=False)

    def report(self, value: float, step: int | None) -> None:
        import optuna

        if self._trial is None:
            self._trial = optuna.trial.Trial(self.open_study(), self.trial_id)
        step = self.next_step if step is None else step
        self._trial.report(value, step)
        self.last_value = value
        self.next_step = step + 1
        if self._trial.should_prune():
            raise TrialPruned(f"trial {self.number} pruned at step {step} (value {value})")


_local = threading.local()


def set_function_context(context: FunctionTrialContext | None) -> None:
    _local.context = context


def function_context() -> FunctionTrialContext | None:
    context: FunctionTrialContext | None = getattr(_local, "context", None)
    return context


_command_step = 0


def report(value: float, step: int | None = None) -> None:
    """Record an intermediate (or the final) value of the running trial.

    Args:
        value: the objective's value at this point (e.g. validation loss after an
            epoch). The last value reported is the trial's result unless the function
            returns one.
        step: the step (epoch, iteration) it belongs to; by default one more than the
            previous report's.

    Raises:
        TrialPruned: in a function trial, when the pruner decides to stop it.
        ValueError: ``value`` is not a number.
    """
    global _command_step
    number = float(value)  # refuses strings and None with a clear TypeError/ValueError
    context = function_context()
    if context is not None:
        context.report(number, step)
        return
    fd = os.environ.get(ENV_REPORT_FD)
    if fd is None:
        where = f" (step {step})" if step is not None else ""
        print(
            f"paralela.report: {number}{where} (not inside a sweep: not recorded)", file=sys.stderr
        )
        return
    this_step = _command_step if step is None else step
    _command_step = this_step + 1
    line = json.dumps({"value": number, "step": this_step}) + "\n"
    os.write(int(fd), line.encode())


def current_params() -> dict[str, Any]:
    """The parameters of the running trial (also in ``$PARALELA_TRIAL_PARAMS`` as JSON).

    Raises:
        RuntimeError: not inside a sweep trial.
    """
    context = function_context()
    if context is not None:
        return dict(context.params)
    raw = os.environ.get(ENV_PARAMS)
    if raw is None:
        raise RuntimeError("current_params() is only available inside a paralela sweep trial.")
    params: dict[str, Any] = json.loads(raw)
    return params
