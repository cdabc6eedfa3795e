"""``paralela launch``: start the ranks of a distributed program (torchrun's job, plus
Slurm, TensorFlow, a preflight rendezvous and restarts)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RENDEZVOUS,
    EXIT_USAGE,
    fail,
)
from paralela.errors import ConfigError, RankFailedError, RendezvousError

LAUNCH_HELP = (
    "Run PROGRAM as the ranks of one distributed job.\n\n"
    "Here: paralela launch --nproc 2 train.py --epochs 3 (free ports, one GPU per rank "
    "where GPUs exist, OMP_NUM_THREADS per rank). In a Slurm job: srun paralela launch "
    "train.py, one task per rank (rank, world size, master host and port from SLURM_*). "
    "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
    "MASTER_PORT and TF_CONFIG; the ranks meet at a preflight rendezvous before PROGRAM "
    "runs. Options go before PROGRAM; everything after it is PROGRAM's."
)
EPILOG = (
    "Exit codes: 0 every rank exited 0; 1 a rank failed (the others were stopped; its "
    "log tail is printed); 2 bad usage; 5 the ranks did not meet within "
    "--preflight-timeout; 130 interrupted."
)


@app.command(
    help=LAUNCH_HELP,
    short_help="Start the ranks of a distributed training (DDP, TF), here or under Slurm.",
    epilog=EPILOG,
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
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
        bool, typer.Option("--module", "-m", help="Run PROGRAM as python -m PROGRAM.")
    ] = False,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Restart the group this often after a rank dies.")
    ] = 0,
    log_dir: Annotated[
        Path | None,
        typer.Option("--log-dir", help="Default: paralela-runs/launch-<name>-<time or job>."),
    ] = None,
    preflight_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds the ranks wait for each other.")
    ] = 60.0,
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
        bool, typer.Option("--prefix/--no-prefix", help="'[rank N] ' before each line.")
    ] = True,
) -> None:
    from paralela.distributed import launch as run_launch

    try:
        result = run_launch(
            program,
            nproc=nproc,
            module=module,
            max_restarts=max_restarts,
            log_dir=log_dir,
            preflight_timeout=preflight_timeout,
            stop_grace=stop_grace,
            gpus_per_rank=gpus_per_rank,
            tf_ps=tf_ps,
            local=local,
            prefix=prefix,
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except RendezvousError as exc:
        fail(str(exc), EXIT_RENDEZVOUS)
    except RankFailedError as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        fail("interrupted; every rank was stopped.", EXIT_INTERRUPTED)
    restarts = f" after {result.restarts} restart(s)" if result.restarts else ""
    print(
        f"paralela launch: {result.world_size} rank(s) finished{restarts} in "
        f"{result.wall_s:.1f} s; logs in {result.log_dir}",
        file=sys.stderr,
    )
