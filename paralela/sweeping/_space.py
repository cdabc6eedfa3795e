"""The search space of a sweep: parameters, their Optuna distributions, files and grids.

A space comes from code (``Space((Float("lr", 1e-5, 0.1, log=True), ...))``), from a
mapping or a YAML/TOML file (one entry per parameter), or from a CSV of configurations
(one row, one trial)::

    file / mapping --space_from_dict--> Space(params)              sampled by Optuna
    CSV            --load_space-------> Space(params, configurations)   run as listed
    Space.distributions() -> {name: optuna distribution}   (Fixed values left out)
    Space.grid()          -> [{name: value}, ...]          (cartesian product, fixed included)

A :class:`Choice` makes a space conditional: each option has parameters of its own,
named ``option.param`` in a trial's flat parameters, and only the chosen option's are
drawn::

    Space.sample(trial)   -> {"model": "forest", "forest.n_estimators": 120}  (define-by-run)
    Space.grid()          -> every option with its own grid

Files are read in :mod:`paralela.sweeping._space_files`. Every bad input raises
:class:`~paralela.errors.ConfigError` naming the file, the line or row, the parameter
(inside a choice: its path), what is allowed and what to do. Optuna, PyYAML and tomllib
are imported only when used, so importing this module is cheap.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = [
    "Param",
    "Float",
    "Int",
    "Categorical",
    "Fixed",
    "Grid",
    "Choice",
    "Space",
    "branch_params",
    "MAX_GRID_POINTS",
    "as_space",
    "load_space",
    "load_sweep_file",
    "space_from_dict",
    "sweep_from_dict",
]

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


def _check_option(choice: str, option: object) -> str:
    if not isinstance(option, str) or not _NAME.fullmatch(option) or "." in option:
        hint = (
            " (YAML reads yes/no/on/off as true/false: quote the name)"
            if isinstance(option, bool)
            else ""
        )
        raise _Invalid(
            choice,
            f"option {option!r} is not a valid option name{hint}; an option's name "
            "prefixes its parameters' names ('forest.n_estimators'), so it starts with a "
            "letter or '_' and holds only letters, digits, '_' and '-' (no '.'). Rename it.",
        )
    return option


def _branch(choice: str, option: str, raw: object) -> Space:
    """The parameters of one option: ``None``, a :class:`Space`, a sequence of
    :class:`Param` or a mapping of file entries."""
    if raw is None:
        return Space(())
    if isinstance(raw, Space):
        branch = raw
    elif isinstance(raw, Mapping):
        params = []
        for key, spec in raw.items():
            try:
                params.append(_param_from_spec(_check_name(key), spec))
            except _Invalid as exc:
                raise exc.inside(choice, option) from None
        branch = Space(tuple(params))
    elif isinstance(raw, (list, tuple)):
        try:
            branch = Space(tuple(raw))
        except ConfigError as exc:
            raise _Invalid(choice, str(exc), (("option", option),)) from None
    else:
        raise _Invalid(
            choice,
            f"option {option!r} must map parameter names to specifications (or be null "
            f"for an option without parameters), got {raw!r}.",
        )
    if branch.configurations is not None:
        raise _Invalid(
            choice,
            "a space of configurations (a CSV) cannot be an option's parameters.",
            (("option", option),),
        )
    for p in branch.params:
        if isinstance(p, Fixed) and not isinstance(p.value, _SCALARS):
            raise _Invalid(
                choice,
                "a fixed value inside an option is one of the trial's parameters, stored "
                "by Optuna, so it is a number, a string, true/false or null; got "
                f"{p.value!r}. Encode it as a string, or fix it at the top level.",
                (("option", option), ("parameter", p.name)),
            )
    return branch


@dataclass(frozen=True)
class Choice(Param):
    """One of ``options``, each with parameters of its own, sampled only when it is
    chosen. ``options`` maps an option's name to its parameters: a sequence of
    :class:`Param`, a :class:`Space`, a mapping in the file form, or ``None`` for none.

    A trial's parameters are flat: ``{"model": "forest", "forest.n_estimators": 120}``;
    an option's parameters carry its name and a dot, and only the chosen option's appear.
    Optuna stores the choice as a ``CategoricalDistribution`` of the option names.
    """

    name: str
    options: Mapping[str, Any]

    def __post_init__(self) -> None:
        name = _check_name(self.name)
        raw = self.options
        if not isinstance(raw, Mapping) or not raw:
            raise _Invalid(
                name,
                "options must be a non-empty mapping of option name to that option's "
                "parameters, e.g. options: {logreg: {C: {type: float, low: 0.001, "
                "high: 1000, log: true}}, knn: null}.",
            )
        options = {_check_option(name, o): _branch(name, o, b) for o, b in raw.items()}
        object.__setattr__(self, "options", options)

    def __hash__(self) -> int:
        return hash((self.name, tuple(self.options)))

    def distribution(self) -> BaseDistribution:
        return _optuna_distributions().CategoricalDistribution(tuple(self.options))  # type: ignore[no-any-return]

    def grid_values(self) -> list[Any]:
        """The option names; :meth:`Space.grid` also enumerates each option's grid."""
        return list(self.options)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "choice",
            "options": {o: (b.to_dict() or None) for o, b in self.options.items()},
        }

    def _misfit(self, value: Any) -> str | None:
        if isinstance(value, str) and value in self.options:
            return None
        return f"is not one of the options {list(self.options)!r}"


