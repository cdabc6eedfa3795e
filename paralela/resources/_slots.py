"""Slots: the CPUs and GPUs one task may use, and the environment that pins it there.

::

    Resources: CPUs 0-7, GPUs 0 1 2
        │  make_slots(gpus_per_slot=1, slots_per_gpu=2)
        ▼
    slot 0: CPUs 0,1  GPU 0     slot 3: CPUs 5    GPU 0     (8 CPUs over 6 slots:
    slot 1: CPUs 2,3  GPU 1     slot 4: CPUs 6    GPU 1      the first ones get 2)
    slot 2: CPUs 4    GPU 2     slot 5: CPUs 7    GPU 2
        │  slot.env() / slot.apply()
        ▼
    CUDA_VISIBLE_DEVICES=<its GPU UUID>  OMP_NUM_THREADS=<its CPUs> ...  (+ affinity if pinned)

Slots are handed out round robin over the GPUs, so the first ``n`` slots spread over
as many GPUs as they can. A sweep runs one trial per slot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError

if TYPE_CHECKING:  # only named in annotations: importing _slots stays cheap (worker envs)
    from paralela.resources._detect import Resources
    from paralela.resources._detect_slots import SlotResources
    from paralela.resources._gpus import GpuInfo

__all__ = ["THREAD_VARIABLES", "Slot", "make_slots"]

#: The variables that size the thread pools of OpenMP, MKL, OpenBLAS, numexpr and
#: Apple's Accelerate; a slot sets each to its number of CPUs.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


@dataclass(frozen=True)
class Slot:
    """A set of CPUs and GPUs on one host, for one task at a time.

    Attributes:
        host: the host the CPUs and GPUs are on.
        cpus: CPU ids (as ``os.sched_getaffinity`` numbers them); slots share CPUs only
            when there are more slots than CPUs.
        gpus: GPU ids as the process that made the slot sees them (``"0"``, ``"2"``);
            empty for a CPU-only slot.
        index: the slot's number among those made together.
        cuda_devices: what the task's ``CUDA_VISIBLE_DEVICES`` holds; ``None`` means
            ``gpus`` itself. :func:`make_slots` puts the GPUs' UUIDs here, which name
            the same devices whatever ``CUDA_VISIBLE_DEVICES`` the parent had.
    """

    host: str
    cpus: tuple[int, ...]
    gpus: tuple[str, ...] = ()
    index: int = 0
    cuda_devices: tuple[str, ...] | None = None

    @property
    def threads(self) -> int:
        """Threads a task should use: the number of the slot's CPUs, at least 1."""
        return max(1, len(self.cpus))

    def env(self) -> dict[str, str]:
        """The environment variables that pin a task to this slot.

        Returns:
            ``CUDA_VISIBLE_DEVICES`` (comma list; ``""`` for a slot without GPU, which
            hides every GPU from the task), ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA then
            numbers GPUs as nvidia-smi does), and each of :data:`THREAD_VARIABLES` set
            to :attr:`threads`.
        """
        devices = self.gpus if self.cuda_devices is None else self.cuda_devices
        env = {"CUDA_VISIBLE_DEVICES": ",".join(devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        env.update(dict.fromkeys(THREAD_VARIABLES, str(self.threads)))
        return env

    def apply(self, *, pin: bool = False) -> None:
        """Pin the current process to this slot.

        Sets :meth:`env` in ``os.environ``. Call it in the task's process before it
        imports torch, TensorFlow or numpy: they read these variables once, at import or
        first use.

        Args:
            pin: also restrict the process to the slot's CPUs (``os.sched_setaffinity``).

        Raises:
            ConfigError: ``pin=True`` but the CPUs cannot be set (not allowed to this
                process, or no affinity support on this platform).
        """
        os.environ.update(self.env())
        if not pin or not self.cpus:
            return
        if not hasattr(os, "sched_setaffinity"):
            raise ConfigError(
                "Cannot pin to CPUs: this platform has no os.sched_setaffinity. Use pin=False."
            )
        try:
            os.sched_setaffinity(0, self.cpus)
        except OSError as exc:
            allowed = sorted(os.sched_getaffinity(0))
            raise ConfigError(
                f"Cannot pin this process to CPUs {list(self.cpus)}: {exc}. It may use "
                f"CPUs {allowed}; make the slots from this process's resources, or use "
                "pin=False."
            ) from exc

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields, the thread count and the environment."""
        return {
            "index": self.index,
            "host": self.host,
            "cpus": list(self.cpus),
            "gpus": list(self.gpus),
            "cuda_devices": None if self.cuda_devices is None else list(self.cuda_devices),
            "threads": self.threads,
            "env": self.env(),
        }


def _whole(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {value!r}.")
    return value


def _describe_gpus(resources: Resources | SlotResources) -> str:
    if not resources.gpus:
        why = "; ".join(resources.gpu_notes)
        return "no GPU is visible to this process" + (f" ({why})" if why else "")
    listed = ", ".join(f"{g.index} ({g.name})" for g in resources.gpus)
    return f"the visible GPUs are {listed}"


def _select_gpus(
    resources: Resources | SlotResources, gpus: str | Sequence[str | int]
) -> list[GpuInfo]:
    """The GPUs named by ``gpus`` (indices as this process sees them, or UUIDs)."""
    raw = gpus.split(",") if isinstance(gpus, str) else [str(g) for g in gpus]
    tokens = [t.strip() for t in raw if t.strip()]
    if not tokens:
        raise ConfigError(
            f"gpus={gpus!r} names no GPU. Give GPU indices such as '0,2', or leave gpus "
            f"out to use every visible GPU; {_describe_gpus(resources)}."
        )
    chosen: list[GpuInfo] = []
    for token in tokens:
        found = [g for g in resources.gpus if token in (str(g.index), g.uuid)]
        if not found:
            raise ConfigError(
                f"GPU {token!r} in gpus={gpus!r} is not visible to this process; "
                f"{_describe_gpus(resources)}. Name GPUs from that list (as `paralela "
                "info` shows them), or check CUDA_VISIBLE_DEVICES."
            )
        if found[0] in chosen:
            raise ConfigError(f"GPU {token!r} appears twice in gpus={gpus!r}; name it once.")
        chosen.append(found[0])
    return chosen


def _split_cpus(ids: tuple[int, ...], n: int, per_slot: int | None) -> list[tuple[int, ...]]:
    """Share ``ids`` among ``n`` slots: disjoint and as even as possible, or round robin
    (one CPU each, shared) when there are more slots than CPUs."""
    if not ids:
        return [()] * n
    if per_slot is not None:
        if n * per_slot > len(ids):
            raise ConfigError(
                f"{n} slot(s) x cpus_per_slot={per_slot} need {n * per_slot} CPUs, but this "
                f"process may use {len(ids)} (CPU ids {list(ids)}). Lower n_slots or "
                "cpus_per_slot, or leave cpus_per_slot out to share the CPUs evenly."
            )
        return [ids[j * per_slot : (j + 1) * per_slot] for j in range(n)]
    if n > len(ids):
        return [(ids[j % len(ids)],) for j in range(n)]
    base, extra = divmod(len(ids), n)
    out, start = [], 0
    for j in range(n):
        size = base + (1 if j < extra else 0)
        out.append(ids[start : start + size])
        start += size
    return out


def make_slots(
    resources: Resources | SlotResources,
    *,
    n_slots: int | None = None,
    cpus_per_slot: int | None = None,
    gpus_per_slot: int = 0,
    slots_per_gpu: int = 1,
    gpus: str | Sequence[str | int] | None = None,
) -> list[Slot]:
    """Split this process's CPUs and GPUs into slots, one task per slot at a time.

    Without GPUs (``gpus_per_slot=0``) there is one slot per usable CPU, or ``n_slots``
    slots. With GPUs, each slot gets ``gpus_per_slot`` GPUs, and each GPU (or group of
    GPUs) is shared by ``slots_per_gpu`` slots (several small models per GPU); slots
    go round robin over the GPUs. Naming ``gpus`` or ``slots_per_gpu > 1`` implies at
    least one GPU per slot. The usable CPUs are split evenly over the slots, disjoint,
    or ``cpus_per_slot`` each; with more slots than CPUs, slots share CPUs round robin
    with one thread each.

    Args:
        resources: what this process may use (:func:`detect`, or
            :func:`detect_for_slots`: the CPUs and GPUs only).
        n_slots: how many slots; default: as many as the CPUs (or GPUs x
            ``slots_per_gpu``) allow. With GPUs, at most that many.
        cpus_per_slot: CPUs per slot; default: an even share.
        gpus_per_slot: GPUs per slot; 0 for CPU-only slots (with ``""`` as
            ``CUDA_VISIBLE_DEVICES``, hiding the GPUs).
        slots_per_gpu: slots sharing each GPU (or group of ``gpus_per_slot`` GPUs).
        gpus: restrict to these GPUs: ``"0,2"`` or ``[0, 2]`` (indices as
            ``paralela info`` shows them) or UUIDs; default: every visible GPU.

    Returns:
        The slots, numbered from 0.

    Raises:
        ConfigError: an impossible request: ``n_slots < 1``, more GPUs per slot than
            are visible, ``gpus`` naming a GPU that is not visible, more slots than the
            GPUs allow, or ``cpus_per_slot`` x slots more than the usable CPUs. The
            message says what is available and what to change.
    """
    if n_slots is not None:
        _whole("n_slots", n_slots, 1)
    if cpus_per_slot is not None:
        _whole("cpus_per_slot", cpus_per_slot, 1)
    _whole("gpus_per_slot", gpus_per_slot, 0)
    _whole("slots_per_gpu", slots_per_gpu, 1)
    ids = resources.cpus.usable_ids
    if gpus is not None or slots_per_gpu > 1:
        gpus_per_slot = max(gpus_per_slot, 1)

    if gpus_per_slot == 0:
        if n_slots is None:
            n_slots = len(ids) // cpus_per_slot if cpus_per_slot else max(1, len(ids))
            if n_slots == 0:
                raise ConfigError(
                    f"cpus_per_slot={cpus_per_slot} is more than the {len(ids)} CPUs this "
                    f"process may use (CPU ids {list(ids)}); lower cpus_per_slot."
                )
        cpu_sets = _split_cpus(ids, n_slots, cpus_per_slot)
        return [Slot(resources.host, cpus, (), j, None) for j, cpus in enumerate(cpu_sets)]

    selected = list(resources.gpus) if gpus is None else _select_gpus(resources, gpus)
    groups = [
        selected[i : i + gpus_per_slot]
        for i in range(0, len(selected) - gpus_per_slot + 1, gpus_per_slot)
    ]
    if not groups:
        raise ConfigError(
            f"gpus_per_slot={gpus_per_slot} needs {gpus_per_slot} GPU(s), but "
            f"{len(selected)} {'is' if len(selected) == 1 else 'are'} available: "
            f"{_describe_gpus(resources)}. Lower gpus_per_slot, name more GPUs in gpus=, "
            "run where more GPUs are visible, or use gpus_per_slot=0 for CPU-only slots."
        )
    capacity = len(groups) * slots_per_gpu
    if n_slots is None:
        n_slots = capacity
    elif n_slots > capacity:
        raise ConfigError(
            f"n_slots={n_slots} is more than the {capacity} GPU slot(s) available: "
            f"{len(groups)} group(s) of {gpus_per_slot} GPU(s) x slots_per_gpu={slots_per_gpu}. "
            "Lower n_slots, raise slots_per_gpu to share each GPU among more slots, "
            "or use more GPUs."
        )
    cpu_sets = _split_cpus(ids, n_slots, cpus_per_slot)
    slots = []
    for j, cpus in enumerate(cpu_sets):
        group = groups[j % len(groups)]
        slots.append(
            Slot(
                resources.host,
                cpus,
                tuple(str(g.index) for g in group),
                j,
                tuple(g.device_id for g in group),
            )
        )
    return slots
