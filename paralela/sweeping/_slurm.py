"""``paralela sweep --backend slurm``: the whole sweep packed into one Slurm allocation.

::

    login node                                   compute node (one job, G GPUs)
    submit_sweep(args, gpus_per_node=G, ...)
      │ write RUN_DIR/slurm-<job>.sbatch ──sbatch──► paralela sweep ARGS --run-dir RUN_DIR
      │                                               │ slots = the GPUs Slurm granted
      │                                               │ (SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES;
      │                                               │ no NVML needed): one trial per GPU
      │ stream RUN_DIR/slurm-<job>.out  ◄─────────────┤ the sweep's output
      │ "trial N started" ◄── RUN_DIR/trials/ ◄───────┘ one log per trial
      ▼
    COMPLETED ──► SlurmSweepJob;  failed / cancelled / timed out ──► SweepError
    Ctrl-C ──► scancel

Run again (same run directory) to continue a sweep whose job was cancelled or timed
out: finished trials are kept, interrupted ones run again. Inside an allocation you
already hold (``salloc``, your own ``sbatch`` script), run ``paralela sweep`` without
``--backend``: it packs the allocation's GPUs by itself.

One job per trial is the other mode (``--slurm-mode per-trial``): the driver stays on
the submitting machine and submits each trial as a job of its own
(:mod:`paralela.sweeping._slurm_trials`, ``paralela.sweep(..., backend="slurm")``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from paralela.backends.slurm import JOB_OPTIONS
from paralela.errors import ConfigError

if TYPE_CHECKING:
    from paralela.backends.slurm import JobOptions, JobRun

__all__ = ["SLURM_MODES", "SWEEP_OPTIONS", "SlurmSweepJob", "submit_sweep", "sweep_script"]

#: The Slurm options a packed sweep accepts: one task, its GPUs the sweep's slots.
SWEEP_OPTIONS = tuple(n for n in JOB_OPTIONS if n not in ("ntasks_per_node", "gpus_per_task"))
SLURM_MODES = ("pack", "per-trial")
# The trials directory is listed at most this often for "trial N started" lines.
PROGRESS_INTERVAL_S = 1.0


@dataclass(frozen=True)
class SlurmSweepJob:
    """A packed sweep whose Slurm job completed.

    Attributes:
        job_id: the Slurm job id.
        run_dir: the sweep's directory (database, ``trials.json``, ``trials.csv``,
            ``trials/``, ``plots/``), as for a sweep run here.
        output: the job's output file (the sweep's own output: leaderboard, notes).
        script: the batch script that was submitted.
        wall_s: seconds from submission to the end (queue time included).
    """

    job_id: str
    run_dir: Path
    output: Path
    script: Path
    wall_s: float

    def trials(self) -> list[dict[str, Any]]:
        """Every trial of the sweep as ``trials.json`` has it (params, value, state, ...).

        Raises:
            FileNotFoundError: the sweep wrote no ``trials.json``.
        """
        data = json.loads((self.run_dir / "trials.json").read_text())
        trials: list[dict[str, Any]] = data["trials"]
        return trials


def sweep_script(
    sweep_args: Sequence[str],
    options: JobOptions,
    *,
    run_dir: Path,
    study_name: str,
    workdir: Path,
) -> str:
    """The batch script that runs ``paralela sweep ARGS`` in one allocation."""
    import shlex

    from paralela.backends.slurm import render_script

    cut = _end_of_options(sweep_args)
    command = [options.python, "-m", "paralela", "sweep", *sweep_args[:cut]]
    command += ["--study", study_name, "--run-dir", str(run_dir), *sweep_args[cut:]]
    body = [
        "# The sweep's slots are this allocation's GPUs (one trial per GPU), or shares",
        "# of its CPUs without GPUs; each trial gets its own CUDA_VISIBLE_DEVICES.",
        "export PYTHONUNBUFFERED=1",
        "exec " + " ".join(shlex.quote(a) for a in command),
    ]
    return render_script(
        options,
        body,
        job_name=f"paralela-sweep-{study_name}",
        output=run_dir / "slurm-%j.out",
        workdir=workdir,
        what="sweep --backend slurm",
    )


def _progress(trials_dir: Path) -> Callable[[], list[str]]:
    """A callable that names the trials whose log appeared since it was last called."""
    seen: set[str] = set()
    last = 0.0

    def new_trials() -> Iterator[str]:
        nonlocal last
        now = time.monotonic()
        if now - last < PROGRESS_INTERVAL_S:
            return
        last = now
        try:
            names = sorted(p.name for p in trials_dir.glob("trial-*.log"))
        except OSError:
            return
        for name in names:
            if name not in seen:
                seen.add(name)
                yield f"trial {int(name[6:-4])} started"

    return lambda: list(new_trials())


def submit_sweep(
    sweep_args: Sequence[str],
    *,
    run_dir: str | os.PathLike[str],
    study_name: str,
    slurm_mode: str = "pack",
    console: IO[bytes] | None = None,
    **options: Any,
) -> SlurmSweepJob:
    """Submit ``paralela sweep SWEEP_ARGS`` as one Slurm job and wait for it (packing).

    The job asks for one node with ``gpus_per_node`` GPUs (and ``cpus_per_task``
    CPUs); inside it the sweep takes each granted GPU as a slot, one trial per GPU at a
    time, exactly as ``paralela sweep`` does on a GPU machine. Its output is copied to
    ``console`` while it runs, with a status line for each trial that starts.

    Args:
        sweep_args: the arguments of ``paralela sweep``, without ``--run-dir`` and
            ``--study`` (``["--space", "space.yaml", "--trials", "50", "--",
            "python", "train.py", "--lr", "{lr}"]``); relative paths are relative to
            the current directory, which is the job's too.
        run_dir: the sweep's directory, on a filesystem the compute node shares; the
            batch script and the job's output go there too.
        study_name: the study's name.
        slurm_mode: ``"pack"``: the whole sweep in one allocation (the only mode
            here: ``"per-trial"`` is ``paralela.sweep(..., backend="slurm")``).
        console: where the job's output is copied (default: stdout).
        **options: ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``timeout_min``,
            ``nodes`` (1), ``slurm_partition``, ``slurm_account``, ``slurm_qos``,
            ``slurm_constraint``, ``slurm_additional``, ``slurm_job_name``,
            ``slurm_python``, ``slurm_setup``.

    Returns:
        The job, when it completed; the results are in ``run_dir``.

    Raises:
        ConfigError: an unknown option (the message lists the valid ones), a bad
            value, ``slurm_mode="per-trial"``, more than one node, no Slurm commands
            on PATH, or the sweep in the job refused its arguments (exit code 2).
        SlurmCommandError: sbatch refused the job.
        SweepError: the job ended otherwise: more trials failed than ``max_failures``
            allows, it was cancelled, timed out or vanished. Finished trials are kept:
            the same command continues the sweep.
        KeyboardInterrupt: on Ctrl-C or SIGTERM, after cancelling the job.
    """
    from paralela.backends.slurm import job_options, require_slurm, run_job

    if slurm_mode not in SLURM_MODES:
        raise ConfigError(
            f"Unknown slurm_mode {slurm_mode!r}; valid modes are: {', '.join(SLURM_MODES)}."
        )
    if slurm_mode == "per-trial":
        raise ConfigError(
            "submit_sweep packs the whole sweep into one job. For one Slurm job per trial "
            "the driver stays here: call paralela.sweep(objective, space, backend='slurm', "
            "backend_options={...}), or `paralela sweep --backend slurm --slurm-mode "
            "per-trial`."
        )
    opts = job_options(options, valid=SWEEP_OPTIONS, what="sweep --backend slurm")
    if opts.nodes != 1:
        raise ConfigError(
            f"A packed sweep runs on one node (nodes=1), got nodes={opts.nodes}. For more "
            "GPUs than one node has, submit one packed sweep per node with the same "
            "--study and a shared --storage (postgresql://... or journal:PATH): they "
            "fill one study together."
        )
    for flag in ("--run-dir", "-d", "--study"):
        if flag in sweep_args[: _end_of_options(sweep_args)]:
            raise ConfigError(f"Give the run directory and study as arguments, not {flag}.")
    require_slurm("sweep --backend slurm")
    root = Path(run_dir).absolute()
    (root / "trials").mkdir(parents=True, exist_ok=True)
    workdir = Path.cwd()
    run = run_job(
        sweep_script(sweep_args, opts, run_dir=root, study_name=study_name, workdir=workdir),
        script_path=root / "slurm-{job}.sbatch",
        output_pattern=root / "slurm-%j.out",
        workdir=workdir,
        label="sweep",
        console=console,
        progress=_progress(root / "trials"),
    )
    if run.state.state == "COMPLETED":
        return SlurmSweepJob(run.job_id, root, run.output, run.script, run.wall_s)
    raise _failure(run, root)


def _end_of_options(args: Sequence[str]) -> int:
    return list(args).index("--") if "--" in args else len(args)


def _failure(run: JobRun, root: Path) -> Exception:
    from paralela.sweeping._driver import SweepError

    status, _, _signal = run.state.exit_code.partition(":")
    said = [ln.strip() for ln in run.output_tail(200).splitlines() if "Error:" in ln]
    reason = said[-1].split("Error:", 1)[1].strip() if said else ""
    again = "Run the same command again to continue the sweep (finished trials are kept)."
    if run.state.state == "FAILED" and status == "2" and reason:
        return ConfigError(f"The sweep in Slurm job {run.job_id} refused its arguments: {reason}")
    if run.state.state == "FAILED" and reason:
        return SweepError(f"The sweep in Slurm job {run.job_id} stopped: {reason}")
    tail = run.output_tail()
    shown = f"\nLast lines of its output ({run.output}):\n{tail}" if tail else ""
    return SweepError(
        f"Slurm job {run.job_id} of the sweep in {root} ended {run.state.describe()}. "
        f"{again}{shown}"
    )
