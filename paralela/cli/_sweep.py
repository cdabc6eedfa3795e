"""``paralela sweep``: a hyperparameter search over a command or a Python function."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    INTERRUPTED,
    USAGE_OR_FAILED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
    kept_from_notes,
)
from paralela.cli._options import (
    PROGRAM_AFTER_OPTIONS,
    Gpus,
    json_option,
    progress_option,
    run_dir_option,
    slurm_additional_option,
    slurm_option,
    timeout_min_option,
    workers_option,
)
from paralela.cli._sweep_slurm import SLURM_ONLY

SWEEP_HELP = (
    "Search hyperparameters with one trial per GPU (or CPU share), stopping bad trials "
    "early, resumable.\n\n"
    "The trial is a command given after '--', with {name} placeholders filled from the "
    "space and {python} by the interpreter running the sweep (the parameters are also "
    "in $PARALELA_TRIAL_PARAMS as JSON; the trial calls paralela.report(value, "
    "step=...) and its last report is its value), or a Python "
    "function given with --function MODULE:FUNC, called as func(params), or an Optuna "
    "objective func(trial) run unchanged (then --space may be left out).\n\n"
    "Example: paralela sweep --space space.yaml --trials 50 --pruner median -- "
    "{python} train.py --lr {lr} --hidden {hidden}\n\n"
    "On Slurm: --backend slurm --gpus-per-node 4 submits the sweep as one job and "
    "waits (one trial per GPU of the allocation), streaming its output; --slurm-mode "
    "per-trial submits one job per trial instead, from here; inside an allocation, plain "
    "paralela sweep uses the GPUs Slurm granted."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "the sweep ran (failed trials are recorded, not fatal)"),
    (EXIT_FAILED, "more trials failed than --max-failures allows, or every trial failed"),
    (EXIT_USAGE, "bad usage (space file, sampler, command not found, GPUs)"),
    INTERRUPTED,
    (
        EXIT_TERMINATED,
        "stopped by SIGTERM (scancel, a Slurm time limit or preemption; with --backend "
        "slurm: the job was cancelled)",
    ),
)
EPILOG = exit_codes_help(EXIT_CODES, "Running the same command again continues the sweep.")

SLURM = "Slurm (--backend slurm)"
BACKENDS = ("processes", "slurm")
SLURM_MODES = ("pack", "per-trial")


@app.command(
    help=SWEEP_HELP,
    short_help="Hyperparameter sweep: one trial per device, pruning, resume.",
    epilog=EPILOG,
    context_settings=PROGRAM_AFTER_OPTIONS,
)
def sweep(
    ctx: typer.Context,
    space: Annotated[
        Path | None,
        typer.Option(
            "--space",
            "-s",
            help="YAML, TOML or CSV (one row per trial) space; an Optuna objective(trial) "
            "given with --function may leave it out.",
        ),
    ] = None,
    function: Annotated[
        str | None,
        typer.Option("--function", "-f", help="MODULE:FUNC or file.py:func instead of a command."),
    ] = None,
    trials: Annotated[
        int | None, typer.Option("--trials", "-n", min=1, help="Trial budget (all runs).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Time budget in seconds for this run.")
    ] = None,
    direction: Annotated[
        str, typer.Option("--direction", help="minimize or maximize (comma list: several).")
    ] = "minimize",
    sampler: Annotated[
        str, typer.Option(help="tpe, random, grid, cmaes, gp, nsga2, nsga3, qmc.")
    ] = "tpe",
    pruner: Annotated[
        str | None,
        typer.Option(
            help="none, median, percentile, halving, hyperband. Default: none; for an "
            "Optuna objective(trial), Optuna's default (MedianPruner()).",
            show_default=False,
        ),
    ] = None,
    run_dir: Annotated[Path | None, run_dir_option("Default: paralela-runs/<study name>.")] = None,
    study: Annotated[str | None, typer.Option("--study", help="Study name.")] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="Database URL (postgresql://...) or journal:PATH. Default: SQLite."),
    ] = None,
    workers: Annotated[
        int | None,
        workers_option(
            "Trials at once, at most. Default: one per slot (a GPU, or a CPU share); with "
            "--slurm-mode per-trial, 4."
        ),
    ] = None,
    gpus: Gpus = None,
    gpus_per_trial: Annotated[int, typer.Option(min=0, help="GPUs per trial.")] = 1,
    trials_per_gpu: Annotated[int, typer.Option(min=1, help="Trials sharing one GPU.")] = 1,
    min_free_gpu_memory: Annotated[
        float | None, typer.Option(help="Skip GPUs with less free memory (GiB).")
    ] = None,
    max_failures: Annotated[
        int | None, typer.Option(min=0, help="Stop once more trials than this failed.")
    ] = None,
    trial_timeout: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            help="Stop a trial still running after S seconds (recorded as failed); "
            "per-trial Slurm jobs get it as their time limit.",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    progress: Annotated[bool | None, progress_option("a live table")] = None,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="PNG plots in the run directory.")
    ] = True,
    json_out: Annotated[bool, json_option("Print the result as JSON on stdout.")] = False,
    backend: Annotated[
        str,
        typer.Option(
            help="processes (trials here) or slurm (submit as one job).", rich_help_panel=SLURM
        ),
    ] = "processes",
    slurm_mode: Annotated[
        str,
        typer.Option(
            help="pack: the whole sweep in one allocation; per-trial: one job per trial "
            "(--workers of them at once, default 4), this process drives them.",
            rich_help_panel=SLURM,
        ),
    ] = "pack",
    nodes: Annotated[
        int | None, typer.Option(min=1, help="Nodes (1 for pack).", rich_help_panel=SLURM)
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="GPUs of the job: one trial each (per-trial: each trial's job's GPUs).",
            rich_help_panel=SLURM,
        ),
    ] = None,
    cpus_per_task: Annotated[
        int | None, typer.Option(min=1, help="CPUs of the job.", rich_help_panel=SLURM)
    ] = None,
    mem_gb: Annotated[
        float | None, typer.Option(min=0.001, help="Memory of the job, GB.", rich_help_panel=SLURM)
    ] = None,
    timeout_min: Annotated[int | None, timeout_min_option(SLURM)] = None,
    slurm_partition: Annotated[str | None, slurm_option("partition", SLURM)] = None,
    slurm_account: Annotated[str | None, slurm_option("account", SLURM)] = None,
    slurm_qos: Annotated[str | None, slurm_option("qos", SLURM)] = None,
    slurm_constraint: Annotated[str | None, slurm_option("constraint", SLURM)] = None,
    slurm_additional: Annotated[list[str] | None, slurm_additional_option(SLURM)] = None,
) -> None:
    import paralela

    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    if function is not None and command:
        fail("give either --function or a command after '--', not both.", EXIT_USAGE)
    if backend not in BACKENDS:
        fail(f"unknown backend {backend!r}; valid backends are: {', '.join(BACKENDS)}.", EXIT_USAGE)
    if backend == "slurm" and slurm_mode not in SLURM_MODES:
        fail(
            f"unknown --slurm-mode {slurm_mode!r}; valid modes are: {', '.join(SLURM_MODES)}.",
            EXIT_USAGE,
        )
    if backend == "slurm" and slurm_mode == "pack":
        from paralela.cli._sweep_slurm import submit

        defaults = {name: p.default for name, p in inspect.signature(sweep).parameters.items()}
        submit(ctx, command, function, study, run_dir, json_out, defaults)
        return
    per_trial = backend == "slurm"
    given = [n for n in SLURM_ONLY if ctx.params.get(n) not in (None, [], ())]
    if not per_trial and (slurm_mode != "pack" or given):
        option = given[0].replace("_", "-") if given else "slurm-mode"
        fail(f"--{option} is an option of Slurm jobs: add --backend slurm.", EXIT_USAGE)
    backend_options = None
    if per_trial:
        from paralela.cli._sweep_slurm import trial_job_options

        backend_options = trial_job_options(ctx.params)
    objective: object
    if function is not None:
        from paralela.cli._load import load_function

        objective = load_function(function)
    elif command:
        objective = command
        if space is None:
            fail("give the space of the command's parameters: --space FILE.", EXIT_USAGE)
    else:
        fail("give the trial command after '--' (or --function MODULE:FUNC).", EXIT_USAGE)
    directions = [d.strip() for d in direction.split(",")]
    with handling_errors(kept_from_notes("The sweep was interrupted."), codes=USAGE_OR_FAILED):
        result = paralela.sweep(
            objective,
            space,
            n_trials=trials,
            timeout=timeout,
            direction=directions if len(directions) > 1 else directions[0],
            sampler=sampler,
            pruner=pruner,
            run_dir=run_dir,
            study_name=study,
            storage=storage,
            workers=workers,
            gpus=gpus,
            gpus_per_trial=gpus_per_trial,
            trials_per_gpu=trials_per_gpu,
            min_free_gpu_memory=min_free_gpu_memory,
            max_failures=max_failures,
            trial_timeout=trial_timeout,
            seed=seed,
            progress=progress,
            plots=plots,
            backend=backend,
            backend_options=backend_options,
        )
    if json_out:
        typer.echo((result.run_dir / "trials.json").read_text())
    else:
        _print_result(result)
    _report_failures(result)


def _report_failures(result: object) -> None:
    """Failed trials on stderr: all failed is exit 1 with the first one's error."""
    from paralela.sweeping import SweepResult

    assert isinstance(result, SweepResult)
    first = result.failure_report()
    if first is None:
        return
    failed, total = len(result.failed), len(result.trials)
    if result.all_failed:
        fail(
            f"every trial failed ({failed} of {total}); nothing was learned. The first, "
            f"{first}\nFix the objective (run one trial by hand) and run again: the failed "
            f"trials count against --trials, so pass a new --run-dir or --study.",
            EXIT_FAILED,
        )
    typer.echo(f"paralela sweep: {failed} of {total} trials failed; the first, {first}", err=True)


