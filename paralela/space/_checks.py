"""The checks every parameter of a space goes through, and the error they raise.

:class:`_Invalid` is a :class:`~paralela.errors.ConfigError` that knows the parameter
(and, inside a :class:`~paralela.space.Choice`, the path to it); the file readers in
:mod:`paralela.space._forms` and :mod:`paralela.space._files` add the file and line.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from paralela.errors import ConfigError, MissingExtraError

# Every grid point becomes a trial. A hundred thousand trials is already days of work
# for small models; a bigger product is almost always a step or a range typed wrong.
MAX_GRID_POINTS = 100_000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_CSV_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_SCALARS = (type(None), bool, int, float, str)  # what Optuna stores as a categorical choice
_RESERVED = ("params", "configurations")  # top-level keys of the wrapped file form
_EXTENSIONS = (".yaml", ".yml", ".toml", ".csv")


class _Invalid(ConfigError):
    """A parameter is not valid; :func:`sweep_from_dict` adds the file and line.

    ``path`` leads from ``name`` to the parameter at fault inside a :class:`Choice`:
    ``parameter 'model', option 'forest', parameter 'max_depth'``.
    """

    def __init__(self, name: object, problem: str, path: tuple[tuple[str, str], ...] = ()) -> None:
        self.name = name
        self.problem = problem
        self.path = path  # ((kind, key), ...): (("option", "forest"), ("parameter", "C"))
        super().__init__(f"Parameter {name!r}{self.trail}: {problem}")

    @property
    def trail(self) -> str:
        return "".join(f", {kind} {key!r}" for kind, key in self.path)

    def inside(self, choice: str, option: str) -> _Invalid:
        """This error, seen from the choice ``choice`` whose option ``option`` holds it."""
        path = (("option", option), ("parameter", str(self.name)), *self.path)
        return _Invalid(choice, self.problem, path)


def _optuna_distributions() -> Any:
    try:
        from optuna import distributions
    except ImportError:
        raise MissingExtraError("optuna", "sweep", "A sweep's search space") from None
    return distributions


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _Invalid(
            name,
            "is not a valid parameter name; names are used as {name} placeholders in "
            "commands, so they must start with a letter or '_' and hold only letters, "
            "digits, '_', '.' and '-'. Rename it, e.g. 'learning_rate'.",
        )
    return name


def _number(name: str, key: str, value: object, *, whole: bool = False) -> Any:
    """``value`` as a finite float (an int when ``whole``), or why it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        quoted = isinstance(value, str) and _CSV_FLOAT.fullmatch(value.strip())
        fix = (
            "write it without quotes"
            if quoted
            else f"give one, e.g. {key}: {16 if whole else 0.001}"
        )
        raise _Invalid(
            name, f"{key} must be a number, got {value!r} ({type(value).__name__}); {fix}."
        )
    if not math.isfinite(value):
        raise _Invalid(name, f"{key} must be a finite number, got {value!r}.")
    if whole:
        if isinstance(value, float) and not value.is_integer():
            raise _Invalid(name, f"{key} must be a whole number for type int, got {value!r}.")
        return int(value)
    return float(value)


def _flag(name: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(name, f"{key} must be true or false, got {value!r}.")
    return value


def _scalars(name: str, key: str, values: object) -> tuple[Any, ...]:
    """Categorical choices or grid values: a non-empty list of distinct scalars."""
    if not isinstance(values, (list, tuple)):
        raise _Invalid(name, f"{key} must be a list, e.g. {key}: [32, 64], got {values!r}.")
    out = tuple(values)
    if not out:
        raise _Invalid(name, f"{key} is empty; give at least one value.")
    seen: dict[Any, Any] = {}
    for i, value in enumerate(out, 1):
        if not isinstance(value, _SCALARS):
            raise _Invalid(
                name,
                f"{key} may hold only numbers, strings, true/false or null (what Optuna "
                f"can store), but value {i} is {value!r} ({type(value).__name__}); "
                "encode it as a string and decode it in your code.",
            )
        if value in seen:  # == equality: 1, 1.0 and True are one value to Optuna too
            first = seen[value]
            same = "twice" if repr(first) == repr(value) else f"and {first!r}, which are equal"
            raise _Invalid(name, f"{key} holds {value!r} {same}; keep one.")
        seen[value] = value
    return out


def _step_count(name: str, low: Any, high: Any, step: Any) -> int:
    """Number of steps from low to high; refuses a range that is not a whole number of
    steps (Optuna would shrink it with a warning)."""
    exact = (Decimal(repr(high)) - Decimal(repr(low))) / Decimal(repr(step))
    if exact != exact.to_integral_value():
        fit = Decimal(repr(low)) + int(exact) * Decimal(repr(step))
        above = fit + Decimal(repr(step))
        fits = f"{fit} or {above}" if int(exact) else f"{above}"
        raise _Invalid(
            name,
            f"the range {low}..{high} is not a whole number of steps of {step}; "
            f"set high to {fits}, or change step.",
        )
    return int(exact)
