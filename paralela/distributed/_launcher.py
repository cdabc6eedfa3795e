"""``paralela launch``: start the ranks of a distributed program, here or under Slurm.

::

    launch(program, nproc=...)
      │  plan: local (--nproc N, free ports) or Slurm step (SLURM_* → RankSpec)
      │  pin:  one GPU per local rank where GPUs exist, thread limits per rank
      ▼
    attempt 0 ── RankGroup: every rank meets at the preflight, then runs the program
      │            all exit 0 ──────────────► LaunchResult
      │            a rank dies ─► stop the others (SIGTERM, then SIGKILL)
      ▼                           restarts left? ─ no ─► RankFailedError (rank, how, log tail)
    attempt 1 ... (new ports; the program resumes from its checkpoint)

Each attempt appends to ``rank-N.log`` in the log directory and rewrites
``launch.json`` (ranks, hosts, pids, start and end times, exit codes).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from paralela._files import atomic_write
from paralela.backends import sigterm_as_interrupt
from paralela.distributed import _site
from paralela.distributed._bootstrap import EXIT_PREFLIGHT
from paralela.distributed._env import RankSpec, local_specs, slurm_spec
from paralela.distributed._group import RankGroup, RankProcess
from paralela.distributed._joining import join_file
from paralela.distributed._rendezvous import DEFAULT_TIMEOUT
from paralela.errors import ConfigError, RankFailedError, RendezvousError, describe_exit

__all__ = ["LaunchResult", "in_slurm_step", "launch"]

DEFAULT_STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when a group is stopped
_BATCH_STEP_IDS = {"batch", "4294967294", "extern", "4294967295"}


@dataclass(frozen=True)
class LaunchResult:
    """A launch whose ranks all exited 0.

    Attributes:
        world_size: number of ranks.
        restarts: how many times the group was restarted after a failure.
        log_dir: where ``rank-N.log`` and ``launch.json`` are.
        wall_s: seconds from the first start to the last exit.
    """

    world_size: int
    restarts: int
    log_dir: Path
    wall_s: float


def in_slurm_step(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a task of a Slurm job step (started by ``srun``)."""
    env = os.environ if env is None else env
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
    return bool(env.get("SLURM_JOB_ID")) and bool(step) and step not in _BATCH_STEP_IDS


