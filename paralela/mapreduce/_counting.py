"""The hot loop of a map task with a combiner: count each pair of the run value, hand
every other pair on. :func:`count_runs` is the compiled loop (``_speedups.c``) where the
package was built with a C compiler, else :func:`count_runs_python`; both give the same
counts and raise the same exceptions (tests/test_mapreduce_counting.py runs both).

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

__all__ = ["COMPILED", "count_runs", "count_runs_python"]


def count_runs_python(
    runs: dict[Any, int],
    it: Iterator[Any],
    one: Any,
    other: Callable[[Any, Any], object],
    budget: int,
    seen: list[Any],
) -> None:
    """Pull up to ``budget`` items from ``it``; unpack each as ``k, v = item``; count
    ``runs[k] += 1`` (1 for a new key) when ``v is one``, else call ``other(k, v)``.

    ``seen[0]`` is set to the last item pulled (left as it was when none was), also when
    an exception propagates: the unpacking's TypeError or ValueError, an unhashable key's
    TypeError, or whatever ``it`` or ``other`` raised.
    """
    kv = seen[0]
    try:
        for kv in islice(it, budget):
            k, v = kv
            if v is one:
                try:
                    runs[k] += 1
                except KeyError:
                    runs[k] = 1
            else:
                other(k, v)
    finally:
        seen[0] = kv


try:
    from paralela.mapreduce._speedups import count_runs

    COMPILED = True
except ImportError:  # installed without a C compiler: the same loop, in Python
    count_runs = count_runs_python
    COMPILED = False