def _suggest(trial: Any, name: str, p: Param) -> Any:
    """Ask ``trial`` for ``p``'s value under the flat name ``name`` (define-by-run)."""
    if isinstance(p, _Range):
        suggest = trial.suggest_int if p._kind == "int" else trial.suggest_float
        return suggest(name, p.low, p.high, step=p.step, log=p.log)
    if isinstance(p, (_Choices, Choice)):
        return trial.suggest_categorical(name, p.grid_values())
    raise TypeError(f"cannot sample {p!r}")  # Fixed is never asked for


def branch_params(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The parameters of one option, its prefix taken off:
    ``branch_params({"model": "forest", "forest.n_estimators": 120}, "forest")`` is
    ``{"n_estimators": 120}``. A nested option keeps its own prefix (``gini.x``)."""
    head = prefix.rstrip(".") + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


@dataclass(frozen=True)
class Space:
    """A search space: ``params``, and for a CSV of configurations, exactly the trials to
    run (``configurations``, in order; ``params`` then hold a :class:`Categorical` per
    column so that Optuna can store the values).

    A space with a :class:`Choice` is *conditional*: each trial has the parameters of the
    options it chose, under flat names (``forest.n_estimators``); :meth:`sample` asks an
    Optuna trial for them define-by-run, :meth:`grid` lists every option's grid.
    """

    params: tuple[Param, ...] = ()
    configurations: tuple[dict[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        params = tuple(self.params)
        seen: set[str] = set()
        for p in params:
            if not isinstance(p, Param):
                raise ConfigError(
                    f"A space holds Param objects (Float, Int, Categorical, Grid, Fixed, "
                    f"Choice), got {p!r}."
                )
            if p.name in seen:
                raise ConfigError(f"Parameter {p.name!r} is defined twice; keep one of them.")
            seen.add(p.name)
        object.__setattr__(self, "params", params)
        owners: dict[str, tuple[str, str] | None] = {}
        for flat, _, owner in self._walk():
            if flat in owners:
                raise ConfigError(
                    f"Parameter {flat!r} is defined twice: {_owned_by(owners[flat])} and "
                    f"{_owned_by(owner)} (an option's parameters are named "
                    "'<option>.<name>'); rename one of them."
                )
            owners[flat] = owner
        if self.configurations is not None:
            configs = tuple(dict(c) for c in self.configurations)
            if not configs:
                raise ConfigError("The space has an empty list of configurations; give one.")
            for i, config in enumerate(configs, 1):
                extra = [k for k in config if k not in owners]
                if extra:
                    raise ConfigError(
                        f"Configuration {i} sets {', '.join(map(repr, extra))}, which the "
                        "space does not define; add a parameter for it."
                    )
                self.validate(config, where=f"Configuration {i}")
            object.__setattr__(self, "configurations", configs)

    def _walk(
        self, prefix: str = "", owner: tuple[str, str] | None = None
    ) -> Iterator[tuple[str, Param, tuple[str, str] | None]]:
        """Every parameter, options' included: (flat name, param, (choice, option) that
        holds it or ``None`` at the top level)."""
        for p in self.params:
            flat = prefix + p.name
            yield flat, p, owner
            if isinstance(p, Choice):
                for option, branch in p.options.items():
                    yield from branch._walk(f"{prefix}{option}.", (flat, option))

    def _active(self, params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Param]]:
        """The parameters ``params`` uses: the top-level ones, and the parameters of
        each option ``params`` chose."""
        for p in self.params:
            flat = prefix + p.name
            yield flat, p
            if isinstance(p, Choice):
                chosen = params.get(flat)
                if isinstance(chosen, str) and chosen in p.options:
                    yield from p.options[chosen]._active(params, f"{prefix}{chosen}.")

    @property
    def conditional(self) -> bool:
        """Whether a :class:`Choice` makes some parameters depend on others."""
        return any(isinstance(p, Choice) for p in self.params)

    @property
    def names(self) -> list[str]:
        """The parameter names, in order; options' parameters by their flat names
        (``forest.n_estimators``), after their choice."""
        return [flat for flat, _, _ in self._walk()]

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of every parameter that is not :class:`Fixed`, options'
        parameters included. A trial of a conditional space draws only some of them:
        ask it with :meth:`sample`."""
        return {flat: d for flat, p, _ in self._walk() if (d := p.distribution()) is not None}

    def fixed(self) -> dict[str, Any]:
        """The fixed values, by name (top level only: an option's fixed values are
        parameters of the trials that choose it, see :meth:`sample`)."""
        return {p.name: p.value for p in self.params if isinstance(p, Fixed)}

    def sample(self, trial: Any) -> dict[str, Any]:
        """Ask an Optuna ``trial`` for a configuration, define-by-run: each choice
        (``suggest_categorical``), then the chosen option's parameters under their flat
        names, so that TPE models each option's parameters apart. Returns the flat
        parameters sampled (top-level fixed values left out, as in
        :meth:`distributions`; an option's fixed values are in, stored as one-value
        categoricals). Values an enqueued trial fixes are taken as they are."""
        return self._sample(trial, "")

    def _sample(self, trial: Any, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.params:
            flat = prefix + p.name
            if isinstance(p, Fixed):
                if prefix:  # an option's fixed value is one of its trials' parameters
                    out[flat] = trial.suggest_categorical(flat, [p.value])
                continue
            out[flat] = value = _suggest(trial, flat, p)
            if isinstance(p, Choice):
                out.update(p.options[value]._sample(trial, f"{prefix}{value}."))
        return out

    def _grid_sizes(self, prefix: str = "") -> tuple[list[tuple[str, int]], list[str]]:
        """(flat name, number of grid values) per top-level axis (a choice: the sum of
        its options' grids), and the continuous parameters that have no grid."""
        sizes: list[tuple[str, int]] = []
        continuous: list[str] = []
        for p in self.params:
            flat = prefix + p.name
            if isinstance(p, Choice):
                total = 0
                for option, branch in p.options.items():
                    inner, more = branch._grid_sizes(f"{prefix}{option}.")
                    continuous += more
                    total += math.prod(s for _, s in inner)
                sizes.append((flat, total))
            elif not isinstance(p, Fixed):
                size = p._grid_size()
                if size is None:
                    continuous.append(flat)
                else:
                    sizes.append((flat, size))
        return sizes, continuous

    def _check_grid(self) -> list[tuple[str, int]]:
        sizes, continuous = self._grid_sizes()
        if continuous:
            raise ConfigError(
                f"A grid search needs a finite list of values for every parameter, but "
                f"{', '.join(map(repr, continuous))} is a continuous float; give it a step, "
                "or use values: [...] (type: grid)."
            )
        total = math.prod(s for _, s in sizes)
        if total > MAX_GRID_POINTS:
            shape = " x ".join(f"{n}: {s:,}" for n, s in sizes)
            raise ConfigError(
                f"The grid has {total:,} points ({shape}), more than {MAX_GRID_POINTS:,}. "
                "Use fewer values or coarser steps, or a sampler that does not enumerate "
                "the grid, such as 'tpe' or 'random'."
            )
        return sizes

    def grid_axes(self) -> dict[str, list[Any]]:
        """The values of every parameter that is not fixed, as Optuna's ``GridSampler``
        takes them. Raises :class:`ConfigError` for a continuous float, when the
        product has more than :data:`MAX_GRID_POINTS` points, or for a conditional
        space (``GridSampler`` cannot search one: :meth:`grid` lists its points)."""
        sizes = dict(self._check_grid())
        if self.conditional:
            raise ConfigError(
                "A conditional space (a choice whose options have parameters) has no grid "
                "axes: Optuna's GridSampler cannot search it. Space.grid() lists its "
                "points, every option's grid in turn; sampler 'grid' runs them."
            )
        return {p.name: p.grid_values() or [] for p in self.params if p.name in sizes}

    def grid(self) -> list[dict[str, Any]]:
        """Every point of the grid (the cartesian product of the parameters' values,
        first parameter slowest; a choice contributes each option followed by that
        option's own grid), fixed values included. For a CSV space: its
        configurations."""
        if self.configurations is not None:
            return [self.complete(c) for c in self.configurations]
        self._check_grid()
        return [self.complete(point) for point in self._grid_points("")]

    def _grid_points(self, prefix: str) -> list[dict[str, Any]]:
        axes: list[list[dict[str, Any]]] = []
        for p in self.params:
            flat = prefix + p.name
            if isinstance(p, Choice):
                axes.append(
                    [
                        {flat: option, **point}
                        for option, branch in p.options.items()
                        for point in branch._grid_points(f"{prefix}{option}.")
                    ]
                )
            elif not isinstance(p, Fixed):
                axes.append([{flat: v} for v in p.grid_values() or []])
            elif prefix:  # an option's fixed value is one of its trials' parameters
                axes.append([{flat: p.value}])
        return [
            {k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)
        ]

    def complete(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the fixed values added (the chosen options' too), in the
        order of the space (names the space does not know come last). Does not
        validate; see :meth:`validate`."""
        out = {
            flat: params.get(flat, getattr(p, "value", None))
            for flat, p in self._active(params)
            if flat in params or isinstance(p, Fixed)
        }
        out.update((k, v) for k, v in params.items() if k not in out)
        return out

    def validate(self, params: Mapping[str, Any], *, where: str = "Configuration") -> None:
        """Raise :class:`ConfigError` unless ``params`` gives every parameter that is not
        fixed a value that fits it: for a choice, an option, then that option's
        parameters and no other option's. Unknown names are refused, except in a space
        of configurations (a CSV), whose columns are the space."""
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where} must be a mapping of name to value, got {params!r}.")
        every = {flat: owner for flat, _, owner in self._walk()}
        unknown = [k for k in params if k not in every]
        if unknown and self.configurations is None:
            raise ConfigError(
                f"{where} sets {', '.join(map(repr, unknown))}, which the space does not "
                f"define; its parameters are: {', '.join(every) or '(none)'}."
            )
        active = dict(self._active(params))
        for name in params:
            owner = every.get(name)
            if name not in active and owner is not None:
                choice, option = owner
                chosen = f"is {params[choice]!r} here" if choice in params else "is not given"
                raise ConfigError(
                    f"{where} sets {name!r}, a parameter of option {option!r} of "
                    f"{choice!r}, but {choice!r} {chosen}; leave {name!r} out: a "
                    "configuration has only the chosen options' parameters."
                )
        missing = [n for n, p in active.items() if n not in params and not isinstance(p, Fixed)]
        if missing:
            raise ConfigError(
                f"{where} gives no value for {', '.join(map(repr, missing))}; give every "
                "parameter of the space (of the chosen options) a value."
            )
        for name, value in params.items():
            problem = active[name]._misfit(value) if name in active else None
            if problem:
                raise ConfigError(f"{where}: {name} = {value!r} {problem}.")

    def to_dict(self) -> dict[str, Any]:
        """The file form: ``{name: spec}``, or ``{"params": ..., "configurations": [...]}``."""
        params = {p.name: p.to_dict() for p in self.params}
        if self.configurations is None:
            return params
        return {"params": params, "configurations": [dict(c) for c in self.configurations]}


def _owned_by(owner: tuple[str, str] | None) -> str:
    return "at the top level" if owner is None else f"in option {owner[1]!r} of {owner[0]!r}"


# -- from mappings and files ---------------------------------------------------------

_TYPES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # file type: (canonical type, required keys, optional keys)
    "float": ("float", ("low", "high"), ("log", "step")),
    "loguniform": ("float", ("low", "high"), ("log", "step")),
    "logfloat": ("float", ("low", "high"), ("log", "step")),
    "int": ("int", ("low", "high"), ("step", "log")),
    "categorical": ("categorical", ("choices",), ()),
    "grid": ("grid", ("values",), ()),
    "fixed": ("fixed", ("value",), ()),
    "choice": ("choice", ("options",), ()),
}


def _param_from_spec(name: str, raw: object) -> Param:
    """One file entry: a mapping with a ``type``, a list (categorical), or a scalar (fixed)."""
    if isinstance(raw, (list, tuple)):
        return Categorical(name, tuple(raw))
    if not isinstance(raw, Mapping):
        return Fixed(name, raw)
    spec = dict(raw)
    kind = spec.pop("type", None)
    valid = ", ".join(_TYPES)
    if kind is None:
        raise _Invalid(
            name,
            f"has no 'type'; valid types are: {valid}. To fix a mapping as the value, "
            "write {type: fixed, value: {...}}.",
        )
    if not isinstance(kind, str) or kind.lower() not in _TYPES:
        raise _Invalid(name, f"unknown type {kind!r}; valid types are: {valid}.")
    canonical, required, optional = _TYPES[kind.lower()]
    allowed = ("type", *required, *optional)
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise _Invalid(
                name,
                f"unknown key {key!r} for type {kind}; allowed keys are: "
                f"{', '.join(allowed)}.{hint}",
            )
    missing = [k for k in required if k not in spec]
    if missing:
        raise _Invalid(name, f"type {kind} needs {' and '.join(map(repr, missing))}.")
    if kind.lower() in ("loguniform", "logfloat") and spec.setdefault("log", True) is not True:
        raise _Invalid(name, f"type {kind} is always log; drop log, or use type: float.")
    if canonical == "float":
        return Float(name, **spec)
    if canonical == "int":
        return Int(name, **spec)
    if canonical == "categorical":
        return Categorical(name, spec["choices"])
    if canonical == "grid":
        return Grid(name, spec["values"])
    if canonical == "choice":
        return Choice(name, spec["options"])
    return Fixed(name, spec["value"])


def _where(
    source: str, name: object, lines: Mapping[str, int], path: tuple[tuple[str, str], ...] = ()
) -> str:
    """``file, line N, parameter 'model', option 'forest', parameter 'C'``: the line of
    the innermost key found (lines of keys inside a choice are keyed ``model/forest/C``)."""
    line = None
    if isinstance(name, str):
        keys = [name, *(key for _, key in path)]
        while keys and line is None:
            line = lines.get("/".join(keys))
            keys.pop()
    trail = "".join(f", {kind} {key!r}" for kind, key in path)
    at = f", line {line}" if line else ""
    return f"{source}{at}, parameter {name!r}{trail}"


def _branch_chains(columns: Mapping[str, Mapping[Any, None]]) -> dict[str, list[tuple[str, str]]]:
    """The columns of options, each with the (choice column, option) pairs that must
    hold for it to be set: ``forest.depth`` is a column of option ``forest`` when another
    column (``model``) holds the value ``forest``; ``forest.gini.x`` also needs
    ``forest.criterion`` to be ``gini``. Other columns are not in the result."""
    chains: dict[str, list[tuple[str, str]]] = {}
    for name in columns:
        parts = name.split(".")
        chain: list[tuple[str, str]] = []
        for i in range(1, len(parts)):
            option, parent = parts[i - 1], ".".join(parts[: i - 1])
            holders = [
                c
                for c, values in columns.items()
                if c != name and option in values and (c.rpartition(".")[0] == parent)
            ]
            if not holders:
                break
            if len(holders) > 1:
                raise ConfigError(
                    f"Columns {' and '.join(map(repr, holders))} both hold {option!r}, so "
                    f"either could be the choice that column {name!r} belongs to; rename "
                    "the option in one of them."
                )
            chain.append((holders[0], option))
        if chain:
            chains[name] = chain
    return chains


def _derived_params(columns: Mapping[str, Mapping[Any, None]]) -> list[Param]:
    """A parameter per column: a :class:`Choice` for a column that options' columns
    belong to (see :func:`_branch_chains`), else a :class:`Categorical` of its values."""
    chains = _branch_chains(columns)
    choices = {choice for chain in chains.values() for choice, _ in chain}

    def build(names: list[str], prefix: str) -> list[Param]:
        params: list[Param] = []
        for name in names:
            local = name[len(prefix) :]
            if name not in choices:
                params.append(Categorical(local, tuple(columns[name])))
                continue
            options: dict[Any, list[Param]] = {}
            for value in columns[name]:
                inside = [c for c, chain in chains.items() if chain[-1] == (name, value)]
                options[value] = build(inside, f"{prefix}{value}.")
            try:
                params.append(Choice(local, options))
            except _Invalid as exc:
                raise ConfigError(
                    f"Column {name!r} chooses between the columns named '<option>.<name>', "
                    f"so each of its values is an option: {exc.problem}"
                ) from None
        return params

    return build([c for c in columns if c not in chains], "")


def _from_configurations(configs: object, params: list[Param], source: str) -> Space:
    """A space of configurations: columns not among ``params`` become categoricals of
    their distinct values (first seen first), or choices when options' columns
    (``forest.depth``) belong to them."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ConfigError(f"{source}: configurations must be a non-empty list of mappings.")
    try:
        known = set(Space(tuple(params)).names)  # options' parameters by their flat names
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    columns: dict[str, dict[Any, None]] = {}
    for i, config in enumerate(configs, 1):
        if not isinstance(config, Mapping):
            raise ConfigError(f"{source}, configuration {i}: must be a mapping of name to value.")
        for key, value in config.items():
            if key in known:
                continue
            try:
                _check_name(key)
            except _Invalid as exc:
                raise ConfigError(f"{source}, configuration {i}, {key!r}: {exc.problem}") from None
            if not isinstance(value, _SCALARS):
                raise ConfigError(
                    f"{source}, configuration {i}: {key} = {value!r}; configurations hold "
                    "numbers, strings, true/false or null. Encode it as a string and decode "
                    "it in your code."
                )
            columns.setdefault(key, {}).setdefault(value, None)
    try:
        return Space((*params, *_derived_params(columns)), tuple(dict(c) for c in configs))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def sweep_from_dict(
    data: Mapping[str, Any], *, source: str = "space", _lines: Mapping[str, int] | None = None
) -> tuple[Space, dict[str, Any]]:
    """A space and the other settings of a mapping in the file form.

    The mapping is either ``{name: spec, ...}`` (no other settings) or wrapped:
    ``{"params": {name: spec}, "configurations": [...], **settings}``; ``settings``
    (``sampler``, ``direction``, ...) are returned as they are, unchecked.
    """
    lines = _lines or {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: a search space must be a mapping of parameter name to "
            f"specification, got {type(data).__name__}."
        )
    wrapped = any(key in data for key in _RESERVED)
    raw_params = data.get("params", {}) if wrapped else data
    settings = {k: v for k, v in data.items() if k not in _RESERVED} if wrapped else {}
    if not isinstance(raw_params, Mapping):
        raise ConfigError(f"{source}: 'params' must be a mapping of parameter name to spec.")
    params: list[Param] = []
    for name, raw in raw_params.items():
        try:
            params.append(_param_from_spec(_check_name(name), raw))
        except _Invalid as exc:
            raise ConfigError(f"{_where(source, name, lines, exc.path)}: {exc.problem}") from None
    if wrapped and "configurations" in data:
        return _from_configurations(data["configurations"], params, source), settings
    if not params:
        raise ConfigError(
            f"{source} defines no parameters; give at least one, e.g. "
            "lr: {type: float, low: 1.0e-5, high: 0.1, log: true}."
        )
    return Space(tuple(params)), settings


def space_from_dict(data: Mapping[str, Any], *, source: str = "space") -> Space:
    """A space from a mapping in the file form (see ``docs/sweep-space.md``); the other
    settings of a wrapped mapping are ignored (:func:`sweep_from_dict` returns them)."""
    return sweep_from_dict(data, source=source)[0]


def load_sweep_file(path: str | os.PathLike[str]) -> tuple[Space, dict[str, Any]]:
    """The space of a ``.yaml``/``.yml``, ``.toml`` or ``.csv`` file, and the settings
    next to ``params:`` in a wrapped YAML/TOML file (empty otherwise)."""
    from paralela.sweeping._space_files import read_sweep_file

    return read_sweep_file(Path(path))


def load_space(path: str | os.PathLike[str]) -> Space:
    """The space of a ``.yaml``/``.yml``, ``.toml`` or ``.csv`` file; other settings
    in the file are ignored (:func:`load_sweep_file` returns them)."""
    return load_sweep_file(path)[0]


def as_space(space: Space | Mapping[str, Any] | str | os.PathLike[str]) -> Space:
    """What ``paralela.sweep(space=...)`` accepts: a :class:`Space`, a mapping in the
    file form, or the path of a file."""
    if isinstance(space, Space):
        return space
    if isinstance(space, Mapping):
        return space_from_dict(space)
    if isinstance(space, (str, os.PathLike)):
        return load_space(space)
    raise ConfigError(
        f"space must be a Space, a mapping or a file path, got {type(space).__name__}."
    )
