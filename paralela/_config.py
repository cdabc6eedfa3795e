"""Configuration with explicit precedence: argument, then ``paralela.config(...)``, then
environment variable, then default.

``UNSET`` marks "not given" so that ``None`` and ``0`` stay meaningful values.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from paralela.errors import ConfigError

__all__ = ["UNSET", "Settings", "UnsetType", "config", "resolve"]

T = TypeVar("T")


class UnsetType(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET = UnsetType.UNSET


@dataclass(frozen=True)
class Settings:
    """Values set by :func:`config`; ``UNSET`` fields fall through to the environment."""

    backend: Any = UNSET
    workers: Any = UNSET
    progress: Any = UNSET
    retries: Any = UNSET
    start_method: Any = UNSET


_SETTINGS: contextvars.ContextVar[Settings] = contextvars.ContextVar(
    "paralela_settings",
    default=Settings(),  # noqa: B039  (frozen, so sharing it is safe)
)

_YES = ("1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _YES or value in _NO:
        return value in _YES
    raise ValueError(", ".join((*_YES, *_NO)))


def _whole(raw: str, least: int, what: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = least - 1
    if value < least:
        more = "at least 1" if least == 1 else f"{least} or more"
        raise ValueError(f"a whole number of {what}, {more}")
    return value


def _backend(raw: str) -> str:
    from paralela.backends import available_backends  # lazily: backends import this module

    names = available_backends()
    if raw.strip() not in names:
        raise ValueError(", ".join(names))
    return raw.strip()


def _start_method(raw: str) -> str:
    if raw.strip() != "spawn":
        raise ValueError("spawn (workers always start as fresh interpreters; fork is not offered)")
    return "spawn"


# name -> (environment variable, parser: the value, or ValueError(the values allowed))
_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "backend": ("PARALELA_BACKEND", _backend),
    "workers": ("PARALELA_WORKERS", lambda raw: _whole(raw, 1, "workers")),
    "progress": ("PARALELA_PROGRESS", _flag),
    "retries": ("PARALELA_RETRIES", lambda raw: _whole(raw, 0, "retries")),
    "start_method": ("PARALELA_START_METHOD", _start_method),
}


@contextlib.contextmanager
def config(
    *,
    backend: Any = UNSET,
    workers: Any = UNSET,
    progress: Any = UNSET,
    retries: Any = UNSET,
    start_method: Any = UNSET,
) -> Iterator[Settings]:
    """Set defaults for every call inside the ``with`` block (explicit arguments still win).

    Example::

        with paralela.config(backend="threads", workers=4):
            paralela.map(fetch, urls)
    """
    current = _SETTINGS.get()
    given = {
        k: v
        for k, v in {
            "backend": backend,
            "workers": workers,
            "progress": progress,
            "retries": retries,
            "start_method": start_method,
        }.items()
        if v is not UNSET
    }
    token = _SETTINGS.set(replace(current, **given))
    try:
        yield _SETTINGS.get()
    finally:
        _SETTINGS.reset(token)


def resolve(name: str, value: Any, default: T) -> Any:
    """Resolve one setting: argument, then :func:`config`, then environment, then default."""
    if value is not UNSET:
        return value
    from_context = getattr(_SETTINGS.get(), name)
    if from_context is not UNSET:
        return from_context
    var, parse = _ENV[name]
    raw = os.environ.get(var)
    if raw is not None and raw != "":
        try:
            return parse(raw)
        except ValueError as exc:
            raise ConfigError(
                f"Environment variable {var}={raw!r} is not understood (it sets {name!r}); "
                f"allowed: {exc}. Fix or unset it."
            ) from None
    return default
