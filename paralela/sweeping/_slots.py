"""Where a sweep's trials run: this machine's slots, or one Slurm job per trial.

``sweep`` (``_api``) asks for the slots; with ``backend="slurm"`` it checks that no option
that chooses this machine's GPUs was given, and turns a function objective into the
command each trial's job runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paralela.errors import ConfigError
from paralela.resources import Slot

__all__ = ["check_local_only", "job_command", "machine_slots"]


def machine_slots(
    workers: int | None,
    gpus: str | Sequence[int | str] | None,
    gpus_per_trial: int,
    trials_per_gpu: int,
    min_free_gpu_memory: float | None,
    notes: list[str],
) -> list[Slot]:
    """This machine's slots for trials: GPUs (those with enough free memory; skipped ones
    noted in ``notes``), or shares of the CPUs; at most ``workers``."""
    from paralela.resources import detect_for_slots, make_slots

    resources = detect_for_slots()  # no memory or filesystems: slots never read them
    cpu_only = gpus in ("", "none", "cpu") or gpus_per_trial == 0
    if not cpu_only and (gpus is not None or resources.gpus):
        chosen = gpus
        if min_free_gpu_memory is not None:
            usable = [
                g
                for g in resources.gpus
                if g.memory_free is None or g.memory_free >= min_free_gpu_memory * 2**30
            ]
            skipped = [g for g in resources.gpus if g not in usable]
            if skipped:
                notes.append(
                    "skipped GPUs in use by others (less than "
                    f"{min_free_gpu_memory} GiB free): {', '.join(str(g.index) for g in skipped)}"
                )
            if not usable:
                raise ConfigError(
                    f"No GPU has {min_free_gpu_memory} GiB free; lower min_free_gpu_memory "
                    "or wait for the GPUs to free up."
                )
            wanted = (
                None
                if gpus is None
                else {str(g) for g in (gpus.split(",") if isinstance(gpus, str) else gpus)}
            )
            chosen = [g.index for g in usable if wanted is None or str(g.index) in wanted]
        slots = make_slots(
            resources, gpus_per_slot=gpus_per_trial, slots_per_gpu=trials_per_gpu, gpus=chosen
        )
        return slots[:workers] if workers else slots
    return make_slots(resources, n_slots=workers)


def job_command(function: Any, command: list[str] | None) -> list[str]:
    """The command a trial's Slurm job runs: ``command``, or one that imports ``function``."""
    from paralela.sweeping._slurm_trials import function_command, importable_name

    return command if command is not None else function_command(importable_name(function))


def check_local_only(
    gpus: Any, gpus_per_trial: int, trials_per_gpu: int, min_free_gpu_memory: float | None
) -> None:
    """With ``backend="slurm"``, refuse the options that choose this machine's GPUs."""
    given = [
        name
        for name, value, default in (
            ("gpus", gpus, None),
            ("gpus_per_trial", gpus_per_trial, 1),
            ("trials_per_gpu", trials_per_gpu, 1),
            ("min_free_gpu_memory", min_free_gpu_memory, None),
        )
        if value != default
    ]
    if given:
        raise ConfigError(
            f"{given[0]} chooses this machine's GPUs; with backend='slurm' each trial's job "
            "asks Slurm for its own: backend_options={'gpus_per_task': N}."
        )
