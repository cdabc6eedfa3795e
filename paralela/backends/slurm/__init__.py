"""The ``slurm`` backend, and Slurm's commands for the layers above.

``paralela.map(fn, items, backend="slurm", backend_options={...})`` packs the items into
at most ``max_jobs`` array tasks, each running its share on a local process pool over
the CPUs it was given (see ``docs/slurm.md``). :class:`SlurmBackend` is also a plain
:class:`~paralela.backends.Backend`: ``submit`` calls, get futures; calls submitted
together go out as one job array.

For ``launch``/``sweep`` and scripts: :func:`submit_script`, :func:`cancel`,
:func:`requeue`, :func:`cluster_limits`, :func:`wait_job` and :class:`StateReader`
(states from ``sacct``, else ``scontrol show job``, else ``squeue -t all``).

The job submitter (``launch --slurm``, ``sweep --backend slurm``): :func:`job_options`
validates options into :class:`JobOptions`, :func:`render_script` writes the batch
script, :func:`run_job` submits it, copies its output to the console, waits for its end
(a :class:`JobRun`) and cancels it on Ctrl-C or SIGTERM.

Importing this package runs no Slurm command.
"""

from __future__ import annotations

from paralela.backends.slurm._backend import SlurmBackend, SlurmTaskDiedError, log_tail
from paralela.backends.slurm._commands import (
    ClusterLimits,
    SlurmCommandError,
    cancel,
    cluster_limits,
    requeue,
    require_slurm,
    run_command,
    slurm_available,
    submit_script,
    write_script,
)
from paralela.backends.slurm._jobs import (
    JOB_OPTIONS,
    JobOptions,
    JobRun,
    job_options,
    render_script,
    run_job,
    submit_env,
    tail_of,
)
from paralela.backends.slurm._options import DEFAULT_MAX_JOBS, SlurmOptions, parse_options
from paralela.backends.slurm._state import JobState, StateReader, wait_job

__all__ = [
    # the backend
    "SlurmBackend",
    "SlurmOptions",
    "SlurmTaskDiedError",
    "DEFAULT_MAX_JOBS",
    "parse_options",
    # commands
    "SlurmCommandError",
    "ClusterLimits",
    "cluster_limits",
    "submit_script",
    "write_script",
    "cancel",
    "requeue",
    "run_command",
    "require_slurm",
    "slurm_available",
    "log_tail",
    # states
    "JobState",
    "StateReader",
    "wait_job",
    # the job submitter
    "JOB_OPTIONS",
    "JobOptions",
    "JobRun",
    "job_options",
    "render_script",
    "run_job",
    "submit_env",
    "tail_of",
]
