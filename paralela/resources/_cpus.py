"""The CPUs this process may use: its affinity mask and its cgroup CPU quota.

``os.cpu_count()`` counts the node's CPUs, which overstates what a process in a
container, a Slurm job or under ``taskset`` may use. The usable count is the smaller of
the affinity mask and the cgroup quota, rounded up::

    usable = min(len(os.sched_getaffinity(0)), ceil(quota / period))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela.resources._cgroup import cgroup_dirs, read_int_file, read_text_file

__all__ = ["CpuInfo", "cgroup_cpu_quota", "detect_cpus"]


@dataclass(frozen=True)
class CpuInfo:
    """The CPUs this process may use.

    Attributes:
        logical: logical CPUs on the node (``os.cpu_count()``).
        affinity: ids of the CPUs this process may run on (``os.sched_getaffinity``).
        cgroup_quota: the cgroup CPU quota in CPUs (``quota / period``, e.g. ``2.5``), or
            ``None`` when no quota is set.
        usable: how many CPUs to use: ``min(len(affinity), ceil(cgroup_quota))``, at least 1.
    """

    logical: int
    affinity: tuple[int, ...]
    cgroup_quota: float | None
    usable: int

    @property
    def usable_ids(self) -> tuple[int, ...]:
        """The CPU ids slots are made of: the first ``usable`` ids of the affinity mask."""
        return self.affinity[: self.usable]

    @classmethod
    def from_parts(
        cls, logical: int, affinity: tuple[int, ...], cgroup_quota: float | None
    ) -> CpuInfo:
        """Build a :class:`CpuInfo`, computing ``usable`` from the raw parts.

        Args:
            logical: logical CPUs on the node.
            affinity: the affinity mask, as CPU ids.
            cgroup_quota: the cgroup quota in CPUs, or ``None``.

        Returns:
            The info, with ``affinity`` sorted.
        """
        ids = tuple(sorted(affinity))
        usable = len(ids)
        if cgroup_quota is not None:
            usable = min(usable, math.ceil(cgroup_quota))
        return cls(logical, ids, cgroup_quota, max(1, usable))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return {
            "logical": self.logical,
            "affinity": list(self.affinity),
            "cgroup_quota": self.cgroup_quota,
            "usable": self.usable,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CpuInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        return cls(
            int(data["logical"]),
            tuple(int(i) for i in data["affinity"]),
            None if data["cgroup_quota"] is None else float(data["cgroup_quota"]),
            int(data["usable"]),
        )


def _parse_cpu_max(text: str) -> float | None:
    """Parse cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_in(directory: Path) -> float | None:
    cpu_max = read_text_file(directory / "cpu.max")
    if cpu_max is not None:
        return _parse_cpu_max(cpu_max)
    quota = read_int_file(directory / "cpu.cfs_quota_us")
    period = read_int_file(directory / "cpu.cfs_period_us")
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None  # v1 writes -1 for "no quota"
    return quota / period


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The cgroup CPU quota of this process, in CPUs.

    Reads cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in
    the process's cgroup and its ancestors, and keeps the smallest.

    Args:
        root: the directory that stands for ``/``; tests pass a fake tree.

    Returns:
        The quota (``1.5`` means one and a half CPUs of time), or ``None`` when none is set.
    """
    quotas = [q for d in cgroup_dirs("cpu", root) if (q := _quota_in(d)) is not None]
    return min(quotas) if quotas else None


def _affinity() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    # Platforms without affinity (macOS): every CPU of the machine.
    return tuple(range(os.cpu_count() or 1))


def detect_cpus(root: str | os.PathLike[str] = "/") -> CpuInfo:
    """Detect the CPUs this process may use.

    Args:
        root: the directory that stands for ``/`` when reading cgroup files.

    Returns:
        The affinity mask, the cgroup quota and the usable count.
    """
    affinity = _affinity()
    return CpuInfo.from_parts(os.cpu_count() or len(affinity), affinity, cgroup_cpu_quota(root))
