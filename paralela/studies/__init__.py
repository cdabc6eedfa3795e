"""Optuna studies on disk, shared by ``paralela.sweeping`` and ``paralela.comparing``:
where a study lives, how it is opened, its sampler and pruner, and recovery after a
driver died::

    run_dir, storage= ──choose_storage──> StorageChoice(spec)   SQLite in the run
        directory; a URL; a journal file where the run directory is on a network
        filesystem (SQLite's locking is unsafe there)
    spec ──open_storage──> an Optuna storage (SQLite in WAL mode, created fast)
    name ──make_sampler / make_pruner──> Optuna's objects (SAMPLERS, PRUNERS)
    study ──recover_interrupted──> trials a dead driver left RUNNING: failed, each
        queued for one re-run (DRIVER_ATTR, INTERRUPTED_ATTR, RERUN_ATTR, UNUSED_ATTR)
    with storage_errors(run_dir): ... ──> a full disk, a read-only directory:
        RunStoreError naming the path and the real cause

Contract: a bad storage, sampler or pruner name raises
:class:`~paralela.errors.ConfigError`; a missing Optuna raises
:class:`~paralela.errors.MissingExtraError` naming ``paralela[sweep]``. Importing this
package is cheap: Optuna, SQLite and SQLAlchemy load when a study is opened. Imports
``paralela.resources`` (the filesystem of the run directory) and nothing above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.studies._disk import storage_errors, storage_problem
    from paralela.studies._study import (
        DRIVER_ATTR,
        INTERRUPTED_ATTR,
        PRUNERS,
        RERUN_ATTR,
        SAMPLERS,
        UNUSED_ATTR,
        StorageChoice,
        alembic_head,
        choose_storage,
        driver_identity,
        import_optuna,
        make_pruner,
        make_sampler,
        open_storage,
        recover_interrupted,
        requeue_interrupted,
    )

__all__ = [
    "DRIVER_ATTR",
    "INTERRUPTED_ATTR",
    "PRUNERS",
    "RERUN_ATTR",
    "SAMPLERS",
    "UNUSED_ATTR",
    "StorageChoice",
    "alembic_head",
    "choose_storage",
    "driver_identity",
    "import_optuna",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "recover_interrupted",
    "requeue_interrupted",
    "storage_errors",
    "storage_problem",
]

_LAZY = {
    "storage_errors": "paralela.studies._disk",
    "storage_problem": "paralela.studies._disk",
    **dict.fromkeys(
        (n for n in __all__ if n not in ("storage_errors", "storage_problem")),
        "paralela.studies._study",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.studies' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
