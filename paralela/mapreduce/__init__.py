"""MapReduce: map, combine, shuffle by key, reduce (see docs/mapreduce.md).

``paralela.mapreduce(mapper, reducer, inputs, ...)`` runs on this machine's processes
(default), threads, a plain loop, Slurm array jobs (the local engine, written over the
backend seam and ``paralela.imap``), or on Apache Spark (``engine="spark"``).

The package shares its name with the function: ``import paralela.mapreduce`` makes
``paralela.mapreduce`` this module, so the module is callable too and
``paralela.mapreduce(...)`` runs a job either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from paralela.mapreduce._api import mapreduce, parse_size
from paralela.mapreduce._result import MapReduceResult, MapReduceSummary

__all__ = ["MapReduceResult", "MapReduceSummary", "mapreduce", "parse_size"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> MapReduceResult:
        return mapreduce(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