def launch(
    program: Sequence[str],
    *,
    nproc: int | None = None,
    module: bool = False,
    max_restarts: int = 0,
    log_dir: str | os.PathLike[str] | None = None,
    rendezvous_timeout: float | None = None,
    preflight_timeout: float | None = None,
    stop_grace: float = DEFAULT_STOP_GRACE,
    gpus_per_rank: int | None = None,
    tf_ps: int = 0,
    local: bool = False,
    console: IO[bytes] | None = None,
    prefix: bool = True,
) -> LaunchResult:
    """Run ``program`` as the ranks of one distributed job and wait for them.

    Outside Slurm (or with ``local=True``) it starts ``nproc`` ranks on this machine
    (default: one per GPU, else 1). Inside a Slurm job step (``srun paralela launch
    ...``) this task is one rank, or runs ``nproc`` ranks of its node. Every rank gets
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, ``TF_CONFIG``, its own GPU where GPUs exist, and thread limits;
    the ranks meet at a preflight rendezvous before the program runs.

    Args:
        program: the script and its arguments (``["train.py", "--lr", "0.1"]``), a
            module and its arguments with ``module=True``, or any command.
        nproc: ranks to start here; ``None``: one per GPU (at least 1), or one per
            Slurm task.
        module: run ``program[0]`` as ``python -m``.
        max_restarts: when a rank dies, stop the others and start the group again, at
            most this many times; the program resumes from its last checkpoint
            (:func:`paralela.distributed.save_checkpoint`).
        log_dir: where ``rank-N.log`` go; default ``paralela-runs/launch-<name>-<time>``
            (``-<job id>`` under Slurm, shared by every task of the job).
        rendezvous_timeout: seconds the ranks wait for each other: at the preflight
            rendezvous, and, for programs that call torch's ``init_process_group``,
            without any rank entering or joining the group (default 120, or
            ``PARALELA_RENDEZVOUS_TIMEOUT``). A rank that ends (even with 0) while
            another waits for it in ``init_process_group`` stops the group at once.
        preflight_timeout: the former name of ``rendezvous_timeout``, kept as an alias.
        stop_grace: seconds between SIGTERM and SIGKILL when ranks are stopped.
        gpus_per_rank: GPUs per rank; default 1 where GPUs exist, else 0 (0 hides them).
        tf_ps: TensorFlow parameter servers: rank 0 is the chief, ranks 1..tf_ps the
            servers, the rest workers; 0: every rank a worker (MultiWorkerMirrored).
            With servers, the chief exiting 0 ends the job: the servers (which serve
            forever) and workers still running are stopped.
        local: start ranks on this machine even inside a Slurm job step.
        console: where the ranks' output is copied (it always goes to their log
            files too); default this process's stdout.
        prefix: put ``[rank N]`` before each copied line.

    Returns:
        What ran, when every rank exited 0.

    Raises:
        ConfigError: bad arguments, a program that does not exist, more ranks than GPUs.
        RendezvousError: the ranks did not all meet within ``rendezvous_timeout``, or
            a rank left or stalled before torch's process group was complete (the
            message names it and its log); the others were stopped.
        RankFailedError: a rank died (and restarts were used up); the others were
            stopped. The message names the rank, how it died and the tail of its log.
        KeyboardInterrupt: on Ctrl-C or SIGTERM, after stopping every rank.
    """
    if max_restarts < 0:
        raise ConfigError(f"max_restarts must be >= 0, got {max_restarts}.")
    timeout = resolve_rendezvous_timeout(rendezvous_timeout, preflight_timeout)
    argv = resolve_program(program, module=module)
    slurm = in_slurm_step() and not local
    from paralela.resources import detect

    resources = detect()
    if nproc is None and not slurm:
        nproc = max(1, len(resources.gpus))
    plan = _Plan(nproc=nproc, slurm=slurm, tf_ps=tf_ps)
    first = plan.specs(0)  # validates the Slurm variables before anything starts
    pins = _pins(resources, first, gpus_per_rank, slurm and nproc is None)
    directory = Path(log_dir) if log_dir is not None else _default_log_dir(program, slurm)
    _check_writable(directory)
    out = _console(console)
    # torchrun's rendezvous id: the same for every rank (and every task of a Slurm job).
    run_id = os.environ.get("SLURM_JOB_ID", directory.name) if slurm else directory.name
    started = time.monotonic()
    attempts: list[list[dict[str, Any]]] = []
    with sigterm_as_interrupt():
        for restart in range(max_restarts + 1):
            specs = first if restart == 0 else plan.specs(restart)
            elastic = _Elastic(run_id, max_restarts, directory)
            envs = [
                _rank_env(spec, pin, timeout, elastic)
                for spec, pin in zip(specs, pins, strict=True)
            ]
            group = RankGroup(specs, argv, envs, directory, out, prefix)
            try:
                failed = _wait(group, specs, tf_ps, timeout)
            finally:
                group.stop(stop_grace)
                attempts.append([r.record() for r in group.ranks])
                _write_record(directory, argv, specs, attempts)
            if failed is None:
                return LaunchResult(
                    world_size=specs[0].world_size,
                    restarts=restart,
                    log_dir=directory,
                    wall_s=time.monotonic() - started,
                )
            error = _failure(failed, len(group.ranks))
            if restart == max_restarts or isinstance(error, RendezvousError):
                raise error
            _say_restart(out, error, restart, max_restarts)
    raise AssertionError("unreachable")  # pragma: no cover


def _wait(
    group: RankGroup, specs: Sequence[RankSpec], tf_ps: int, timeout: float
) -> RankProcess | None:
    """The group's first failed rank; ``None`` once every rank exited 0 (with parameter
    servers, once TensorFlow's chief, rank 0, did: its ending is the job's end)."""
    chief = 0 if tf_ps and any(s.rank == 0 for s in specs) else None
    return group.wait_first_failure(done_when_exits=chief, rendezvous_timeout=timeout)


def _say_restart(
    out: IO[bytes], error: RankFailedError | RendezvousError, restart: int, max_restarts: int
) -> None:
    _say(
        out,
        f"paralela launch: {error.args[0].splitlines()[0]} Restarting the group "
        f"(restart {restart + 1} of {max_restarts}).\n",
    )


