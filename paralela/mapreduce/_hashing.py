"""Stable partitioning and one total order of keys, the same in every process.

    partition_of(key, P) = crc32(canonical(key)) % P      (str: crc32(key.encode()) % P)
    order(key)           = (type tag, comparable form)    (used to sort spills, merge them)

Python's ``hash()`` of ``str`` and ``bytes`` changes with every interpreter
(``PYTHONHASHSEED``), so it cannot send a key to the same reduce partition from two map
tasks. :func:`partition_of` hashes a canonical byte encoding instead:

=================================  ==========================================================
key                                canonical bytes
=================================  ==========================================================
``str``                            its UTF-8 (lone surrogates kept: ``surrogatepass``)
``bytes``                          ``b"b"`` + the bytes
``None``                           ``b"n"``
integral number (``1``, ``1.0``,   ``b"i"`` + the decimal digits of the integer
``True``, ``Decimal(1)``)
other real number                  ``b"f"`` + IEEE-754 double when the value is a float
                                   exactly, else ``b"q"`` + ``numerator/denominator``
``tuple`` (namedtuples too)        ``b"t"`` + each element's encoding, length-prefixed
``frozenset``                      ``b"z"`` + the sorted encodings of its elements
anything else                      ``b"p"`` + ``pickle.dumps(key, protocol=4)``
=================================  ==========================================================

Keys that are equal under ``==`` are the same key, as in a ``dict``, ``collections.Counter``
and Spark's ``reduceByKey``: ``1``, ``1.0`` and ``True`` land in one partition, sort
together and reach the reducer as one key (reported as whichever form the merge met
first). The one exception is "anything else": two equal objects whose pickles differ
(a class whose ``__eq__`` ignores some attributes) may reach the reducer as two keys;
give such keys a tuple or string form. Every NaN (``float('nan')``, ``-nan``,
``numpy.nan``, ``Decimal('NaN')``, alone or inside a tuple) is one key, as Spark groups
NaN, although NaN never equals itself: every NaN has the same canonical bytes and the
same :func:`order`, and the merge joins keys of one order (:func:`same_key`).

:func:`order` maps a key to a value that compares with the order of any other key:
``None`` < numbers < NaN < ``str`` < ``bytes`` < tuples (element by element) <
frozensets < everything else (by type name, then canonical bytes). Within one type it is
Python's own order, so a partition of only ``str`` keys is sorted with plain ``sorted``.
"""

from __future__ import annotations

import decimal
import math
import numbers
import pickle
import struct
import zlib
from fractions import Fraction
from typing import Any

__all__ = ["canonical", "order", "partition_of", "same_key"]

_crc32 = zlib.crc32
_REAL = (numbers.Real, decimal.Decimal)  # Decimal is not registered as Real
_NONE_ORDER = (0,)
_NAN_ORDER = (2,)
_NAN_BYTES = b"f" + struct.pack("<d", math.nan)  # every NaN, whatever its sign and payload


def partition_of(key: Any, partitions: int) -> int:
    """The partition, in ``range(partitions)``, that ``key`` belongs to: the same in every
    process, machine and Python run (see the module docstring for the encoding).

    About 0.15 µs for a short ``str``, 1.5 µs for a small tuple; the map side calls it
    once per distinct key per spill, never per pair.

    Raises:
        ValueError: ``partitions`` is less than 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions!r}")
    if type(key) is str:
        return _crc32(key.encode("utf-8", "surrogatepass")) % partitions
    return _crc32(canonical(key)) % partitions


def canonical(key: Any) -> bytes:
    """The bytes :func:`partition_of` hashes: equal keys (``1 == 1.0``) give equal bytes."""
    t = type(key)
    if t is str:
        return key.encode("utf-8", "surrogatepass")  # type: ignore[no-any-return]
    if t is bytes:
        return b"b" + bytes(key)
    if key is None:
        return b"n"
    if t is int or t is bool:
        return b"i%d" % key
    if t is tuple or isinstance(key, tuple):
        parts = [canonical(item) for item in key]
        return b"t" + b"".join(struct.pack("<I", len(p)) + p for p in parts)
    if isinstance(key, str):
        return str(key).encode("utf-8", "surrogatepass")
    if isinstance(key, _REAL):
        return _canonical_real(key)
    if isinstance(key, frozenset):
        parts = sorted(canonical(item) for item in key)
        return b"z" + b"".join(struct.pack("<I", len(p)) + p for p in parts)
    if isinstance(key, bytes):
        return b"b" + bytes(key)
    return b"p" + pickle.dumps(key, protocol=4)


def _canonical_real(key: Any) -> bytes:
    value = float(key)
    if value != value:
        return _NAN_BYTES
    if math.isfinite(value) and key == int(key):
        return b"i%d" % int(key)
    if value == key or not math.isfinite(value):
        return b"f" + struct.pack("<d", value)
    exact = Fraction(key)  # Decimal, Fraction: the exact ratio
    return b"q%d/%d" % (exact.numerator, exact.denominator)


def same_key(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one key: equal under ``==``, or of the same
    :func:`order` form (every NaN, alone or inside a tuple, as Spark groups NaN). Called
    where the merge meets a new key, never per value."""
    return bool(a == b) or order(a) == order(b)


def order(key: Any) -> Any:
    """A sort key that orders any two keys and keeps equal keys next to each other (see
    the module docstring); within one type it is Python's own order."""
    t = type(key)
    if t is str:
        return (3, key)
    if t is int or t is bool:
        return (1, key)
    if t is float:
        return (1, key) if key == key else _NAN_ORDER
    if key is None:
        return _NONE_ORDER
    if t is bytes:
        return (4, key)
    if t is tuple or isinstance(key, tuple):
        return (5, tuple(map(order, key)))
    if isinstance(key, str):
        return (3, str(key))
    if isinstance(key, _REAL):
        return (1, key) if key == key else _NAN_ORDER
    if isinstance(key, bytes):
        return (4, bytes(key))
    if isinstance(key, frozenset):
        return (6, sorted(map(order, key)))
    return (9, type(key).__qualname__, canonical(key))
