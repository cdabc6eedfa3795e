"""The NVIDIA GPUs this process may use.

::

    NVML (nvidia-ml-py)  ──fails──▶  nvidia-smi --query-gpu  ──fails──▶  no GPU
            │                                 │
            └──────── the node's GPUs ────────┘
                           │
              CUDA_VISIBLE_DEVICES (indices, GPU-/MIG- UUIDs)
                           │
                           ▼
            the GPUs as this process sees them: index 0, 1, ...

When neither probe answers but Slurm granted GPUs to the job (``SLURM_STEP_GPUS``,
``SLURM_JOB_GPUS`` or ``SLURM_GPUS_ON_NODE``, with ``CUDA_VISIBLE_DEVICES`` set by
Slurm), those GPUs are taken as they are, one per ``CUDA_VISIBLE_DEVICES`` id, without
names or memory (source ``"slurm"``): a packed sweep then uses each granted GPU as a slot
even on a node whose driver tools this process cannot run.

Each step of the chain that fails leaves a note saying why (shown by ``paralela
info``), so "no GPU" is never a silent answer. Indices in ``CUDA_VISIBLE_DEVICES``
are read in the order NVML and nvidia-smi number GPUs (PCI bus order), which is CUDA's
order when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GpuInfo", "GpuReport", "detect_gpus", "parse_cuda_visible_devices"]

_MIB = 1024 * 1024
_SMI_TIMEOUT_S = 30
_SMI_QUERY = "--query-gpu=index,uuid,name,memory.total,memory.free"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU (or MIG instance) as this process sees it.

    Attributes:
        index: its CUDA index in this process (after ``CUDA_VISIBLE_DEVICES``).
        physical_index: its index on the node (NVML / nvidia-smi numbering); for a MIG
            instance, the index of the GPU that holds it.
        uuid: ``GPU-...`` or ``MIG-...``.
        name: the product name (``NVIDIA A100-SXM4-40GB``).
        memory_total: memory in bytes, ``None`` where the driver does not report it.
        memory_free: free memory in bytes, ``None`` where the driver does not report it.
    """

    index: int
    physical_index: int
    uuid: str
    name: str
    memory_total: int | None
    memory_free: int | None

    @property
    def device_id(self) -> str:
        """What a child process's ``CUDA_VISIBLE_DEVICES`` must hold to see this GPU.

        The UUID: it names the same device whatever the child's own
        ``CUDA_VISIBLE_DEVICES`` or ``CUDA_DEVICE_ORDER`` was.
        """
        return self.uuid or str(self.physical_index)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        return cls(**data)


@dataclass(frozen=True)
class GpuReport:
    """What GPU detection found, and how.

    Attributes:
        gpus: the GPUs this process sees, in CUDA index order.
        source: ``"nvml"``, ``"nvidia-smi"``, ``"slurm"`` (granted by Slurm, not probed)
            or ``"none"``.
        notes: why a step of the chain failed, or ids in ``CUDA_VISIBLE_DEVICES``
            that CUDA will ignore.
    """

    gpus: tuple[GpuInfo, ...]
    source: str
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Device:
    physical_index: int
    uuid: str
    name: str
    memory_total: int | None
    memory_free: int | None


class _ProbeFailed(Exception):
    """A GPU probe (NVML or nvidia-smi) cannot answer; the message says why."""


