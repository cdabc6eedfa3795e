"""What runs in a worker, what it sends back, and how a failure travels (above backends/).

::

    map:        run_chunk(Job, start, items) ──> ChunkOutcome(results, [ItemFailure])
                  an ItemFailure keeps the user's exception (pickled when it can be
                  rebuilt), its type, message, item repr and traceback text
    mapreduce,  raise carry(error, cause) ──> TaskFailed ── pickle ──> driver:
    predict:      raise failed.reraise()  (the paralela error; the user's exception as
                  its cause; the worker's traceback under that)

Workers import this package, and :mod:`paralela.backends`, only; it is light.
"""

from __future__ import annotations

from paralela.tasks._chunk import HOST, ChunkOutcome, ItemFailure, Job, run_chunk, short_repr
from paralela.tasks._failure import TaskFailed, carry, exception_bytes

__all__ = [
    # map's chunks
    "Job",
    "run_chunk",
    "ChunkOutcome",
    "ItemFailure",
    "HOST",
    # one failure carrier
    "TaskFailed",
    "carry",
    "exception_bytes",
    # messages
    "short_repr",
]