def resolve_rendezvous_timeout(
    rendezvous_timeout: float | None = None, preflight_timeout: float | None = None
) -> float:
    """The rendezvous timeout: the argument, its former name, the environment, or 120 s.

    Raises:
        ConfigError: both names given with different values, or a value that is not a
            positive number of seconds.
    """
    both = rendezvous_timeout is not None and preflight_timeout is not None
    if both and rendezvous_timeout != preflight_timeout:
        raise ConfigError(
            f"rendezvous_timeout={rendezvous_timeout:g} and preflight_timeout="
            f"{preflight_timeout:g} disagree: preflight_timeout is the former name of "
            "rendezvous_timeout. Give only --rendezvous-timeout (rendezvous_timeout=)."
        )
    given = rendezvous_timeout if rendezvous_timeout is not None else preflight_timeout
    name = "rendezvous_timeout"
    shown: object = given
    if given is None:
        for name in ("PARALELA_RENDEZVOUS_TIMEOUT", "PARALELA_PREFLIGHT_TIMEOUT"):
            text = os.environ.get(name, "").strip()
            if text:
                shown = text  # as written: "soon", not nan
                try:
                    given = float(text)
                except ValueError:
                    given = float("nan")
                break
        else:
            return DEFAULT_TIMEOUT
    if not given > 0 or given == float("inf"):
        raise ConfigError(
            f"{name} must be a positive number of seconds, got {shown!r}. Give e.g. "
            "--rendezvous-timeout 300 for ranks that are slow to start."
        )
    return given


def resolve_program(program: Sequence[str], *, module: bool = False) -> list[str]:
    """The argv each rank execs: Python scripts and modules run on this interpreter.

    Raises:
        ConfigError: no program, a script that does not exist, an unknown command.
    """
    if not program:
        raise ConfigError(
            "No program to launch: give a script (train.py), -m module, or a command."
        )
    head, rest = program[0], list(program[1:])
    if module:
        return [sys.executable, "-m", head, *rest]
    if head.endswith(".py"):
        if not Path(head).is_file():
            raise ConfigError(
                f"The script {head!r} does not exist (looked in {Path.cwd()}). "
                "Check the path, or use -m for a module."
            )
        return [sys.executable, head, *rest]
    if shutil.which(head) is None:
        raise ConfigError(
            f"Cannot find the program {head!r} on PATH. Give a script ending in .py, "
            "-m module, or a command that exists on every host."
        )
    return [head, *rest]


@dataclass(frozen=True)
class _Plan:
    nproc: int | None
    slurm: bool
    tf_ps: int

    def specs(self, restart: int) -> list[RankSpec]:
        if not self.slurm:
            assert self.nproc is not None
            return local_specs(self.nproc, restart=restart, tf_ps=self.tf_ps)
        count = 1 if self.nproc is None else self.nproc
        return [
            slurm_spec(nproc=self.nproc, local_rank=i, restart=restart, tf_ps=self.tf_ps)
            for i in range(count)
        ]


def _pins(
    resources: Any, specs: Sequence[RankSpec], gpus_per_rank: int | None, one_task: bool
) -> list[dict[str, str]]:
    """Per local rank: the GPU and thread-limit variables (see ``Slot.env``)."""
    from paralela.resources import make_slots

    gpus = len(resources.gpus)
    per_rank = (1 if gpus else 0) if gpus_per_rank is None else gpus_per_rank
    if per_rank < 0:
        raise ConfigError(f"gpus_per_rank must be >= 0, got {per_rank}.")
    if one_task:
        # One Slurm task per rank: Slurm already gave this task its CPUs and GPUs. Only
        # when every task of the node sees the same several GPUs, take this rank's one.
        spec = specs[0]
        choose = per_rank == 1 and gpus > 1 and gpus == spec.local_world_size
        chosen = [str(resources.gpus[spec.local_rank].index)] if choose else None
        slot = make_slots(resources, n_slots=1, gpus_per_slot=1 if choose else 0, gpus=chosen)
        env = slot[0].env()
        if not choose:
            env.pop("CUDA_VISIBLE_DEVICES")  # keep what Slurm set
            env.pop("CUDA_DEVICE_ORDER")
        return [env]
    if per_rank and gpus < per_rank * len(specs):
        raise ConfigError(
            f"{len(specs)} rank(s) x {per_rank} GPU(s) each need {per_rank * len(specs)} "
            f"GPUs, but {gpus} are visible. Use --nproc {max(1, gpus // per_rank)}, or "
            "--gpus-per-rank 0 to train on the CPUs."
        )
    slots = make_slots(resources, n_slots=len(specs), gpus_per_slot=per_rank)
    return [slot.env() for slot in slots]


@dataclass(frozen=True)
class _Elastic:
    """What torchrun's agent tells its workers beyond who they are (see ``_rank_env``)."""

    run_id: str
    max_restarts: int
    log_dir: Path

    def error_file(self, spec: RankSpec) -> Path:
        """Where ``@record`` writes this rank's exception: fresh for every attempt."""
        return self.log_dir / "errors" / f"attempt-{spec.restart}" / f"rank-{spec.rank}.json"


