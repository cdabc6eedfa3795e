"""How a map task reads its records and names what it covers: batches of blocks for a
batched mapper, a task's description, the length of a record quoted in an error.
Shared by the map task (``._tasks``) and the search for an unpicklable pair
(``._pickling``), which reads the same records again."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

__all__ = ["RECORD_REPR", "batch_blocks", "describe", "gathered"]

# Characters of a record's repr quoted in an error.
RECORD_REPR = 200

#: A batched mapper's batch of a text, jsonl or csv file: blocks of lines (``BLOCK_BYTES``,
#: 1 MiB, each) joined up to ``memory_limit / BATCH_SHARE`` bytes, at most
#: MAX_BATCH_BYTES. Larger batches hand the shuffle fewer pairs: a word count's Counter
#: over the 12.5 MB files of bench/bench_mapreduce.py's corpus holds 127k pairs a file
#: in 4 MiB batches, 49k in one 12.5 MB batch (map tasks of 4 files: 1.12 s vs 0.98 s).
#: A batch costs ~2.6x its bytes in Python strings while the mapper runs (tracemalloc:
#: 31 MiB for 12 MiB of lines), so 16 MiB stays under 5 % of a 1 GiB memory_limit.
BATCH_SHARE = 32
MAX_BATCH_BYTES = 16 << 20
_BLOCK_FORMATS = ("text", "jsonl", "csv")  # batches of ~1 MiB; Parquet's are already large


def batch_blocks(memory_limit: int) -> int:
    """How many 1 MiB blocks of lines a batched mapper gets at once under ``memory_limit``."""
    from paralela.files import BLOCK_BYTES

    return max(1, min(MAX_BATCH_BYTES, memory_limit // BATCH_SHARE) // BLOCK_BYTES)


def gathered(batches: Iterator[list[Any]], fmt: str, blocks: int) -> Iterator[list[Any]]:
    """``batches`` joined ``blocks`` at a time for formats read in blocks."""
    if fmt not in _BLOCK_FORMATS or blocks <= 1:
        yield from batches
        return
    while True:
        joined: list[Any] = []
        for part in itertools.islice(batches, blocks):
            joined += part
        if not joined:
            return
        yield joined


def describe(splits: tuple[Any, ...]) -> str:
    """What a map task covers: its split, or its first split and how many more."""
    if len(splits) == 1:
        return str(splits[0].describe())
    return f"{splits[0].describe()} and {len(splits) - 1} more split(s)"
