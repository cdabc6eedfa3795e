"""What the map side's buffer asks of a pair: is it a usable ``(key, value)`` pair (the
errors a mapper's bad pair raises), and about how many bytes it holds (``_size``).
Used by :mod:`._spill`."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from itertools import chain, islice
from typing import Any, NoReturn

from paralela.errors import UserFunctionError
from paralela.mapreduce._segments import short

__all__ = ["CHECKED_PAIRS", "NOTHING", "check_first", "pair_problem", "raise_pair_error", "size"]

#: No item yet (an empty iterator), or no pair to blame.
NOTHING: Any = object()

#: The first pairs of a map task are each checked (:func:`check_first`) before use: the
#: buffer's hot loops unpack ``k, v = kv``, which also takes any other 2-item iterable (a
#: 2-character string: ``yield line[i:i + 2]`` without its value would count key 'a' with
#: value 'b'), and check the type of only the last pair of each stretch. A mapper yields
#: pairs of one shape: a wrong one shows in its first pairs. Checking every pair cost
#: ~10 % of the loop.
CHECKED_PAIRS = 1024


def check_first(pairs: Iterable[Any], count: int) -> tuple[Iterable[Any], int]:
    """``pairs`` (a list, or an iterator), whose first ``count`` items were each checked
    to be a usable pair, and how many were checked (fewer: ``pairs`` ran out).

    Raises:
        UserFunctionError: an item is not a 2-tuple or 2-list with a hashable key.
    """
    head = pairs[:count] if type(pairs) is list else list(islice(pairs, count))
    for item in head:
        problem = pair_problem(item)
        if problem is not None:
            raise UserFunctionError(problem, function="mapper")
    if type(pairs) is list:
        return pairs, len(head)
    return (chain(head, pairs) if len(head) == count else head), len(head)


def size(obj: Any) -> int:
    """``getsizeof`` plus, for tuples and lists, that of their first few items scaled."""
    size = sys.getsizeof(obj)
    if type(obj) is tuple or type(obj) is list:
        head = obj[:8]
        if head:
            size += sum(map(sys.getsizeof, head)) * len(obj) // len(head)
    return size


def raise_pair_error(exc: BaseException, item: Any) -> NoReturn:
    """Raise the error for ``exc``, raised while adding ``item``: a UserFunctionError when
    ``item`` is not a usable pair, else ``exc`` itself (the user's iterator raised it)."""
    tb = exc.__traceback__
    problem = None if item is NOTHING else pair_problem(item)
    if problem is None or (tb is not None and tb.tb_next is not None):
        raise exc
    raise UserFunctionError(problem, function="mapper") from None


def pair_problem(item: Any) -> str | None:
    """Why ``item`` is not a usable pair, or None when it is one."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        kind = type(item).__name__
        length = f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""
        return (
            f"The mapper yielded {short(item)} (a {kind}{length}), not a (key, value) "
            "pair; a mapper yields 2-tuples, e.g. `yield word, 1`, or returns a list of them."
        )
    try:
        hash(item[0])
    except TypeError:
        return (
            f"The mapper yielded a pair whose key {short(item[0])} is unhashable (type "
            f"{type(item[0]).__name__}); keys must be hashable: use a tuple instead of a "
            "list, a frozenset instead of a set."
        )
    return None
