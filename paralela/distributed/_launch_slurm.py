"""``paralela launch --slurm``: submit the ranks of a distributed program as one Slurm job.

::

    submit_launch(["train.py", ...], nodes=2, ntasks_per_node=4, gpus_per_node=4)
      │ validate options (unknown name -> ConfigError listing the valid ones)
      │ write paralela-runs/launch-<script>-<job id>.sbatch:
      │     #SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 ...
      │     exec srun --kill-on-bad-exit=1 python -m paralela launch ... train.py ...
      ▼
    run_job (:mod:`paralela.backends.slurm`): submit, copy the job's output to the
      │ console while it runs, wait for its end; Ctrl-C / SIGTERM cancels it (scancel)
      ▼
    COMPLETED ──► SlurmLaunchResult
    otherwise ──► the rank that died first (the launchers' launch-node*.json, else
                  their "Rank N ... died" lines): RankFailedError / RendezvousError;
                  else DistributedError with the job's state (CANCELLED, TIMEOUT, ...)
                  and the tail of its output

The in-job launchers (one ``paralela launch`` per task, see :mod:`._launcher`) write
``rank-N.log`` and ``launch-node<N>.json`` into ``paralela-runs/launch-<script>-<job
id>/`` on the shared filesystem, and print every rank's lines, prefixed ``[rank N]``,
to the job's output file, which is what is streamed. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from paralela.backends.slurm import (
    JOB_OPTIONS,
    JobOptions,
    JobRun,
    job_options,
    render_script,
    require_slurm,
    run_job,
    tail_of,
)
from paralela.distributed._bootstrap import EXIT_PREFLIGHT
from paralela.distributed._launcher import (
    DEFAULT_STOP_GRACE,
    resolve_program,
    resolve_rendezvous_timeout,
)
from paralela.distributed._rendezvous import DEFAULT_TIMEOUT
from paralela.errors import (
    ConfigError,
    DistributedError,
    RankFailedError,
    RendezvousError,
    describe_exit,
)

__all__ = [
    "LAUNCH_OPTIONS",
    "SlurmLaunchResult",
    "launch_failure",
    "launch_script",
    "submit_launch",
]

#: The Slurm options :func:`submit_launch` accepts: all of them.
LAUNCH_OPTIONS = JOB_OPTIONS


def launch_script(
    program: Sequence[str],
    options: JobOptions,
    *,
    module: bool = False,
    max_restarts: int = 0,
    preflight_timeout: float = DEFAULT_TIMEOUT,
    stop_grace: float = DEFAULT_STOP_GRACE,
    tf_ps: int = 0,
    prefix: bool = True,
    log_dir: str,
    output: Path,
    workdir: Path,
) -> str:
    """The batch script of ``launch --slurm``: one ``paralela launch`` task per rank.

    ``log_dir`` is put in the script as is (shell-quoted) except for a trailing
    ``${SLURM_JOB_ID}``, which the shell expands in the job.
    """
    launch = [options.python, "-m", "paralela", "launch"]
    launch += ["--max-restarts", str(max_restarts), "--preflight-timeout", f"{preflight_timeout:g}"]
    launch += ["--stop-grace", f"{stop_grace:g}", "--tf-ps", str(tf_ps)]
    if not prefix:
        launch.append("--no-prefix")
    if module:
        launch.append("--module")
    job_var = "${SLURM_JOB_ID}"
    quoted_dir = (
        shlex.quote(log_dir[: -len(job_var)]) + f'"{job_var}"'
        if log_dir.endswith(job_var)
        else shlex.quote(log_dir)
    )
    command = " ".join(shlex.quote(a) for a in launch)
    command += f" --log-dir {quoted_dir} " + " ".join(shlex.quote(a) for a in program)
    body = [
        "# Threads per rank for anything not started by paralela launch (which sets each",
        "# rank's own OMP_NUM_THREADS, MKL_NUM_THREADS... from the CPUs it may use).",
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        'export MKL_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        "export PYTHONUNBUFFERED=1",
        "# One task per rank; when one task fails, srun stops the others.",
        f"exec srun --kill-on-bad-exit=1 {command}",
    ]
    stem = _stem(program)
    return render_script(
        options,
        body,
        job_name=f"paralela-launch-{stem}",
        output=output,
        workdir=workdir,
        what="launch --slurm",
    )


# -- launch --slurm -----------------------------------------------------------------


@dataclass(frozen=True)
class SlurmLaunchResult:
    """A ``launch --slurm`` job whose ranks all exited 0.

    Attributes:
        job_id: the Slurm job id.
        world_size: number of ranks (nodes x tasks per node).
        log_dir: the ranks' ``rank-N.log`` and the launchers' ``launch-node*.json``.
        output: the job's output file (every rank's lines, prefixed ``[rank N]``).
        script: the batch script that was submitted.
        wall_s: seconds from submission to the end (queue time included).
    """

    job_id: str
    world_size: int
    log_dir: Path
    output: Path
    script: Path
    wall_s: float


def _stem(program: Sequence[str]) -> str:
    return Path(program[0]).stem if program else "program"


def submit_launch(
    program: Sequence[str],
    *,
    nodes: int = 1,
    ntasks_per_node: int = 1,
    module: bool = False,
    max_restarts: int = 0,
    rendezvous_timeout: float | None = None,
    preflight_timeout: float | None = None,
    stop_grace: float = DEFAULT_STOP_GRACE,
    tf_ps: int = 0,
    log_dir: str | os.PathLike[str] | None = None,
    console: IO[bytes] | None = None,
    prefix: bool = True,
    **options: Any,
) -> SlurmLaunchResult:
    """Submit ``program`` as a Slurm job of ``nodes`` x ``ntasks_per_node`` ranks and wait.

    Writes the batch script that runs ``srun --kill-on-bad-exit=1 python -m paralela
    launch PROGRAM`` (one task per rank: each task's launcher finds its rank, the
    master and the ports from ``SLURM_*``, see :func:`paralela.distributed.launch`),
    submits it from the current directory (which the compute nodes must share), copies
    the job's output (every rank's lines, prefixed ``[rank N]``) to ``console`` while
    it runs, and returns when the job ended.

    Args:
        program: the script and its arguments, or a module with ``module=True``; a
            relative script path is relative to the current directory, as in the job.
        nodes: ``--nodes``.
        ntasks_per_node: ranks per node (``--ntasks-per-node``).
        module: as for :func:`paralela.distributed.launch` (so are the next five),
            given to every task's launcher.
        max_restarts: as for ``launch``.
        rendezvous_timeout: as for ``launch``.
        preflight_timeout: ``rendezvous_timeout``'s former name.
        stop_grace: as for ``launch``.
        tf_ps: as for ``launch``.
        prefix: as for ``launch``.
        log_dir: where the ranks' logs go; default
            ``paralela-runs/launch-<script>-<job id>``.
        console: where the job's output is copied (default: stdout).
        **options: Slurm options: ``cpus_per_task``, ``gpus_per_node`` (each rank of a
            node takes its own GPU of those) or ``gpus_per_task`` (Slurm binds them),
            ``mem_gb``, ``timeout_min``, ``slurm_partition``, ``slurm_account``,
            ``slurm_qos``, ``slurm_constraint``, ``slurm_additional`` (more sbatch
            options: ``{"exclusive": True}`` or ``["--exclusive"]``),
            ``slurm_job_name``, ``slurm_python``, ``slurm_setup`` (shell lines).

    Returns:
        The job, when it completed (every rank exited 0).

    Raises:
        ConfigError: an unknown option (the message lists the valid ones), a bad
            value, a script that does not exist, or no Slurm commands on PATH; nothing
            was submitted.
        SlurmCommandError: sbatch refused the job (unknown partition, a limit...).
        RankFailedError: a rank died (restarts used up): the one that died first,
            how, its log and its last lines; srun stopped the others.
        RendezvousError: the ranks did not all meet within ``rendezvous_timeout``, or a
            rank left or stalled before torch's process group was complete.
        DistributedError: the job ended otherwise: cancelled, timed out, a node
            failed, or it vanished from Slurm; the message has its output's tail.
        KeyboardInterrupt: on Ctrl-C or SIGTERM, after cancelling the job.
    """
    opts = job_options(
        {"nodes": nodes, "ntasks_per_node": ntasks_per_node, **options},
        valid=LAUNCH_OPTIONS,
        what="launch --slurm",
    )
    if max_restarts < 0:
        raise ConfigError(f"max_restarts must be >= 0, got {max_restarts}.")
    resolve_program(program, module=module)  # the script exists (the nodes share it)
    require_slurm("launch --slurm")
    workdir = Path.cwd()
    runs = workdir / "paralela-runs"
    stem = _stem(program)
    given_dir = None if log_dir is None else Path(log_dir).absolute()
    in_job_dir = str(given_dir) if given_dir else f"{runs}/launch-{stem}-${{SLURM_JOB_ID}}"
    output_pattern = runs / f"launch-{stem}-%j.out"
    script_text = launch_script(
        program,
        opts,
        module=module,
        max_restarts=max_restarts,
        preflight_timeout=resolve_rendezvous_timeout(rendezvous_timeout, preflight_timeout),
        stop_grace=stop_grace,
        tf_ps=tf_ps,
        prefix=prefix,
        log_dir=in_job_dir,
        output=output_pattern,
        workdir=workdir,
    )
    run = run_job(
        script_text,
        script_path=runs / f"launch-{stem}-{{job}}.sbatch",
        output_pattern=output_pattern,
        workdir=workdir,
        label="launch",
        console=console,
    )
    logs = given_dir or runs / f"launch-{stem}-{run.job_id}"
    if run.state.state == "COMPLETED":
        return SlurmLaunchResult(
            job_id=run.job_id,
            world_size=opts.nodes * opts.ntasks_per_node,
            log_dir=logs,
            output=run.output,
            script=run.script,
            wall_s=run.wall_s,
        )
    raise launch_failure(run, logs)


def _records(log_dir: Path) -> list[dict[str, Any]]:
    """Every rank of the last attempt recorded by the in-job launchers."""
    ranks: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("launch*.json")):
        try:
            attempts = json.loads(path.read_text()).get("attempts") or []
        except (OSError, ValueError):
            continue
        if attempts:
            ranks.extend(r for r in attempts[-1] if isinstance(r, dict))
    return ranks


# What an in-job launcher prints when one of its ranks dies (see _launcher._failure).
_DIED = re.compile(
    r"Error: Rank (\d+) \(pid \d+ on ([^)]*)\) died: (exit code (-?\d+)|killed by (\w+))"
    r".*?Its log: (\S+)"
)


def _first_failure(log_dir: Path, output: str) -> dict[str, Any] | None:
    """The rank that died first: the earliest end among the launchers' records of ranks
    with a non-zero exit; else the first "Rank N ... died" a launcher printed (several
    tasks on one node share one record file, so a record can miss a rank)."""
    failed = [
        r
        for r in _records(log_dir)
        if isinstance(r.get("returncode"), int) and r["returncode"] != 0 and r.get("end")
    ]
    if failed:
        return min(failed, key=lambda r: float(r["end"]))
    for found in _DIED.finditer(output):
        rank, host, _, status, sig, log = found.groups()
        if status is not None:
            code = int(status)
        else:
            code = -int(getattr(signal.Signals, sig, signal.SIGKILL))
        return {"rank": int(rank), "host": host, "returncode": code, "log": log.rstrip(".")}
    return None


def _read_tail(path: Path, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def launch_failure(run: JobRun, log_dir: Path) -> DistributedError:
    """The error for a ``launch --slurm`` job that did not complete.

    The rank that died first is found in the launchers' records (the earliest end
    among ranks with a non-zero exit), else in what they printed; a job that ended for
    another reason (cancelled, timed out, a node failed) is named by its state.
    """
    job, state = run.job_id, run.state
    output = run.output_tail()
    shown = f"\nLast lines of the job's output ({run.output}):\n{output}" if output else ""
    first = None
    if state.state in ("FAILED", "OUT_OF_MEMORY"):
        first = _first_failure(log_dir, _read_tail(run.output))
    if first is not None:
        rank, code, log = int(first["rank"]), int(first["returncode"]), str(first["log"])
        if code == EXIT_PREFLIGHT:
            said = [ln for ln in _read_tail(run.output).splitlines() if "Error:" in ln]
            reason = said[0].split("Error:", 1)[1].strip() if said else ""
            return RendezvousError(
                f"Slurm job {job}: the ranks did not all meet at the preflight "
                f"rendezvous. {reason or f'Rank {rank} gave up waiting.'} (log: {log})" + shown
            )
        return RankFailedError(
            f"Rank {rank} (on {first.get('host', '?')}) died first: {describe_exit(code)}; "
            f"Slurm job {job} ended {state.state} and srun stopped the other ranks. "
            f"Its log: {log}\nLast lines:\n{tail_of(log)}",
            rank=rank,
            exitcode=code,
            log_path=log,
        )
    why = {
        "CANCELLED": "it was cancelled (scancel, or an administrator)",
        "TIMEOUT": "it reached its time limit: raise timeout_min (--timeout-min); "
        "with checkpoints, submit again to resume",
        "NODE_FAIL": "a node failed: submit again (resume from the last checkpoint)",
        "OUT_OF_MEMORY": "it ran out of memory: raise mem_gb (--mem-gb)",
        "PREEMPTED": "it was preempted: submit again, or add slurm_additional {'requeue': True}",
        "VANISHED": f"no Slurm command knows it any more (no accounting?); see {run.output}",
    }.get(state.state, "no rank reported a failure (see the output below)")
    return DistributedError(
        f"Slurm job {job} ended {state.describe()}: {why}. Rank logs: {log_dir}" + shown
    )