def _print_result(result: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from paralela.sweeping import SweepResult

    assert isinstance(result, SweepResult)
    # No markup: parameter values and paths are printed as they are ("[relu]" included);
    # soft wrap: a long line stays one line (copyable best parameters).
    console = Console(stderr=False, markup=False)
    several = len(result.directions) > 1
    if several:  # no single best: every trade-off, with every objective's value
        title = f"Pareto front of {result.study_name}"
        shown = result.pareto_front()
        values = [f"value {i}\n{d}" for i, d in enumerate(result.directions)]
    else:
        title = f"Leaderboard of {result.study_name}"
        shown = result.leaderboard(10)
        values = ["value"]
    table = Table(title=title, title_justify="left")
    for column in ("rank", "trial", *values, "duration s", "params"):
        table.add_column(column)
    for rank, t in enumerate(shown, 1):
        table.add_row(
            str(rank),
            f"#{t.number}",
            *(f"{v:.6g}" for v in t.values or ()),
            "-" if t.duration is None else f"{t.duration:.2f}",
            json.dumps(t.params),
        )
    if table.row_count:
        console.print(table)
    console.print(result.summary(), soft_wrap=True)
    if result.best_params is not None and not several:
        console.print(f"Best parameters: {json.dumps(result.best_params)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"Note: {note}", soft_wrap=True)
    console.print(f"Trials, logs and plots: {result.run_dir}", soft_wrap=True)
