"""The hot loop of a map task with a combiner: count each pair of the run value, hand
every other pair on. :func:`count_runs` is the compiled loop (``_speedups.c``) where the
package was built with a C compiler, else :func:`count_runs_python`; both give the same
counts and raise the same exceptions (tests/test_mapreduce_counting.py runs both).

A key's count is a :class:`Tally`, a mutable cell, so that counting a pair is one dict
lookup and an increment in place; with int values each pair cost a second lookup to
store the sum, and a new int object past 256 (over 1.67M prebuilt pairs of the
benchmark's corpus, compiled: 0.11 s of CPU against 0.17 s).

Why compiled: a word count's natural mapper (``for w in line.split(): yield w, 1``)
costs about 0.15 s of CPU a million pairs in the mapper and 0.17 s more in this loop in
Python; compiled, the loop costs ~0.05 s (one run on the project's 2-core VM:
``Counter.update`` per line 0.28 s, the Python loop with the mapper 0.39 s, compiled
0.31-0.33 s over the same 3.6M pairs). Batching the pairs into lists and counting their
keys with ``collections._count_elements`` was measured at about the Python loop's cost:
the passes over each batch cost what the bytecode did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

__all__ = ["COMPILED", "Tally", "TallyPython", "count_runs", "count_runs_python"]


class TallyPython:
    """``Tally(n=0)``: a mutable count, the value type of a runs dict."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Tally({self.n})"


def count_runs_python(
    runs: dict[Any, Any],
    it: Iterator[Any],
    one: Any,
    other: Callable[[Any, Any], object],
    budget: int,
    seen: list[Any],
) -> None:
    """Pull up to ``budget`` items from ``it``; unpack each as ``k, v = item``; count
    ``runs[k].n += 1`` (``runs[k] = Tally(1)`` for a new key) when ``v is one``, else
    call ``other(k, v)``. The values of ``runs`` are the implementation's own
    :class:`Tally`.

    ``seen[0]`` is set to the last item pulled (left as it was when none was), also when
    an exception propagates: the unpacking's TypeError or ValueError, an unhashable key's
    TypeError, or whatever ``it`` or ``other`` raised.
    """
    kv = seen[0]
    get = runs.get
    try:
        for kv in islice(it, budget):
            k, v = kv
            if v is one:
                tally = get(k)
                if tally is None:
                    runs[k] = TallyPython(1)
                else:
                    tally.n += 1
            else:
                other(k, v)
    finally:
        seen[0] = kv


Tally: Any
try:
    from paralela.mapreduce._speedups import Tally, count_runs

    COMPILED = True
except ImportError:  # installed without a C compiler: the same loop, in Python
    Tally = TallyPython
    count_runs = count_runs_python
    COMPILED = False
