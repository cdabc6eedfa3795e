"""A worker process's environment: its thread limits and the slot it serves.

Made by the driver before the worker starts, so that torch, OpenMP, MKL and OpenBLAS
read it when they load::

    os.environ ─┬─ thread limits (CPUs // workers; variables the user set are kept)
                ├─ the caller's extra variables (``env``)
                └─ per slot: CUDA_VISIBLE_DEVICES and the slot's thread limits
                   (Slot.env()), PARALELA_SLOT, PARALELA_CPU_AFFINITY (``pin_cpus``)

The processes backend and the serve pool build their workers' environments here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from paralela.backends._base import usable_cpus
from paralela.resources import THREAD_VARIABLES, Slot

__all__ = ["AFFINITY_VARIABLE", "SLOT_VARIABLE", "thread_limits_env", "worker_envs"]

# Set by the driver when workers are pinned to their slot's CPUs (read by the worker).
AFFINITY_VARIABLE = "PARALELA_CPU_AFFINITY"
# The index of the slot a pinned worker serves, for tasks that report where they ran.
SLOT_VARIABLE = "PARALELA_SLOT"


def thread_limits_env(workers: int) -> dict[str, str]:
    """Thread-pool sizes (OpenMP, MKL, OpenBLAS...) that keep ``workers`` processes from
    oversubscribing the CPUs this process may use; variables the user set are kept."""
    per_worker = str(max(1, usable_cpus() // max(1, workers)))
    return {var: os.environ.get(var, per_worker) for var in THREAD_VARIABLES}


def worker_envs(
    workers: int,
    slots: Sequence[Slot] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    pin_cpus: bool = False,
) -> list[dict[str, str]]:
    """The environments of ``workers`` worker processes: one per slot (worker ``i`` takes
    ``envs[i % len(envs)]``), or one for all of them without slots.

    Each is this process's environment with the thread limits for ``workers`` and
    ``env`` over it; a slot's GPUs and thread limits (:meth:`Slot.env`) and its index
    go over that, and with ``pin_cpus`` the slot's CPUs for the worker to pin itself to.
    """
    base = {**os.environ, **thread_limits_env(workers), **(env or {})}
    if not slots:
        return [base]
    return [
        {
            **base,
            **slot.env(),
            SLOT_VARIABLE: str(slot.index),
            **({AFFINITY_VARIABLE: ",".join(map(str, slot.cpus))} if pin_cpus else {}),
        }
        for slot in slots
    ]
