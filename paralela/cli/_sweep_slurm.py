"""``paralela sweep --backend slurm``: the command line of the sweep to run in the job,
rebuilt from what was given here, then :func:`paralela.sweeping.submit_sweep`.

Only options given on the command line are passed on (defaults stay the job's
defaults); the Slurm options stay here; ``--study`` and ``--run-dir`` are computed
here so that this side and the job agree on where the results are.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from paralela.cli._errors import EXIT_USAGE, USAGE_OR_FAILED, fail, handling_errors

__all__ = ["SLURM_ONLY", "inner_args", "submit", "trial_job_options"]

# The Slurm job's options: given to sbatch, not to the sweep inside the job.
SLURM_ONLY = (
    "nodes",
    "gpus_per_node",
    "cpus_per_task",
    "mem_gb",
    "timeout_min",
    "slurm_partition",
    "slurm_account",
    "slurm_qos",
    "slurm_constraint",
    "slurm_additional",
)

# Handled here rather than passed on as given.
OWN_PARAMS = {"backend", "slurm_mode", "run_dir", "study", "json_out", "space", "function"}


def inner_args(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The options given to this ``paralela sweep`` (not the Slurm ones), as arguments.

    An option whose value differs from its default is passed on as Typer names it:
    ``--name-with-dashes VALUE``, or ``--flag`` / ``--no-flag`` for a switch.
    """
    args: list[str] = []
    for name, value in params.items():
        if name in SLURM_ONLY or name in OWN_PARAMS or value == defaults.get(name):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            for item in value:
                args += [flag, str(item)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def trial_job_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """The options of each trial's job (``--slurm-mode per-trial``) from the command line.

    ``--gpus-per-node`` is each trial's job's GPUs; the local-slot options (``--gpus``,
    ``--gpus-per-trial``...) choose this machine's GPUs and are refused here.
    """
    from paralela.cli._launch import slurm_additional_options

    local = [
        flag
        for flag, name, default in (
            ("--gpus", "gpus", None),
            ("--gpus-per-trial", "gpus_per_trial", 1),
            ("--trials-per-gpu", "trials_per_gpu", 1),
            ("--min-free-gpu-memory", "min_free_gpu_memory", None),
        )
        if params.get(name, default) != default
    ]
    if local:
        fail(
            f"{local[0]} chooses this machine's GPUs; with --slurm-mode per-trial each "
            "trial's job asks Slurm for its own: --gpus-per-node G.",
            EXIT_USAGE,
        )
    if params.get("nodes") not in (None, 1):
        fail("a trial's job runs on one node: leave --nodes out (or 1).", EXIT_USAGE)
    options: dict[str, Any] = {
        name: params[name]
        for name in SLURM_ONLY
        if name != "nodes" and params.get(name) not in (None, [], ())
    }
    if "gpus_per_node" in options:
        options["gpus_per_task"] = options.pop("gpus_per_node")
    if "slurm_additional" in options:
        options["slurm_additional"] = slurm_additional_options(options["slurm_additional"])
    return options


def submit(
    ctx: typer.Context,
    command: list[str],
    function: str | None,
    study: str | None,
    run_dir: Path | None,
    json_out: bool,
    defaults: Mapping[str, Any],
) -> None:
    """Submit the sweep as one Slurm job, stream it, exit with its result.

    ``defaults``: the command's own defaults, by parameter name; only options given
    other values are passed on to the sweep in the job.
    """
    from paralela.cli._launch import slurm_additional_options
    from paralela.space import Space, as_space
    from paralela.sweeping import identify, submit_sweep

    params = ctx.params
    if function is None and not command:
        fail("give the trial command after '--' (or --function MODULE:FUNC).", EXIT_USAGE)
    space = params["space"]
    if space is None and function is None:
        fail("give the space of the command's parameters: --space FILE.", EXIT_USAGE)
    with handling_errors(codes=USAGE_OR_FAILED):
        # A broken space fails here, not after waiting in the queue. None: an Optuna
        # objective(trial) defines its parameters as it runs.
        space_ = Space(()) if space is None else as_space(space)
    # The name the sweep would pick itself (paralela.sweep's rule), made explicit.
    name = study or identify(function, command or None, space_).default_name
    root = run_dir if run_dir is not None else Path("paralela-runs") / name
    args = [] if space is None else ["--space", str(space)]
    if function is not None:
        args += ["--function", function]
    args += inner_args(params, defaults)
    if command:
        args += ["--", *command]
    options: dict[str, Any] = {
        name: params[name] for name in SLURM_ONLY if params.get(name) not in (None, [], ())
    }
    if "slurm_additional" in options:
        options["slurm_additional"] = slurm_additional_options(options["slurm_additional"])
    with handling_errors(
        "The Slurm job was cancelled. Run again to continue.", codes=USAGE_OR_FAILED
    ):
        job = submit_sweep(
            args,
            run_dir=root,
            study_name=name,
            slurm_mode=params["slurm_mode"],
            # With --json, stdout carries only the result; the job's output goes to stderr.
            console=sys.stderr.buffer if json_out else None,
            **options,
        )
    if json_out:
        typer.echo((job.run_dir / "trials.json").read_text())
        return
    typer.echo(
        f"paralela sweep: Slurm job {job.job_id} finished in {job.wall_s:.1f} s; trials, "
        f"logs and plots in {job.run_dir}",
        err=True,
    )
