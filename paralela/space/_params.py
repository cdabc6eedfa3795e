"""The parameters of a space that hold values: :class:`Float`, :class:`Int`,
:class:`Categorical`, :class:`Grid` and :class:`Fixed` (a :class:`~paralela.space.Choice`,
whose options hold spaces of their own, is in :mod:`paralela.space._space`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any

from paralela.space._checks import (
    _check_name,
    _flag,
    _Invalid,
    _number,
    _optuna_distributions,
    _scalars,
    _step_count,
)

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["Categorical", "Fixed", "Float", "Grid", "Int", "Param"]


class Param(ABC):
    """One parameter of a search space. Subclasses are frozen dataclasses."""

    name: str

    @abstractmethod
    def distribution(self) -> BaseDistribution | None:
        """The Optuna distribution; ``None`` for :class:`Fixed`."""

    @abstractmethod
    def grid_values(self) -> list[Any] | None:
        """The values a grid search tries; ``None`` when the parameter is continuous."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The file form, e.g. ``{"type": "int", "low": 1, "high": 8}``."""

    def _grid_size(self) -> int | None:
        values = self.grid_values()
        return None if values is None else len(values)

    @abstractmethod
    def _misfit(self, value: Any) -> str | None:
        """Why ``value`` does not fit this parameter, or ``None`` when it does."""


class _Range(Param):
    """Shared by :class:`Float` and :class:`Int`: a number in ``[low, high]``."""

    _kind = "float"
    low: Any
    high: Any
    log: bool
    step: Any

    def __post_init__(self) -> None:
        name, whole = _check_name(self.name), self._kind == "int"
        low = _number(name, "low", self.low, whole=whole)
        high = _number(name, "high", self.high, whole=whole)
        step = self.step
        if step is not None or whole:  # an Int always has a step
            step = _number(name, "step", step, whole=whole)
        log = _flag(name, "log", self.log)
        if low >= high:
            raise _Invalid(
                name,
                f"low ({low}) must be less than high ({high}); swap them, or use "
                "type: fixed for a single value.",
            )
        if step is not None and step <= 0:
            raise _Invalid(name, f"step must be positive, got {step}.")
        if log and low <= 0:
            raise _Invalid(
                name,
                f"log: true needs low > 0, got low = {low}; use a small positive low "
                f"such as {1 if whole else 1e-8}, or drop log.",
            )
        if log and step != (1 if whole else None):
            raise _Invalid(name, f"log: true cannot be combined with step {step}; drop one.")
        if step is not None:
            _step_count(name, low, high, step)
        for key, value in (("low", low), ("high", high), ("log", log), ("step", step)):
            object.__setattr__(self, key, value)

    def distribution(self) -> BaseDistribution:
        kind = "IntDistribution" if self._kind == "int" else "FloatDistribution"
        cls = getattr(_optuna_distributions(), kind)
        return cls(self.low, self.high, log=self.log, step=self.step)  # type: ignore[no-any-return]

    def _grid_size(self) -> int | None:
        if self.step is None:
            return None
        return _step_count(self.name, self.low, self.high, self.step) + 1

    def grid_values(self) -> list[Any] | None:
        if self.step is None:
            return None
        if self._kind == "int":
            return list(range(self.low, self.high + 1, self.step))
        n = _step_count(self.name, self.low, self.high, self.step)
        low, step = Decimal(repr(self.low)), Decimal(repr(self.step))
        return [float(low + i * step) for i in range(n + 1)]  # 0.1 + 2 * 0.1 is 0.3 here

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self._kind, "low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        if self.step != (1 if self._kind == "int" else None):
            out["step"] = self.step
        return out

    def _misfit(self, value: Any) -> str | None:
        number = (int,) if self._kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, number):
            return f"is not {'a whole number' if self._kind == 'int' else 'a number'}"
        if not self.low <= value <= self.high:
            return f"is outside [{self.low}, {self.high}]"
        if self.step is not None:
            steps = (value - self.low) / self.step
            if not math.isclose(steps, round(steps), abs_tol=1e-8):
                return f"is not low + a multiple of step ({self.step})"
        return None


@dataclass(frozen=True)
class Float(_Range):
    """A real number in ``[low, high]``; ``log`` samples on a log scale, ``step``
    discretises (``low``, ``low + step``, ... ``high``). Optuna's ``FloatDistribution``."""

    name: str
    low: float
    high: float
    log: bool = False
    step: float | None = None


@dataclass(frozen=True)
class Int(_Range):
    """A whole number in ``[low, high]`` in steps of ``step``; ``log`` samples on a log
    scale (then step must be 1). Optuna's ``IntDistribution``."""

    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False
    _kind = "int"


class _Choices(Param):
    """Shared by :class:`Categorical` and :class:`Grid`: a finite list of scalars."""

    _key = "choices"

    @property
    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, self._key))

    def __post_init__(self) -> None:
        name = _check_name(self.name)
        object.__setattr__(self, self._key, _scalars(name, self._key, getattr(self, self._key)))

    @cached_property
    def _lookup(self) -> frozenset[Any]:
        return frozenset(self._values)

    def distribution(self) -> BaseDistribution:
        return _optuna_distributions().CategoricalDistribution(self._values)  # type: ignore[no-any-return]

    def grid_values(self) -> list[Any]:
        return list(self._values)

    def to_dict(self) -> dict[str, Any]:
        kind = "categorical" if self._key == "choices" else "grid"
        return {"type": kind, self._key: list(self._values)}

    def _misfit(self, value: Any) -> str | None:
        try:
            found = value in self._lookup
        except TypeError:  # unhashable: a list or a dict
            found = False
        return None if found else f"is not one of {list(self._values)!r}"


@dataclass(frozen=True)
class Categorical(_Choices):
    """One of ``choices`` (numbers, strings, booleans, ``None``). Optuna's
    ``CategoricalDistribution``."""

    name: str
    choices: tuple[Any, ...]


@dataclass(frozen=True)
class Grid(_Choices):
    """An explicit grid axis: ``values`` are tried in turn by a grid search; any other
    sampler treats them as categorical choices."""

    name: str
    values: tuple[Any, ...]
    _key = "values"


@dataclass(frozen=True)
class Fixed(Param):
    """A constant: passed to every trial, never sampled."""

    name: str
    value: Any

    def __post_init__(self) -> None:
        _check_name(self.name)

    def distribution(self) -> BaseDistribution | None:
        return None

    def grid_values(self) -> list[Any]:
        return [self.value]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def _misfit(self, value: Any) -> str | None:
        return None if value == self.value else f"differs from the fixed value {self.value!r}"
