"""The Slurm allocation this process runs in, read from the ``SLURM_*`` variables.

Outside Slurm (no ``SLURM_JOB_ID``) there is no allocation: :func:`detect_slurm`
returns ``None``. A variable that is set but malformed raises :class:`ConfigError`
naming the variable and its value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from paralela.errors import ConfigError

__all__ = ["SlurmAllocation", "detect_slurm", "expand_nodelist"]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm node list into host names.

    Args:
        nodelist: a compressed list such as ``"gpu[01-04,07]"`` or ``"node[1-2],login1"``.

    Returns:
        The host names in order, e.g. ``["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]``.

    Raises:
        ConfigError: the list is malformed (unbalanced brackets, a bad range).
    """
    import hostlist

    try:
        hosts: list[str] = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as exc:
        raise ConfigError(
            f"Cannot read the Slurm node list {nodelist!r}: {exc}. "
            "Expected a list such as 'gpu[01-04,07]' or 'node1,node2'."
        ) from exc
    return hosts


@dataclass(frozen=True)
class SlurmAllocation:
    """The Slurm job (and step) this process is part of.

    Fields are ``None`` (or empty) where Slurm did not set the variable.

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        ntasks: ``SLURM_NTASKS``: tasks in the job step.
        procid: ``SLURM_PROCID``: this task's rank among them.
        localid: ``SLURM_LOCALID``: this task's rank on its node.
        nodeid: ``SLURM_NODEID``: this node's rank in the allocation.
        cpus_per_task: ``SLURM_CPUS_PER_TASK``.
        cpus_on_node: ``SLURM_CPUS_ON_NODE``.
        ntasks_per_node: ``SLURM_NTASKS_PER_NODE``.
        gpus_on_node: ``SLURM_GPUS_ON_NODE``.
        gpu_ids: the node's GPUs given to the step or job (``SLURM_STEP_GPUS``, else
            ``SLURM_JOB_GPUS``), as physical indices.
        nodelist: ``SLURM_NODELIST`` (else ``SLURM_JOB_NODELIST``) as given.
        nodes: the node list expanded into host names.
        tmpdir: node-local scratch: ``SLURM_TMPDIR``, else ``TMPDIR`` within the job.
        array_job_id: ``SLURM_ARRAY_JOB_ID``.
        array_task_id: ``SLURM_ARRAY_TASK_ID``.
    """

    job_id: str
    ntasks: int | None = None
    procid: int | None = None
    localid: int | None = None
    nodeid: int | None = None
    cpus_per_task: int | None = None
    cpus_on_node: int | None = None
    ntasks_per_node: int | None = None
    gpus_on_node: int | None = None
    gpu_ids: tuple[int, ...] = ()
    nodelist: str = ""
    nodes: tuple[str, ...] = ()
    tmpdir: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def nnodes(self) -> int:
        """Number of nodes in the allocation (at least 1: the one this process runs on)."""
        return max(1, len(self.nodes))

    @property
    def is_array(self) -> bool:
        """Whether this is one task of a job array."""
        return self.array_task_id is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["gpu_ids"] = list(self.gpu_ids)
        data["nodes"] = list(self.nodes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmAllocation:
        """Rebuild from :meth:`to_dict`'s output."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["gpu_ids"] = tuple(values.get("gpu_ids", ()))
        values["nodes"] = tuple(values.get("nodes", ()))
        return cls(**values)


def _get(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, with an empty string read as unset."""
    value = env.get(name)
    return value.strip() if value and value.strip() else None


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = _get(env, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(
            f"The Slurm variable {name}={value!r} is not a whole number >= 0. "
            f"Fix or unset {name} in the job script (Slurm itself sets it to a number)."
        )
    return number


def _gpu_ids(env: Mapping[str, str]) -> tuple[int, ...]:
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = _get(env, name)
        if value is None:
            continue
        ids: list[int] = []
        for token in value.split(","):
            lo, _, hi = token.strip().partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ConfigError(
                    f"The Slurm variable {name}={value!r} is not a list of GPU indices "
                    f"(such as '0,1' or '0-3'); {token!r} is not one. Fix or unset {name}."
                )
            ids.extend(range(int(lo), int(hi or lo) + 1))
        return tuple(ids)
    return ()


def detect_slurm(env: Mapping[str, str] | None = None) -> SlurmAllocation | None:
    """Read the Slurm allocation from the environment.

    Args:
        env: the variables to read; ``os.environ`` when ``None``.

    Returns:
        The allocation, or ``None`` outside Slurm (``SLURM_JOB_ID`` unset or empty).

    Raises:
        ConfigError: a ``SLURM_*`` variable is set to a value Slurm would not write
            (``SLURM_NTASKS="abc"``, a malformed node list); the message names it.
    """
    env = os.environ if env is None else env
    job_id = _get(env, "SLURM_JOB_ID")
    if job_id is None:
        return None
    nodelist_var = "SLURM_NODELIST" if _get(env, "SLURM_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = _get(env, nodelist_var) or ""
    try:
        nodes = tuple(expand_nodelist(nodelist)) if nodelist else ()
    except ConfigError as exc:
        raise ConfigError(f"{nodelist_var}: {exc}") from exc
    return SlurmAllocation(
        job_id=job_id,
        ntasks=_int(env, "SLURM_NTASKS"),
        procid=_int(env, "SLURM_PROCID"),
        localid=_int(env, "SLURM_LOCALID"),
        nodeid=_int(env, "SLURM_NODEID"),
        cpus_per_task=_int(env, "SLURM_CPUS_PER_TASK"),
        cpus_on_node=_int(env, "SLURM_CPUS_ON_NODE"),
        ntasks_per_node=_int(env, "SLURM_NTASKS_PER_NODE"),
        gpus_on_node=_int(env, "SLURM_GPUS_ON_NODE"),
        gpu_ids=_gpu_ids(env),
        nodelist=nodelist,
        nodes=nodes,
        tmpdir=_get(env, "SLURM_TMPDIR") or _get(env, "TMPDIR"),
        array_job_id=_int(env, "SLURM_ARRAY_JOB_ID"),
        array_task_id=_int(env, "SLURM_ARRAY_TASK_ID"),
    )
