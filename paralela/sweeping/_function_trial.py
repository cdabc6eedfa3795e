"""Runs a function trial as a command: ``python -m paralela.sweeping._function_trial
MODULE:FUNC`` (or ``path/to/file.py:FUNC``).

Used where a trial needs a process of its own on another machine (one Slurm job per
trial): the function is imported there, called with the trial's parameters
(``$PARALELA_TRIAL_PARAMS``), and its return value is reported as the trial's result
(the last report: it also shows as one more intermediate value, a step after the
function's own).
Values it reports itself (``paralela.report``) reach the driver as they are made; the
pruner's decision then reaches the trial as SIGTERM (its job is cancelled).
"""

from __future__ import annotations

import sys
import traceback

from paralela.sweeping._report import current_params, report

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m paralela.sweeping._function_trial MODULE:FUNC", file=sys.stderr)
        return 2
    from paralela.errors import ConfigError
    from paralela.loading import load_function

    try:
        objective = load_function(args[0])
    except ConfigError as exc:  # as the CLI says it: the message, the import's traceback
        if exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    result = objective(current_params())
    if isinstance(result, (list, tuple)) and len(result) == 1:
        result = result[0]
    if isinstance(result, (list, tuple)):
        print(
            f"{args[0]} returned {len(result)} values; a trial run as a command has one "
            "objective. Run several objectives as function trials on local slots.",
            file=sys.stderr,
        )
        return 2
    if result is not None:
        report(float(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
