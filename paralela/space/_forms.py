"""A space from a mapping in the file form (``{name: spec}``, or wrapped:
``{"params": ..., "configurations": [...], **settings}``), from a file, or from what
``paralela.sweep(space=...)`` accepts. Files are read in :mod:`paralela.space._files`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.space._checks import _RESERVED, _SCALARS, _check_name, _Invalid
from paralela.space._params import Categorical, Fixed, Float, Grid, Int, Param
from paralela.space._space import Choice, Space

__all__ = ["as_space", "load_space", "load_sweep_file", "space_from_dict", "sweep_from_dict"]

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
    from paralela.space._files import read_sweep_file

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
