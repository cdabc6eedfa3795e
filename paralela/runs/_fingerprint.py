"""Fingerprints of functions and inputs, so a run directory is never reused by mistake.

A function is fingerprinted by its module, name and compiled code (constants and nested
functions included, line numbers excluded), so editing its body changes it and moving it
in a file does not. Inputs are fingerprinted by their pickled bytes, chunk by chunk.
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Sequence
from typing import Any

from paralela.backends._wire import dumps

__all__ = ["digest_bytes", "digest_items", "fingerprint_function", "fingerprint_object"]


def digest_bytes(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def digest_items(items: Sequence[Any]) -> str:
    """Digest of a chunk's input items (the same for a list, tuple or range of them)."""
    return digest_bytes(dumps(items if isinstance(items, list) else list(items)))


def fingerprint_object(obj: Any) -> str:
    """Digest of any picklable object (shared data, initializer arguments)."""
    return digest_bytes(dumps(obj))


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


def _fingerprint_value(value: Any) -> str:
    """Functions by their code (also inside containers), anything else by its pickle."""
    if callable(value) and not isinstance(value, type):
        return fingerprint_function(value)
    if isinstance(value, (list, tuple)):
        return digest_bytes("|".join(_fingerprint_value(v) for v in value).encode())
    if isinstance(value, dict):
        return digest_bytes(
            "|".join(f"{k!r}={_fingerprint_value(v)}" for k, v in sorted(value.items())).encode()
        )
    return fingerprint_object(value)


def _closure_digest(fn: types.FunctionType) -> str:
    """The values a nested function captured (a lambda's ``factor``): another value is
    another computation. Captured functions count by their code, not their closures, so
    a function that refers to itself does not recurse."""
    parts = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # not assigned yet
            parts.append("<empty>")
            continue
        if isinstance(value, types.FunctionType):
            sub = hashlib.blake2b(digest_size=16)
            sub.update(f"{value.__module__}.{value.__qualname__}".encode())
            _code_digest(value.__code__, sub)
            parts.append(sub.hexdigest())
            continue
        try:
            parts.append(_fingerprint_value(value))
        except Exception:  # cannot be pickled (a lock, a connection): its type counts
            parts.append(f"{type(value).__module__}.{type(value).__qualname__}")
    return digest_bytes("|".join(parts).encode())


def fingerprint_function(fn: Any) -> str:
    """Digest of a callable: its name and, for Python functions, its code and defaults.

    Functions held by a ``functools.partial`` or by a callable object's attributes are
    fingerprinted by their code too, so editing them is noticed.
    """
    h = hashlib.blake2b(digest_size=16)
    if isinstance(fn, functools.partial):
        h.update(fingerprint_function(fn.func).encode())
        h.update(_fingerprint_value(fn.args).encode())
        h.update(_fingerprint_value(fn.keywords).encode())
        return h.hexdigest()
    target = getattr(fn, "__func__", fn)  # bound methods: the function
    h.update(f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}".encode())
    code = getattr(target, "__code__", None)
    if isinstance(code, types.CodeType):
        _code_digest(code, h)
        h.update(repr(getattr(target, "__defaults__", None)).encode())
        if isinstance(target, types.FunctionType) and target.__closure__:
            h.update(_closure_digest(target).encode())
    elif not hasattr(target, "__qualname__"):  # a callable object: its class and state
        cls = type(target)
        h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
        call_code = getattr(cls.__dict__.get("__call__"), "__code__", None)
        if isinstance(call_code, types.CodeType):
            _code_digest(call_code, h)
        state = getattr(target, "__dict__", None)
        h.update((_fingerprint_value(state) if state else fingerprint_object(target)).encode())
    return h.hexdigest()