def _rank_env(
    spec: RankSpec, pin: Mapping[str, str], timeout: float, elastic: _Elastic
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(pin)
    env.update(spec.env())
    # The rest of torchrun's contract: is_torchelastic_launched() reads TORCHELASTIC_RUN_ID,
    # and torch.distributed.elastic's @record writes the rank's exception, with its
    # traceback, to TORCHELASTIC_ERROR_FILE, which the launcher shows when the rank fails.
    error_file = elastic.error_file(spec)
    error_file.parent.mkdir(parents=True, exist_ok=True)
    error_file.unlink(missing_ok=True)  # a reused log directory: not a past attempt's error
    # The rank's sitecustomize says in this file when it enters and joins the process group.
    joins = join_file(elastic.log_dir, spec.rank, spec.restart)
    joins.parent.mkdir(parents=True, exist_ok=True)
    joins.unlink(missing_ok=True)
    env["PARALELA_JOIN_FILE"] = str(joins)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(_site.__file__).parent), env.get("PYTHONPATH", "")) if p
    )
    env.update(
        TORCHELASTIC_RUN_ID=elastic.run_id,
        TORCHELASTIC_MAX_RESTARTS=str(elastic.max_restarts),
        TORCHELASTIC_USE_AGENT_STORE="False",
        TORCHELASTIC_ERROR_FILE=str(error_file),
        TORCH_NCCL_ASYNC_ERROR_HANDLING=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    )
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the log and console as they are printed
    env["PARALELA_LAUNCHER_PID"] = str(os.getpid())
    env["PARALELA_PREFLIGHT_TIMEOUT"] = str(timeout)
    return env


def _check_writable(directory: Path) -> None:
    """Fail before any rank starts if the logs cannot be written (exit 2 on the CLI)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"Cannot write the launch's logs to {directory}: {reason}. Pass --log-dir "
            "(log_dir=) a directory you can write to."
        ) from exc


def _default_log_dir(program: Sequence[str], slurm: bool) -> Path:
    name = Path(program[0]).stem if program else "program"
    if slurm:
        suffix = os.environ.get("SLURM_JOB_ID", "job")
    else:
        suffix = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    return Path("paralela-runs") / f"launch-{name}-{suffix}"


def _console(console: IO[bytes] | None) -> IO[bytes]:
    return console if console is not None else sys.stdout.buffer


def _say(out: IO[bytes], text: str) -> None:
    out.write(text.encode())
    out.flush()


def _failure(rank: RankProcess, group_size: int) -> RankFailedError | RendezvousError:
    spec = rank.spec
    where = f"rank {spec.rank} (pid {rank.proc.pid} on {spec.rank_hosts[spec.rank]})"
    tail = rank.log_tail()
    if rank.returncode == EXIT_PREFLIGHT:
        reason = next(
            (
                ln.split(": ", 2)[-1]
                for ln in tail.splitlines()
                if ln.startswith("paralela launch: rank")
            ),
            f"{where} failed its preflight rendezvous.",
        )
        return RendezvousError(f"{reason} (log: {rank.log_path})")
    others = group_size - 1
    stopped = f"; the other {others} rank(s) here were stopped" if others else ""
    recorded = rank.recorded_error()
    if recorded is not None:  # the program used @record: its exception, as torchrun shows
        shown, heading = recorded, f"Its error ({rank.error_file}):"
    else:
        shown, heading = tail, "Last lines:"
    indented = "\n".join("  " + line for line in shown.splitlines())
    message = (
        f"{where[0].upper()}{where[1:]} died: {describe_exit(rank.returncode)}{stopped}. "
        f"Its log: {rank.log_path}\n{heading}\n{indented}"
    )
    return RankFailedError(
        message, rank=spec.rank, exitcode=rank.returncode, log_path=str(rank.log_path)
    )


def _write_record(
    directory: Path,
    argv: Sequence[str],
    specs: Sequence[RankSpec],
    attempts: list[list[dict[str, Any]]],
) -> None:
    first = specs[0]
    if first.nnodes == 1 and len(specs) == first.world_size:
        name = "launch.json"  # one launcher started every rank
    elif len(specs) == first.local_world_size:
        name = f"launch-node{first.node_rank}.json"  # one launcher per node
    else:  # one launcher per rank (srun, a task per rank): one record each
        name = f"launch-node{first.node_rank}-rank{first.rank}.json"
    record = {
        "argv": list(argv),
        "world_size": specs[0].world_size,
        "nnodes": specs[0].nnodes,
        "master": f"{specs[0].master_addr}:{specs[0].master_port}",
        "attempts": attempts,
    }
    atomic_write(directory / name, json.dumps(record, indent=2).encode("utf-8"))
