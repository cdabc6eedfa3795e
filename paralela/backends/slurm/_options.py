"""Options of the ``slurm`` backend: validated before anything is submitted.

Options that mean the same on every backend have one name (``cpus_per_task``,
``gpus_per_task``, ``mem_gb``, ``timeout_min``, ``nodes``, ``retries``, ``max_jobs``);
Slurm-only ones start with ``slurm_``. Values may be given as strings (the command
line's ``--option KEY=VALUE``): numbers and booleans are parsed. An unknown name, a
value of the wrong type or out of range raises :class:`~paralela.errors.ConfigError`
that lists what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError

__all__ = ["DEFAULT_MAX_JOBS", "SlurmOptions", "parse_options", "valid_names"]

# Packed maps use at most this many array tasks: enough to spread over a few hundred
# cores' worth of nodes, few enough to stay far below the usual MaxSubmitJobs (often
# 500 to 5,000) and to keep the scheduler's per-job cost (about 0.5 s of start-up per
# task, bench/bench_slurm.py) small against the work.
DEFAULT_MAX_JOBS = 128
# Seconds between Slurm's warning signal and the time limit: enough to write a
# checkpoint and requeue, as submitit's default (90 s) plus margin for busy filesystems.
DEFAULT_SIGNAL_DELAY_S = 120
# At most this many tasks of one array run at once (``%256``), submitit's default for
# slurm_array_parallelism: a large array then never takes a whole shared cluster.
DEFAULT_ARRAY_PARALLELISM = 256


@dataclass(frozen=True)
class SlurmOptions:
    """What each array task asks Slurm for, and how the backend behaves.

    Attributes:
        cpus_per_task: CPUs per task (``--cpus-per-task``); a packed map runs that many
            local workers in each task.
        gpus_per_task: GPUs per task (``--gres=gpu:N``).
        mem_gb: memory per task in GB (``--mem``); the partition's default when unset.
        timeout_min: time limit per task in minutes (``--time``); the partition's default
            when unset.
        nodes: nodes per task (``--nodes``).
        retries: times a task that ended without a result (failed, cancelled, timed out,
            node failure, out of memory) is submitted again by the backend itself before
            its future fails. ``paralela.map`` retries on its own (``retries=``), so it
            leaves this at 0.
        max_jobs: the most array tasks one submission (one map) uses; items are packed
            into that many chunks. Lowered to the cluster's ``MaxArraySize`` and
            ``MaxSubmitJobs``.
        slurm_partition: ``--partition``.
        slurm_account: ``--account``.
        slurm_qos: ``--qos``.
        slurm_constraint: ``--constraint``.
        slurm_additional: more sbatch options: a dict (``{"exclusive": True,
            "reservation": "r1"}``) or a string/list of raw options (``"--exclusive"``).
        slurm_array_parallelism: at most this many tasks of one array run at once
            (``%N``; default 256, as submitit's; ``None``: no throttle).
        slurm_job_name: ``--job-name``.
        slurm_job_dir: where job files (pickled calls, results, logs) go; must be on a
            filesystem the compute nodes share. Default ``./paralela-runs/slurm-jobs``.
        slurm_signal_delay_s: seconds before the time limit at which Slurm sends
            ``USR1``; the task then saves what it finished and requeues itself. At
            most half of ``timeout_min``.
        slurm_python: the Python that runs tasks (default: this interpreter).
        slurm_setup: shell lines run before the task (``module load ...``).
    """

    cpus_per_task: int = 1
    gpus_per_task: int = 0
    mem_gb: float | None = None
    timeout_min: int | None = None
    nodes: int = 1
    retries: int = 0
    max_jobs: int = DEFAULT_MAX_JOBS
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_constraint: str | None = None
    slurm_additional: tuple[str, ...] = ()
    slurm_array_parallelism: int | None = DEFAULT_ARRAY_PARALLELISM
    slurm_job_name: str = "paralela"
    slurm_job_dir: str | None = None
    slurm_signal_delay_s: int = DEFAULT_SIGNAL_DELAY_S
    slurm_python: str = field(default_factory=lambda: sys.executable)
    slurm_setup: tuple[str, ...] = ()

    def sbatch_args(self) -> list[str]:
        """The ``sbatch`` options for one submission (the array range is added later)."""
        args = [
            f"--job-name={self.slurm_job_name}",
            f"--cpus-per-task={self.cpus_per_task}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            "--requeue",
            f"--signal=B:USR1@{self.signal_delay()}",
        ]
        if self.gpus_per_task:
            args.append(f"--gres=gpu:{self.gpus_per_task}")
        if self.mem_gb is not None:
            args.append(f"--mem={max(1, round(self.mem_gb * 1024))}M")
        if self.timeout_min is not None:
            args.append(f"--time={self.timeout_min}")
        for name, flag in (
            ("slurm_partition", "--partition"),
            ("slurm_account", "--account"),
            ("slurm_qos", "--qos"),
            ("slurm_constraint", "--constraint"),
        ):
            value = getattr(self, name)
            if value:
                args.append(f"{flag}={value}")
        args.extend(self.slurm_additional)
        return args

    def signal_delay(self) -> int:
        """Seconds before the time limit for the warning: at most half the limit, so
        that a short limit never signals (and requeues) a task as soon as it starts."""
        if self.timeout_min is None:
            return self.slurm_signal_delay_s
        return max(1, min(self.slurm_signal_delay_s, self.timeout_min * 30))

    def job_dir(self) -> Path:
        """The directory for job files (absolute, so that tasks find it from anywhere)."""
        base = self.slurm_job_dir or os.path.join("paralela-runs", "slurm-jobs")
        return Path(base).absolute()

    def replace(self, **changes: Any) -> SlurmOptions:
        return dataclasses.replace(self, **changes)


def _int(minimum: int) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"Option {name} must be an integer of at least {minimum}, got {value!r}."
            )
        return value

    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def optional(name: str, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        return check(name, value)

    return optional


def _positive_float(name: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"Option {name} must be a positive number, got {value!r}.")
    return float(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise ConfigError(f"Option {name} must be a non-empty string, got {value!r}.")
    return os.fspath(value).strip()


def _sbatch_flag(key: str, value: Any) -> str | None:
    flag = key if key.startswith("-") else "--" + key.replace("_", "-")
    if value is True or value is None:
        return flag
    if value is False:
        return None
    return f"{flag}={value}"


def _additional(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, Mapping):
        flags = [_sbatch_flag(str(k), v) for k, v in value.items()]
        return tuple(f for f in flags if f is not None)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(
        f"Option {name} must be a dict of sbatch options ({{'exclusive': True}}), a string "
        f"or a list of strings ('--exclusive'), got {value!r}."
    )


def _lines(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"Option {name} must be a shell line or a list of them, got {value!r}.")


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "cpus_per_task": _int(1),
    "gpus_per_task": _int(0),
    "mem_gb": _optional(_positive_float),
    "timeout_min": _optional(_int(1)),
    "nodes": _int(1),
    "retries": _int(0),
    "max_jobs": _int(1),
    "slurm_partition": _optional(_text),
    "slurm_account": _optional(_text),
    "slurm_qos": _optional(_text),
    "slurm_constraint": _optional(_text),
    "slurm_additional": _additional,
    "slurm_array_parallelism": _optional(_int(1)),
    "slurm_job_name": _text,
    "slurm_job_dir": _optional(_text),
    "slurm_signal_delay_s": _int(1),
    "slurm_python": _text,
    "slurm_setup": _lines,
}


def valid_names() -> list[str]:
    """Every option name, shared ones first."""
    return list(_CHECKS)


def parse_options(options: Mapping[str, Any] | None) -> SlurmOptions:
    """Validate ``options`` into :class:`SlurmOptions`.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones) or a bad value.
    """
    given = dict(options or {})
    unknown = sorted(k for k in given if k not in _CHECKS)
    if unknown:
        hints = [f"{k!r} (did you mean 'slurm_{k}'?)" if f"slurm_{k}" in _CHECKS else repr(k)
                 for k in unknown]  # fmt: skip
        raise ConfigError(
            f"Unknown option(s) {', '.join(hints)} for backend 'slurm'; valid options are: "
            f"{', '.join(valid_names())}."
        )
    return SlurmOptions(**{k: _CHECKS[k](k, v) for k, v in given.items()})
