"""A :class:`Space` of parameters, and the :class:`Choice` that makes one conditional
(each option holds a space of its own, so the two are defined together)::

    Space.sample(trial)   -> {"model": "forest", "forest.n_estimators": 120}  (define-by-run)
    Space.grid()          -> every option with its own grid
    Space.validate(params), Space.complete(params), Space.to_dict()
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError, did_you_mean
from paralela.space._checks import (
    _NAME,
    _SCALARS,
    MAX_GRID_POINTS,
    _check_name,
    _Invalid,
    _optuna_distributions,
)
from paralela.space._params import Categorical, Fixed, Float, Grid, Int, Param, _Choices, _Range

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["Choice", "Space", "branch_params"]


# One file entry (``{type: float, low: ..., high: ...}``, a list, a scalar): a choice's
# options hold such entries in turn, so entries, choices and spaces are built together.
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
            hint = did_you_mean(str(key), allowed)
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
