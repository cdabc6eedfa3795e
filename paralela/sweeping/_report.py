"""Inside a trial: ``paralela.report(value, step)`` and the parameters of the running trial.

A trial finds its sweep through its environment, so the same call works in a function
trial (run in a pinned worker process) and in a command trial (any program):

- function trials write intermediate values straight to the study's storage (the worker
  opened it once) and raise ``paralela.TrialPruned`` when the pruner says so, as Optuna
  does (see ``_context.FunctionTrialContext``, which the worker installs here and which
  defines ``TrialPruned``);
- command trials send each value as one JSON line down a pipe (``PARALELA_REPORT_FD``)
  to the driver (or append it to a file, ``PARALELA_REPORT_FILE``, when the trial runs
  as a Slurm job of its own on another node), which records it, asks the pruner and
  stops the process if needed. A command trial therefore never imports Optuna, nor
  anything but ``os`` and ``sys`` here: this module is on every command trial's path
  from its last line to its exit (it used to import ``dataclasses``, ``json``,
  ``threading`` and ``paralela.errors``: 17 ms of each trial on the benchmark's VM,
  with its 2 slots idle meanwhile).

Outside a sweep, ``report`` prints the value and records nothing.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time (a worker's start)
if TYPE_CHECKING:
    from typing import Any

    from paralela.sweeping._context import FunctionTrialContext

__all__ = [
    "ENV_PARAMS",
    "ENV_REPORT_FD",
    "ENV_REPORT_FILE",
    "ENV_TRIAL_NUMBER",
    "current_params",
    "report",
]

ENV_PARAMS = "PARALELA_TRIAL_PARAMS"
ENV_TRIAL_NUMBER = "PARALELA_TRIAL_NUMBER"
ENV_REPORT_FD = "PARALELA_REPORT_FD"
ENV_REPORT_FILE = "PARALELA_REPORT_FILE"

# The running function trial of this worker thread, installed by the trial runner
# (``_context.set_function_context``); ``None`` in command trials and outside sweeps.
_local: Any = None


def function_context() -> FunctionTrialContext | None:
    if _local is None:
        return None
    context: FunctionTrialContext | None = getattr(_local, "context", None)
    return context


_command_step = 0


def _json_number(number: float) -> str:
    """``number`` as ``json.dumps`` writes it (NaN and the infinities as JSON extensions)."""
    if number != number:
        return "NaN"
    if number in (float("inf"), float("-inf")):
        return "Infinity" if number > 0 else "-Infinity"
    return repr(number)


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
    path = os.environ.get(ENV_REPORT_FILE) if fd is None else None
    if fd is None and path is None:
        where = f" (step {step})" if step is not None else ""
        print(
            f"paralela.report: {number}{where} (not inside a sweep: not recorded)", file=sys.stderr
        )
        return
    this_step = _command_step if step is None else int(step)
    _command_step = this_step + 1
    line = f'{{"value": {_json_number(number)}, "step": {this_step}}}\n'
    if fd is not None:
        os.write(int(fd), line.encode())
        return
    assert path is not None
    # One write of one whole line with O_APPEND: the driver reads complete lines only.
    out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(out, line.encode())
    finally:
        os.close(out)


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
    import json

    params: dict[str, Any] = json.loads(raw)
    return params