def parse_cuda_visible_devices(value: str | None) -> list[str] | None:
    """Split ``CUDA_VISIBLE_DEVICES`` into ids.

    Args:
        value: the variable's value, or ``None`` when unset.

    Returns:
        ``None`` when unset (every GPU is visible); ``[]`` when it hides every GPU
        (``""``, ``"-1"``, ``"NoDevFiles"``); else the ids in order, cut at the first
        ``-1`` as CUDA does.
    """
    if value is None:
        return None
    tokens = [t.strip() for t in value.split(",")] if value.strip() else []
    kept = []
    for token in tokens:
        if token in ("-1", "NoDevFiles"):
            break
        kept.append(token)
    return kept


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_devices() -> tuple[list[_Device], list[_Device]]:
    """The node's GPUs and MIG instances through NVML."""
    try:
        with warnings.catch_warnings():
            # The old 'pynvml' wrapper package warns that it is deprecated on import.
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError as exc:
        raise _ProbeFailed("NVML: nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _ProbeFailed(f"NVML: cannot start ({exc})") from exc
    try:
        gpus, migs = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            gpus.append(_Device(i, uuid, name, int(mem.total), int(mem.free)))
            migs.extend(_nvml_migs(pynvml, handle, i, name))
        return gpus, migs
    except pynvml.NVMLError as exc:
        raise _ProbeFailed(f"NVML: query failed ({exc})") from exc
    finally:
        pynvml.nvmlShutdown()


def _nvml_migs(pynvml: Any, handle: Any, index: int, name: str) -> list[_Device]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return []  # a GPU without MIG support
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    migs = []
    for m in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m)
        except pynvml.NVMLError:
            continue  # an empty MIG slot
        mem = pynvml.nvmlDeviceGetMemoryInfo(mig)
        uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
        mig_name = _text(pynvml.nvmlDeviceGetName(mig)) or f"{name} MIG {m}"
        migs.append(_Device(index, uuid, mig_name, int(mem.total), int(mem.free)))
    return migs


def _run_smi(exe: str, *args: str) -> str:
    try:
        done = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _ProbeFailed(f"nvidia-smi: cannot run {exe} ({exc})") from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise _ProbeFailed(
            f"nvidia-smi: exit code {done.returncode}" + (f" ({said[0]})" if said else "")
        )
    return done.stdout


def _mib(field: str) -> int | None:
    return int(field) * _MIB if field.isdigit() else None  # "[N/A]" on some devices


def _smi_devices(exe: str) -> list[_Device]:
    """The node's GPUs through ``nvidia-smi --query-gpu``."""
    out = _run_smi(exe, _SMI_QUERY, "--format=csv,noheader,nounits")
    gpus = []
    for row in csv.reader(out.splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) < 5 or not row[0].strip().isdigit():
            raise _ProbeFailed(f"nvidia-smi: unexpected output line {','.join(row)!r}")
        index, uuid, name, total, free = (f.strip() for f in row[:5])
        gpus.append(_Device(int(index), uuid, name, _mib(total), _mib(free)))
    return gpus


_SMI_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)")
_SMI_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")


def _smi_migs(exe: str) -> list[_Device]:
    """MIG instances from ``nvidia-smi -L`` (which reports no memory for them)."""
    migs: list[_Device] = []
    parent: tuple[int, str] | None = None
    for line in _run_smi(exe, "-L").splitlines():
        if m := _SMI_GPU_LINE.match(line):
            parent = (int(m.group(1)), m.group(2))
        elif (m := _SMI_MIG_LINE.match(line)) and parent is not None:
            migs.append(_Device(parent[0], m.group(2), f"{parent[1]} MIG {m.group(1)}", None, None))
    return migs


def _resolve(
    ids: list[str], gpus: list[_Device], migs: list[_Device]
) -> tuple[list[_Device], list[str]]:
    """Map ``CUDA_VISIBLE_DEVICES`` ids onto devices the way CUDA does: the first id that
    names no device (or one already named) ends the list."""
    chosen: list[_Device] = []
    for token in ids:
        if token.isdigit():
            found = [d for d in gpus if d.physical_index == int(token)]
        elif token.startswith("GPU-"):
            found = [d for d in gpus if d.uuid.startswith(token)]
        elif token.startswith("MIG-"):
            found = [d for d in migs if d.uuid.startswith(token)]
        else:
            found = []
        if len(found) == 1 and found[0] not in chosen:
            chosen.append(found[0])
            continue
        have = ", ".join(str(d.physical_index) for d in gpus) or "none"
        what = "names a GPU a second time" if found and found[0] in chosen else "is not a GPU"
        return chosen, [
            f"CUDA_VISIBLE_DEVICES id {token!r} {what} of this node (GPUs: {have}); "
            "CUDA ignores it and every id after it. Fix CUDA_VISIBLE_DEVICES to list "
            "GPU indices or UUIDs from `nvidia-smi -L`."
        ]
    return chosen, []


_SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


def _slurm_granted(env: Mapping[str, str], ids: list[str]) -> list[GpuInfo]:
    """The GPUs Slurm granted, one per ``CUDA_VISIBLE_DEVICES`` id, when no probe answered.

    Only inside a Slurm job that was given GPUs (one of :data:`_SLURM_GPU_VARIABLES` set
    and not ``0``): there ``CUDA_VISIBLE_DEVICES`` is Slurm's own. Each id is kept as the
    device a child must be shown: a UUID as ``uuid``, an index as ``physical_index``
    (Slurm numbers the GPUs as the job sees them), so :attr:`GpuInfo.device_id` gives
    the id back unchanged. Ids that are neither (or repeated) give nothing: the list is
    then not Slurm's.
    """
    if not (env.get("SLURM_JOB_ID") or "").strip():
        return []
    if not any((env.get(v) or "").strip() not in ("", "0") for v in _SLURM_GPU_VARIABLES):
        return []
    if len(set(ids)) != len(ids):
        return []
    granted = []
    for i, token in enumerate(ids):
        if token.isdigit():
            uuid, physical = "", int(token)
        elif token.startswith(("GPU-", "MIG-")):
            uuid, physical = token, i
        else:
            return []
        granted.append(GpuInfo(i, physical, uuid, "GPU granted by Slurm (not probed)", None, None))
    return granted


def detect_gpus(env: Mapping[str, str] | None = None, *, use_nvml: bool = True) -> GpuReport:
    """Detect the GPUs this process may use.

    Tries NVML, then ``nvidia-smi`` (looked up on ``env["PATH"]``), then the GPUs a
    Slurm job was granted (``CUDA_VISIBLE_DEVICES`` as Slurm set it, with
    ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``/``SLURM_GPUS_ON_NODE``), then answers "no
    GPU"; then applies ``CUDA_VISIBLE_DEVICES``. No GPU is a valid answer, never an error.

    Args:
        env: the variables to read (``CUDA_VISIBLE_DEVICES``, ``PATH``, ``SLURM_*``);
            ``os.environ`` when ``None``.
        use_nvml: try NVML first (tests turn it off to exercise nvidia-smi).

    Returns:
        The GPUs with the source that found them and notes on what failed.
    """
    env = os.environ if env is None else env
    ids = parse_cuda_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    wants_mig = ids is not None and any(t.startswith("MIG-") for t in ids)
    notes: list[str] = []
    source = "none"
    gpus: list[_Device] = []
    migs: list[_Device] = []
    try:
        if not use_nvml:
            raise _ProbeFailed("NVML: not tried")
        gpus, migs = _nvml_devices()
        source = "nvml"
    except _ProbeFailed as nvml_failed:
        notes.append(str(nvml_failed))
        exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
        try:
            if exe is None:
                raise _ProbeFailed("nvidia-smi: not found on PATH") from None
            gpus = _smi_devices(exe)
            migs = _smi_migs(exe) if wants_mig else []
            source = "nvidia-smi"
        except _ProbeFailed as smi_failed:
            notes.append(str(smi_failed))
            gpus, migs = [], []
    if source == "none" and ids:
        granted = _slurm_granted(env, ids)
        if granted:
            notes.append(
                f"using the {len(granted)} GPU(s) Slurm granted this job "
                f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}) as they are: "
                "no probe could name them or read their memory"
            )
            return GpuReport(tuple(granted), "slurm", tuple(notes))
    if ids is None or not (gpus or migs):
        visible = gpus  # nothing found: CUDA_VISIBLE_DEVICES has nothing to select from
    else:
        visible, problems = _resolve(ids, gpus, migs)
        notes.extend(problems)
        if not ids and gpus:
            notes.append(
                f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} hides the "
                f"node's {len(gpus)} GPU(s) from this process"
            )
    infos = tuple(
        GpuInfo(i, d.physical_index, d.uuid, d.name, d.memory_total, d.memory_free)
        for i, d in enumerate(visible)
    )
    return GpuReport(infos, source, tuple(notes))
