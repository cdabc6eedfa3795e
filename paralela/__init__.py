"""paralela: run deep-learning and machine-learning work in parallel, from the cores and
GPUs of one machine to a Slurm cluster, with one API.

Importing it is cheap: optional dependencies (rich, torch, Spark...) load when used.
"""

from __future__ import annotations

import importlib

from paralela._version import __version__

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from paralela._config import UNSET, config
    from paralela.backends import Backend, Broadcast, Capabilities, available_backends, get_backend
    from paralela.comparing import CompareError, CompareResult, compare
    from paralela.distributed import LaunchResult, launch
    from paralela.errors import (
        ConfigError,
        DistributedError,
        FingerprintMismatchError,
        InputError,
        MapError,
        MapReduceError,
        MissingExtraError,
        ParalelaError,
        RankFailedError,
        RendezvousError,
        RunStoreError,
        TaskError,
        UnpicklableError,
        UserFunctionError,
        WorkerDiedError,
    )
    from paralela.mapping import (
        ChunkTiming,
        MapIterator,
        MapSummary,
        Results,
        WorkerStats,
        imap,
        map,
    )
    from paralela.mapreduce import MapReduceResult, MapReduceSummary, mapreduce
    from paralela.reporting import RunReport, write_report
    from paralela.resources import (
        THREAD_VARIABLES,
        CpuInfo,
        FilesystemInfo,
        GpuInfo,
        MemoryInfo,
        Resources,
        Slot,
        SlurmAllocation,
        detect,
        expand_nodelist,
        make_slots,
    )
    from paralela.runs import RunStore
    from paralela.scaling import (
        ScalingError,
        ScalingResult,
        fit_amdahl,
        fit_gustafson,
        load_scaling,
        measure,
    )
    from paralela.serving import PredictResult, predict, serve
    from paralela.staging import StageError, StageResult, VerificationError, stage, verify_stage
    from paralela.sweeping import (
        Categorical,
        Choice,
        Fixed,
        Float,
        Grid,
        Int,
        Space,
        SweepError,
        SweepResult,
        TrialPruned,
        TrialRecord,
        current_params,
        load_space,
        report,
        sweep,
    )


# Every public name, and the module it lives in: loaded on first use, so that
# `import paralela` (and every worker start) stays cheap.
_LAZY: dict[str, str] = {
    "UNSET": "paralela._config",
    "config": "paralela._config",
    "Backend": "paralela.backends",
    "Broadcast": "paralela.backends",
    "Capabilities": "paralela.backends",
    "available_backends": "paralela.backends",
    "get_backend": "paralela.backends",
    "ConfigError": "paralela.errors",
    "DistributedError": "paralela.errors",
    "RankFailedError": "paralela.errors",
    "RendezvousError": "paralela.errors",
    "launch": "paralela.distributed",
    "LaunchResult": "paralela.distributed",
    "FingerprintMismatchError": "paralela.errors",
    "MapError": "paralela.errors",
    "MissingExtraError": "paralela.errors",
    "ParalelaError": "paralela.errors",
    "RunStoreError": "paralela.errors",
    "TaskError": "paralela.errors",
    "UnpicklableError": "paralela.errors",
    "WorkerDiedError": "paralela.errors",
    "MapReduceError": "paralela.errors",
    "InputError": "paralela.errors",
    "UserFunctionError": "paralela.errors",
    "mapreduce": "paralela.mapreduce",
    "MapReduceResult": "paralela.mapreduce",
    "MapReduceSummary": "paralela.mapreduce",
    "ChunkTiming": "paralela.mapping",
    "MapIterator": "paralela.mapping",
    "MapSummary": "paralela.mapping",
    "Results": "paralela.mapping",
    "WorkerStats": "paralela.mapping",
    "imap": "paralela.mapping",
    "map": "paralela.mapping",
    "THREAD_VARIABLES": "paralela.resources",
    "CpuInfo": "paralela.resources",
    "FilesystemInfo": "paralela.resources",
    "GpuInfo": "paralela.resources",
    "MemoryInfo": "paralela.resources",
    "Resources": "paralela.resources",
    "Slot": "paralela.resources",
    "SlurmAllocation": "paralela.resources",
    "detect": "paralela.resources",
    "expand_nodelist": "paralela.resources",
    "make_slots": "paralela.resources",
    "RunStore": "paralela.runs",
    "compare": "paralela.comparing",
    "CompareResult": "paralela.comparing",
    "CompareError": "paralela.comparing",
    "predict": "paralela.serving",
    "PredictResult": "paralela.serving",
    "serve": "paralela.serving",
    **dict.fromkeys(
        ("measure", "fit_amdahl", "fit_gustafson", "ScalingResult", "ScalingError", "load_scaling"),
        "paralela.scaling",
    ),
    "write_report": "paralela.reporting",
    "RunReport": "paralela.reporting",
    **dict.fromkeys(
        ("stage", "verify_stage", "StageResult", "StageError", "VerificationError"),
        "paralela.staging",
    ),
    **dict.fromkeys(
        (
            "sweep",
            "report",
            "current_params",
            "TrialPruned",
            "SweepResult",
            "TrialRecord",
            "SweepError",
            "Space",
            "Float",
            "Int",
            "Categorical",
            "Choice",
            "Fixed",
            "Grid",
            "load_space",
        ),
        "paralela.sweeping",
    ),
}

__all__ = [
    "__version__",
    # data-parallel map
    "map",
    "imap",
    "Results",
    "MapIterator",
    "MapSummary",
    "WorkerStats",
    "ChunkTiming",
    # MapReduce
    "mapreduce",
    "MapReduceResult",
    "MapReduceSummary",
    # batch prediction with a model class
    "predict",
    "PredictResult",
    # serving a model class over HTTP
    "serve",
    # hyperparameter sweeps
    "sweep",
    "report",
    "current_params",
    "TrialPruned",
    "SweepResult",
    "TrialRecord",
    "SweepError",
    "Space",
    "Float",
    "Int",
    "Categorical",
    "Choice",
    "Fixed",
    "Grid",
    "load_space",
    # model comparison (cross-validation of many estimators and grids)
    "compare",
    "CompareResult",
    "CompareError",
    # distributed training (strategies in paralela.distributed)
    "launch",
    "LaunchResult",
    # scaling analysis
    "measure",
    "fit_amdahl",
    "fit_gustafson",
    "ScalingResult",
    "ScalingError",
    "load_scaling",
    # run reports
    "write_report",
    "RunReport",
    # data staging to node-local scratch
    "stage",
    "verify_stage",
    "StageResult",
    # configuration
    "config",
    "UNSET",
    # resources and slots
    "detect",
    "Resources",
    "CpuInfo",
    "MemoryInfo",
    "GpuInfo",
    "SlurmAllocation",
    "FilesystemInfo",
    "expand_nodelist",
    "make_slots",
    "Slot",
    "THREAD_VARIABLES",
    # backends
    "Backend",
    "Broadcast",
    "Capabilities",
    "available_backends",
    "get_backend",
    # run store
    "RunStore",
    # errors
    "ParalelaError",
    "ConfigError",
    "UnpicklableError",
    "TaskError",
    "MapError",
    "WorkerDiedError",
    "RunStoreError",
    "FingerprintMismatchError",
    "DistributedError",
    "RendezvousError",
    "RankFailedError",
    "StageError",
    "VerificationError",
    "MissingExtraError",
    "MapReduceError",
    "InputError",
    "UserFunctionError",
]


# Sub-packages reached as attributes (``paralela.data.Pipeline``), imported on first use.
_SUBPACKAGES = ("data",)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"paralela.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
