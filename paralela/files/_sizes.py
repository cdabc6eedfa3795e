"""Sizes in bytes as users write them: ``536870912``, ``"512MiB"``, ``"512MB"``, ``"512M"``.

``parse_size`` takes positive sizes (memory limits, request bodies); ``split_bytes`` of
``mapreduce`` and ``predict`` also takes ``0`` (one split per file), through
:func:`paralela.files.parse_split_bytes`, which both call.
"""

from __future__ import annotations

import re

from paralela.errors import ConfigError

__all__ = ["parse_bytes", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, what: str) -> int:
    """Bytes from an int or a size with a unit; may be 0 or, from an int, negative (the
    caller checks the range it allows).

    Raises:
        ConfigError: not an int (a bool is not) or a number with a known unit.
    """
    if isinstance(value, bool):
        raise ConfigError(
            f"{what} must be a number of bytes or a size like '512MB', got {value!r}."
        )
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (match := _SIZE.match(value)):
        unit = match[2].lower()
        if unit not in _UNITS:
            raise ConfigError(
                f"{what}={value!r} has an unknown unit {match[2]!r}; use B, KB, MB, GB "
                "(powers of 1000), KiB, MiB, GiB or K, M, G (powers of 1024)."
            )
        return int(float(match[1]) * _UNITS[unit])
    raise ConfigError(f"{what} must be a number of bytes or a size like '512MB', got {value!r}.")


def parse_size(value: int | str, what: str = "memory_limit") -> int:
    """Bytes from ``536870912``, ``"512MiB"``, ``"512MB"`` (10^6), ``"512M"`` (2^20).

    Raises:
        ConfigError: not a positive size.
    """
    size = parse_bytes(value, what)
    if size < 1:
        raise ConfigError(f"{what} must be positive, got {value!r}.")
    return size
