"""``paralela launch``: start the ranks of a distributed program (torchrun's job, plus
Slurm, TensorFlow, a preflight rendezvous and restarts)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_RENDEZVOUS,
    EXIT_TERMINATED,
    EXIT_USAGE,
    INTERRUPTED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
)
from paralela.cli._options import (
    PROGRAM_AFTER_OPTIONS,
    slurm_additional_option,
    slurm_option,
    timeout_min_option,
)

LAUNCH_HELP = (
    "Run PROGRAM as the ranks of one distributed job.\n\n"
    "Here: paralela launch --nproc 2 train.py --epochs 3 (free ports, one GPU per rank "
    "where GPUs exist, OMP_NUM_THREADS per rank). In a Slurm job: srun paralela launch "
    "train.py, one task per rank (rank, world size, master host and port from SLURM_*). "
    "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
    "MASTER_PORT and TF_CONFIG; the ranks meet at a preflight rendezvous before PROGRAM "
    "runs. Options go before PROGRAM; everything after it is PROGRAM's.\n\n"
    "From a login node: paralela launch --slurm --nodes 2 --ntasks-per-node 4 "
    "--gpus-per-node 4 train.py writes and submits the batch script (srun paralela "
    "launch train.py, one task per rank), streams the ranks' output, waits, and exits "
    "with the job's result; Ctrl-C cancels the job."
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "every rank exited 0"),
    (EXIT_FAILED, "a rank failed (the others were stopped; its log tail is printed)"),
    (EXIT_USAGE, "bad usage"),
    (
        EXIT_RENDEZVOUS,
        "the ranks did not meet within --rendezvous-timeout, or a rank left or stalled "
        "before torch's process group was complete",
    ),
    INTERRUPTED,
    (
        EXIT_TERMINATED,
        "stopped by SIGTERM (scancel, a Slurm time limit or preemption; with --slurm: the "
        "job was cancelled)",
    ),
)
EPILOG = exit_codes_help(EXIT_CODES)

SLURM = "Slurm (--slurm)"


@app.command(
    help=LAUNCH_HELP,
    short_help="Start the ranks of a distributed training (DDP, TF), here or under Slurm.",
    epilog=EPILOG,
    context_settings=PROGRAM_AFTER_OPTIONS,
)
def launch(
    program: Annotated[
        list[str], typer.Argument(help="script.py [args...], a command, or with -m a module.")
    ],
    nproc: Annotated[
        int | None,
        typer.Option("--nproc", "-n", min=1, help="Ranks here (default: one per GPU, else 1)."),
    ] = None,
    module: Annotated[
        bool,
        typer.Option(
            "--module",
            "-m",
            help="PROGRAM is a module, run as python -m PROGRAM on every rank "
            "(paralela launch -m mypkg.train --lr 0.1): found on the ranks' Python path, "
            "as a package installed or in the current directory.",
        ),
    ] = False,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Restart the group this often after a rank dies.")
    ] = 0,
    log_dir: Annotated[
        Path | None,
        typer.Option("--log-dir", help="Default: paralela-runs/launch-<name>-<time or job>."),
    ] = None,
    rendezvous_timeout: Annotated[
        float | None,
        typer.Option(
            "--rendezvous-timeout",
            "--preflight-timeout",
            min=0.1,
            help="Seconds the ranks wait for each other, at the preflight and in torch's "
            "init_process_group (default 120 or PARALELA_RENDEZVOUS_TIMEOUT; "
            "--preflight-timeout is its former name).",
        ),
    ] = None,
    stop_grace: Annotated[
        float, typer.Option(min=0.0, help="Seconds from SIGTERM to SIGKILL when stopping.")
    ] = 5.0,
    gpus_per_rank: Annotated[
        int | None, typer.Option(min=0, help="GPUs per rank (default 1 with GPUs; 0: CPU).")
    ] = None,
    tf_ps: Annotated[
        int, typer.Option(min=0, help="TensorFlow parameter servers (rank 0 is then chief).")
    ] = 0,
    local: Annotated[
        bool, typer.Option("--local", help="Start the ranks here even inside a Slurm step.")
    ] = False,
    prefix: Annotated[
        bool,
        typer.Option(
            "--prefix/--no-prefix",
            help="Put '[rank N] ' before each line a rank prints here, to tell the ranks "
            "apart; --no-prefix leaves the lines as the program wrote them (one rank, or "
            "output another tool reads). The rank-N.log files never have it.",
        ),
    ] = True,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="Submit as a Slurm job and wait (from a login node).",
            rich_help_panel=SLURM,
        ),
    ] = False,
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes",
            "-N",
            min=1,
            help="Nodes of the job, each running --ntasks-per-node ranks.",
            rich_help_panel=SLURM,
        ),
    ] = None,
    ntasks_per_node: Annotated[
        int | None, typer.Option(min=1, help="Ranks per node.", rich_help_panel=SLURM)
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(min=0, help="GPUs per node; each rank takes its own.", rich_help_panel=SLURM),
    ] = None,
    gpus_per_task: Annotated[
        int | None,
        typer.Option(min=0, help="GPUs Slurm binds to each rank.", rich_help_panel=SLURM),
    ] = None,
    cpus_per_task: Annotated[
        int | None, typer.Option(min=1, help="CPUs per rank.", rich_help_panel=SLURM)
    ] = None,
    mem_gb: Annotated[
        float | None, typer.Option(min=0.001, help="Memory per node, GB.", rich_help_panel=SLURM)
    ] = None,
    timeout_min: Annotated[int | None, timeout_min_option(SLURM)] = None,
    slurm_partition: Annotated[str | None, slurm_option("partition", SLURM)] = None,
    slurm_account: Annotated[str | None, slurm_option("account", SLURM)] = None,
    slurm_qos: Annotated[str | None, slurm_option("qos", SLURM)] = None,
    slurm_constraint: Annotated[str | None, slurm_option("constraint", SLURM)] = None,
    slurm_additional: Annotated[list[str] | None, slurm_additional_option(SLURM)] = None,
) -> None:
    slurm_options = {
        "nodes": nodes,
        "ntasks_per_node": ntasks_per_node,
        "gpus_per_node": gpus_per_node,
        "gpus_per_task": gpus_per_task,
        "cpus_per_task": cpus_per_task,
        "mem_gb": mem_gb,
        "timeout_min": timeout_min,
        "slurm_partition": slurm_partition,
        "slurm_account": slurm_account,
        "slurm_qos": slurm_qos,
        "slurm_constraint": slurm_constraint,
        "slurm_additional": slurm_additional_options(slurm_additional),
    }
    if slurm:
        if nproc is not None or local or gpus_per_rank is not None:
            fail(
                "--nproc, --local and --gpus-per-rank do not go with --slurm: give "
                "--nodes and --ntasks-per-node (one rank per task), and --gpus-per-node "
                "or --gpus-per-task.",
                EXIT_USAGE,
            )
        _submit(program, module, max_restarts, log_dir, rendezvous_timeout, stop_grace, tf_ps,
                prefix, slurm_options)  # fmt: skip
        return
    given = [k for k, v in slurm_options.items() if v is not None]
    if given:
        fail(
            f"--{given[0].replace('_', '-')} is an option of Slurm jobs: add --slurm to "
            "submit one, or leave it out to launch here.",
            EXIT_USAGE,
        )
    from paralela.distributed import launch as run_launch

    with handling_errors("Every rank was stopped."):
        result = run_launch(
            program,
            nproc=nproc,
            module=module,
            max_restarts=max_restarts,
            log_dir=log_dir,
            rendezvous_timeout=rendezvous_timeout,
            stop_grace=stop_grace,
            gpus_per_rank=gpus_per_rank,
            tf_ps=tf_ps,
            local=local,
            prefix=prefix,
        )
    restarts = f" after {result.restarts} restart(s)" if result.restarts else ""
    print(
        f"paralela launch: {result.world_size} rank(s) finished{restarts} in "
        f"{result.wall_s:.1f} s; logs in {result.log_dir}",
        file=sys.stderr,
    )


def slurm_additional_options(values: list[str] | None) -> list[str] | None:
    """``KEY=VALUE`` or ``KEY`` (``reservation=r1``, ``exclusive``, ``--exclusive``) to
    sbatch options (``--reservation=r1``, ``--exclusive``)."""
    if not values:
        return None
    options = []
    for value in values:
        key, sep, rest = value.partition("=")
        flag = key if key.startswith("-") else "--" + key.replace("_", "-")
        options.append(f"{flag}={rest}" if sep else flag)
    return options


def _submit(
    program: list[str],
    module: bool,
    max_restarts: int,
    log_dir: Path | None,
    rendezvous_timeout: float | None,
    stop_grace: float,
    tf_ps: int,
    prefix: bool,
    options: dict[str, Any],
) -> None:
    from paralela.distributed import submit_launch

    given = {k: v for k, v in options.items() if v is not None}
    with handling_errors("The Slurm job was cancelled."):
        result = submit_launch(
            program,
            module=module,
            max_restarts=max_restarts,
            log_dir=log_dir,
            rendezvous_timeout=rendezvous_timeout,
            stop_grace=stop_grace,
            tf_ps=tf_ps,
            prefix=prefix,
            **given,
        )
    print(
        f"paralela launch: Slurm job {result.job_id}: {result.world_size} rank(s) finished "
        f"in {result.wall_s:.1f} s; output {result.output}; logs in {result.log_dir}",
        file=sys.stderr,
    )
