"""The slots the model workers of ``serve`` and ``predict`` are pinned to: one per GPU
(times the workers sharing it), or shares of the CPUs where there is no GPU.

::

    worker_slots(None, None, 1)      GPUs 0 1 visible ──> slot 0: GPU 0, slot 1: GPU 1
                                     no GPU            ──> one slot per CPU
    worker_slots(3, "none", 1)                         ──> 3 CPU slots (GPUs hidden)
"""

from __future__ import annotations

from collections.abc import Sequence

from paralela.errors import ConfigError
from paralela.resources import Slot

__all__ = ["worker_slots"]


def worker_slots(
    workers: int | None,
    gpus: str | Sequence[str | int] | None,
    per_gpu: int,
    *,
    option: str = "workers_per_gpu",
    cpus_per_worker: int = 1,
) -> list[Slot]:
    """A slot per model worker of this machine.

    Args:
        workers: how many (default: one per GPU times ``per_gpu``, else one per
            ``cpus_per_worker`` CPUs).
        gpus: the GPUs to use (``"0,2"``), ``"none"`` for CPUs only, or None for all.
        per_gpu: workers sharing each GPU.
        option: the name ``per_gpu`` has for the caller, for messages.
        cpus_per_worker: without GPUs and ``workers``, the CPUs each worker gets.

    Raises:
        ConfigError: ``workers`` is not a positive integer, ``per_gpu`` is not 1 without
            GPUs, or the GPUs cannot hold the workers (``make_slots`` says why).
    """
    from paralela.resources import detect, make_slots

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):  # fmt: skip
        raise ConfigError(f"workers must be a positive integer, got {workers!r}.")
    if isinstance(per_gpu, bool) or not isinstance(per_gpu, int) or per_gpu < 1:
        raise ConfigError(f"{option} must be a positive integer, got {per_gpu!r}.")
    resources = detect()
    cpu_only = isinstance(gpus, str) and gpus.strip().lower() in ("", "none", "cpu")
    if not cpu_only and (gpus is not None or resources.gpus):
        return make_slots(
            resources, n_slots=workers, gpus_per_slot=1, slots_per_gpu=per_gpu, gpus=gpus
        )
    if per_gpu != 1:
        raise ConfigError(
            f"{option}={per_gpu} shares GPUs among workers, but "
            f"{'gpus=' + repr(gpus) + ' asks for none' if cpu_only else 'no GPU is visible'}"
            "; leave it at 1 (one worker per CPU), or run where GPUs are visible."
        )
    if workers is None:
        workers = max(1, resources.cpus.usable // cpus_per_worker)
    return make_slots(resources, n_slots=workers)
