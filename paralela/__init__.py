"""paralela: run deep-learning and machine-learning work in parallel, from the cores and
GPUs of one machine to a Slurm cluster, with one API.

Importing it is cheap: optional dependencies (rich, torch, Spark...) load when used.
"""

from paralela._config import UNSET, config
from paralela._version import __version__
from paralela.backends import Backend, Broadcast, Capabilities, available_backends, get_backend
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    MapError,
    MissingExtraError,
    ParalelaError,
    RunStoreError,
    TaskError,
    UnpicklableError,
    WorkerDiedError,
)
from paralela.mapping import ChunkTiming, MapIterator, MapSummary, Results, WorkerStats, imap, map
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
    "MissingExtraError",
]
