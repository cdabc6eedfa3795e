"""Staging: copy a dataset to node-local scratch before a job reads it, and results home.

Shared cluster filesystems (NFS, Lustre, GPFS...) pay a server round trip for every
file opened; a job that reads many small files from them can run hundreds of times
slower than from the node's own disk. :func:`stage` copies SRC there with threads,
verifies every copy, skips what is already up to date, and with ``back=True`` copies
results home::

    from paralela.staging import stage

    data = stage("~/datasets/images").path      # $SLURM_TMPDIR/paralela-stage-ana/images
    ...train on data, write to "results"...
    stage("~/project/results", back=True)       # scratch copy -> ~/project/results

Importing this package is cheap: the modules load when a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.staging._plan import default_dest, scratch_dir
    from paralela.staging._result import StageError, StageResult, VerificationError
    from paralela.staging._stage import default_workers, stage
    from paralela.staging._verify import verify_stage

__all__ = [
    "stage",
    "verify_stage",
    "StageResult",
    "StageError",
    "VerificationError",
    "default_dest",
    "default_workers",
    "scratch_dir",
]

_LAZY = {
    "stage": "paralela.staging._stage",
    "verify_stage": "paralela.staging._verify",
    "default_workers": "paralela.staging._stage",
    "StageResult": "paralela.staging._result",
    "StageError": "paralela.staging._result",
    "VerificationError": "paralela.staging._result",
    "default_dest": "paralela.staging._plan",
    "scratch_dir": "paralela.staging._plan",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.staging' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
