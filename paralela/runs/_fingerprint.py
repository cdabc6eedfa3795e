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


def fingerprint_function(fn: Any) -> str:
    """Digest of a callable: its name and, for Python functions, its code and defaults."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(fn, functools.partial):
        h.update(fingerprint_function(fn.func).encode())
        h.update(fingerprint_object((fn.args, fn.keywords)).encode())
        return h.hexdigest()
    target = getattr(fn, "__func__", fn)  # bound methods: the function
    h.update(f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}".encode())
    code = getattr(target, "__code__", None)
    if isinstance(code, types.CodeType):
        _code_digest(code, h)
        h.update(repr(getattr(target, "__defaults__", None)).encode())
    elif not hasattr(target, "__qualname__"):  # a callable object: its state
        h.update(fingerprint_object(target).encode())
    return h.hexdigest()
