"""What this process may use, and the slots made from it (layer 1 of paralela).

:func:`detect` reads the CPUs (affinity and cgroup quota), memory (node and cgroup),
GPUs (NVML, else nvidia-smi, else none; after ``CUDA_VISIBLE_DEVICES``), the Slurm
allocation and the filesystems into one :class:`Resources`. :func:`make_slots` splits
those into :class:`Slot` s, each knowing the environment that pins a task to it.

Importing this package is cheap: each name loads its module on first use (PEP 562), so
a worker's environment (``Slot``, ``THREAD_VARIABLES``) costs no detection code; psutil,
python-hostlist and nvidia-ml-py load only when :func:`detect` runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.resources._advice import advise_filesystems
    from paralela.resources._cpus import CpuInfo, detect_cpus
    from paralela.resources._detect import Resources, detect
    from paralela.resources._detect_slots import SlotResources, detect_for_slots
    from paralela.resources._filesystems import FilesystemInfo, filesystem_of
    from paralela.resources._gpus import GpuInfo, detect_gpus
    from paralela.resources._memory import MemoryInfo, detect_memory
    from paralela.resources._mounts import read_mounts
    from paralela.resources._render import format_bytes, print_report
    from paralela.resources._slots import THREAD_VARIABLES, Slot, make_slots
    from paralela.resources._slurm import SlurmAllocation, detect_slurm, expand_nodelist

__all__ = [
    # detection
    "detect",
    "Resources",
    "CpuInfo",
    "MemoryInfo",
    "GpuInfo",
    "SlurmAllocation",
    "FilesystemInfo",
    "expand_nodelist",
    # one part at a time
    "detect_cpus",
    "detect_memory",
    "detect_gpus",
    "detect_slurm",
    "filesystem_of",
    "read_mounts",
    # advice and the report of `paralela info`
    "advise_filesystems",
    "print_report",
    "format_bytes",
    # slots
    "detect_for_slots",
    "SlotResources",
    "make_slots",
    "Slot",
    "THREAD_VARIABLES",
]

# Each public name and the module it lives in, imported on first use.
_LAZY: dict[str, str] = {
    "advise_filesystems": "_advice",
    "CpuInfo": "_cpus",
    "detect_cpus": "_cpus",
    "Resources": "_detect",
    "detect": "_detect",
    "SlotResources": "_detect_slots",
    "detect_for_slots": "_detect_slots",
    "FilesystemInfo": "_filesystems",
    "filesystem_of": "_filesystems",
    "GpuInfo": "_gpus",
    "detect_gpus": "_gpus",
    "MemoryInfo": "_memory",
    "detect_memory": "_memory",
    "read_mounts": "_mounts",
    "format_bytes": "_render",
    "print_report": "_render",
    "THREAD_VARIABLES": "_slots",
    "Slot": "_slots",
    "make_slots": "_slots",
    "SlurmAllocation": "_slurm",
    "detect_slurm": "_slurm",
    "expand_nodelist": "_slurm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.resources' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"paralela.resources.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
