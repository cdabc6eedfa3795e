"""The memory this process may use: the node's memory (psutil) and its cgroup limit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from paralela.resources._cgroup import cgroup_dirs, read_int_file

__all__ = ["MemoryInfo", "cgroup_memory", "detect_memory"]

# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value
# (9223372036854771712); anything this large is no limit.
_NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class MemoryInfo:
    """Memory of the node and of this process's cgroup, in bytes.

    Attributes:
        total: physical memory of the node.
        available: memory the node can give without swapping (psutil's ``available``).
        cgroup_limit: the cgroup memory limit (v2 ``memory.max``, v1
            ``memory.limit_in_bytes``) when it is lower than ``total``, else ``None``.
        cgroup_usage: memory the cgroup uses now (``memory.current`` /
            ``memory.usage_in_bytes``), when a limit is reported, else ``None``.
    """

    total: int
    available: int
    cgroup_limit: int | None
    cgroup_usage: int | None

    @property
    def limit(self) -> int:
        """The most memory this process's cgroup may hold: the limit, or the node's total."""
        return self.total if self.cgroup_limit is None else self.cgroup_limit

    @property
    def free(self) -> int:
        """Memory that can still be used: the node's available, capped by the cgroup room."""
        if self.cgroup_limit is None:
            return self.available
        room = self.cgroup_limit - (self.cgroup_usage or 0)
        return max(0, min(self.available, room))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields and of ``limit`` and ``free``."""
        return {
            "total": self.total,
            "available": self.available,
            "cgroup_limit": self.cgroup_limit,
            "cgroup_usage": self.cgroup_usage,
            "limit": self.limit,
            "free": self.free,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        return cls(
            int(data["total"]),
            int(data["available"]),
            data["cgroup_limit"],
            data["cgroup_usage"],
        )


def cgroup_memory(root: str | os.PathLike[str] = "/") -> tuple[int | None, int | None]:
    """The cgroup memory limit and usage of this process.

    The limit is the smallest of ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1)
    in the process's cgroup and its ancestors; the usage is read in its own cgroup.

    Args:
        root: the directory that stands for ``/``; tests pass a fake tree.

    Returns:
        ``(limit, usage)`` in bytes; ``limit`` is ``None`` when no limit is set.
    """
    dirs = cgroup_dirs("memory", root)
    limits = []
    for directory in dirs:
        value = read_int_file(directory / "memory.max")
        if value is None:
            value = read_int_file(directory / "memory.limit_in_bytes")
        if value is not None and 0 < value < _NO_LIMIT:
            limits.append(value)
    if not limits:
        return None, None
    usage = None
    if dirs:
        usage = read_int_file(dirs[0] / "memory.current")
        if usage is None:
            usage = read_int_file(dirs[0] / "memory.usage_in_bytes")
    return min(limits), usage


def detect_memory(root: str | os.PathLike[str] = "/") -> MemoryInfo:
    """Detect the node's memory and this process's cgroup limit.

    Args:
        root: the directory that stands for ``/`` when reading cgroup files.

    Returns:
        The memory info; ``cgroup_limit`` only when it is lower than the node's total.
    """
    import psutil

    vm = psutil.virtual_memory()
    limit, usage = cgroup_memory(root)
    if limit is not None and limit >= vm.total:
        limit, usage = None, None
    return MemoryInfo(int(vm.total), int(vm.available), limit, usage)
