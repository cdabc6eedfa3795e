"""A space from a mapping in the file form (``{name: spec}``, or wrapped:
``{"params": ..., "configurations": [...], **settings}``), from a file, or from what
``paralela.sweep(space=...)`` accepts. Files are read in :mod:`paralela.space._files`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paralela.errors import ConfigError
from paralela.space._checks import _RESERVED, _SCALARS, _check_name, _Invalid
from paralela.space._params import Categorical, Param
from paralela.space._space import Choice, Space, _param_from_spec

__all__ = ["space_from_dict", "sweep_from_dict"]

# -- from mappings and files ---------------------------------------------------------


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
