"""Everything this process may use, in one :class:`Resources` value."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paralela.resources._cpus import CpuInfo, detect_cpus
from paralela.resources._filesystems import FilesystemInfo, detect_filesystems
from paralela.resources._gpus import GpuInfo, detect_gpus
from paralela.resources._memory import MemoryInfo, detect_memory
from paralela.resources._slurm import SlurmAllocation, detect_slurm

__all__ = ["Resources", "detect"]


@dataclass(frozen=True)
class Resources:
    """What this process may use on this host.

    Attributes:
        host: the host name.
        cpus: the CPUs (affinity and cgroup quota).
        memory: the memory (node and cgroup).
        gpus: the GPUs as this process sees them, in CUDA index order; empty for none.
        gpu_source: how the GPUs were found: ``"nvml"``, ``"nvidia-smi"`` or ``"none"``.
        gpu_notes: why a GPU probe failed, or ids in ``CUDA_VISIBLE_DEVICES`` CUDA ignores.
        slurm: the Slurm allocation, ``None`` outside Slurm.
        filesystems: the working, temporary and (inside Slurm, if set) scratch
            directories' filesystems.
    """

    host: str
    cpus: CpuInfo
    memory: MemoryInfo
    gpus: tuple[GpuInfo, ...]
    gpu_source: str
    gpu_notes: tuple[str, ...]
    slurm: SlurmAllocation | None
    filesystems: tuple[FilesystemInfo, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists, not tuples, so that it survives a JSON round trip)."""
        return {
            "host": self.host,
            "cpus": self.cpus.to_dict(),
            "memory": self.memory.to_dict(),
            "gpus": [g.to_dict() for g in self.gpus],
            "gpu_source": self.gpu_source,
            "gpu_notes": list(self.gpu_notes),
            "slurm": None if self.slurm is None else self.slurm.to_dict(),
            "filesystems": [f.to_dict() for f in self.filesystems],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Resources:
        """Rebuild from :meth:`to_dict`'s output (for example sent back by a remote node).

        Args:
            data: the dict, possibly after a JSON round trip.

        Returns:
            An equal :class:`Resources`.
        """
        return cls(
            host=str(data["host"]),
            cpus=CpuInfo.from_dict(data["cpus"]),
            memory=MemoryInfo.from_dict(data["memory"]),
            gpus=tuple(GpuInfo.from_dict(g) for g in data["gpus"]),
            gpu_source=str(data["gpu_source"]),
            gpu_notes=tuple(data["gpu_notes"]),
            slurm=None if data["slurm"] is None else SlurmAllocation.from_dict(data["slurm"]),
            filesystems=tuple(FilesystemInfo.from_dict(f) for f in data["filesystems"]),
        )


def detect(env: Mapping[str, str] | None = None) -> Resources:
    """Detect what this process may use.

    Reads the affinity mask, cgroup limits, memory, GPUs (NVML, else nvidia-smi, else
    none), the Slurm allocation and the filesystems. Takes well under a second without
    GPUs; NVML start-up can add a second or two on a GPU node.

    Args:
        env: the environment to read ``SLURM_*``, ``CUDA_VISIBLE_DEVICES`` and ``PATH``
            from; ``os.environ`` when ``None``.

    Returns:
        The resources.

    Raises:
        ConfigError: a ``SLURM_*`` variable is malformed (the message names it).
    """
    env = os.environ if env is None else env
    slurm = detect_slurm(env)
    gpu_report = detect_gpus(env)
    return Resources(
        host=socket.gethostname(),
        cpus=detect_cpus(),
        memory=detect_memory(),
        gpus=gpu_report.gpus,
        gpu_source=gpu_report.source,
        gpu_notes=gpu_report.notes,
        slurm=slurm,
        filesystems=detect_filesystems(scratch=slurm.tmpdir if slurm else None),
    )
