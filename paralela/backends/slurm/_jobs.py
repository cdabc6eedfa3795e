"""Run one Slurm batch job for the user: validate options, write the script, submit it,
copy its output to the console while it runs, wait for its end, cancel it on Ctrl-C.

::

    job_options({...})  ──► JobOptions (unknown name -> ConfigError listing the valid ones)
    render_script(...)  ──► "#!/bin/bash / #SBATCH --nodes=2 ... / body"
    run_job(script)
      │ sbatch ──► job id; the script is kept as <name>-<job id>.sbatch
      ▼
    loop: copy the new complete lines of the job's output file to the console
          (every 0.2 s); ask Slurm the job's state (sacct, else scontrol, else squeue;
          every 0.5 s at first, less often later)
      │ finished (COMPLETED, FAILED, CANCELLED, TIMEOUT, ..., VANISHED) ──► JobRun
      │ Ctrl-C / SIGTERM ──► scancel, wait until it left the queue, KeyboardInterrupt
      ▼
    callers (``launch --slurm``, ``sweep --backend slurm``) turn the state into their
    result or error.

Public as :mod:`paralela.backends.slurm` (``run_job``, ``job_options``, ...); used by
``launch --slurm`` (:mod:`paralela.distributed`) and ``sweep --backend slurm``
(:mod:`paralela.sweeping`). It imports only the ``slurm`` backend's commands and
:mod:`paralela.backends`. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from paralela._files import open_new, temp_path
from paralela.backends._interrupt import sigterm_as_interrupt
from paralela.backends.slurm._commands import SlurmCommandError, cancel, run_command
from paralela.backends.slurm._commands import submit_script as _sbatch
from paralela.backends.slurm._options import parse_options
from paralela.backends.slurm._options import valid_names as _backend_names
from paralela.backends.slurm._state import JobState, StateReader, parse_scontrol
from paralela.errors import ConfigError

__all__ = [
    "JOB_OPTIONS",
    "JobOptions",
    "JobRun",
    "job_options",
    "render_script",
    "run_job",
    "submit_env",
    "tail_of",
]

#: Every Slurm job option (shared names first, then ``slurm_*``); callers accept a subset.
JOB_OPTIONS = (
    "nodes",
    "ntasks_per_node",
    "cpus_per_task",
    "gpus_per_node",
    "gpus_per_task",
    "mem_gb",
    "timeout_min",
    "slurm_partition",
    "slurm_account",
    "slurm_qos",
    "slurm_constraint",
    "slurm_additional",
    "slurm_job_name",
    "slurm_python",
    "slurm_setup",
)

# The output file is read this often (cheap: one stat and read of a local or shared file).
TAIL_INTERVAL_S = 0.2
# Slurm is asked for the job's state at most this often: every 0.5 s in the first 10 s
# (short jobs and tests end quickly), every 2 s for two minutes, then every 10 s, which
# keeps one waiting client far below what a busy controller notices (each ask is one
# sacct or scontrol call).
STATE_INTERVALS_S = ((10.0, 0.5), (120.0, 2.0), (float("inf"), 10.0))
# A job that no Slurm command knows for this long (purged without accounting), or
# Slurm's commands failing this long, ends the wait instead of waiting forever.
LOST_AFTER_S = 120.0
# After scancel, wait at most this long for the job to leave the queue (its tasks get
# SIGTERM, then SIGKILL after the cluster's KillWait, 30 s by default).
CANCEL_WAIT_S = 45.0
# After the job ended, wait at most this long for its output file to appear (a shared
# filesystem can show it late).
OUTPUT_WAIT_S = 5.0
TAIL_LINES = 20


# -- options ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobOptions:
    """What one submitted job asks Slurm for (``None``: the cluster's default).

    Attributes:
        nodes: ``--nodes``.
        ntasks_per_node: ``--ntasks-per-node`` (ranks per node for a launch).
        cpus_per_task: ``--cpus-per-task``.
        gpus_per_node: ``--gpus-per-node``: every task of a node sees these GPUs.
        gpus_per_task: ``--gpus-per-task``: Slurm binds this many GPUs to each task.
        mem_gb: ``--mem`` per node, in GB.
        timeout_min: ``--time`` in minutes.
        partition, account, qos, constraint: ``--partition`` ... ``--constraint``.
        additional: more sbatch options, as given (``--exclusive``).
        job_name: ``--job-name``; ``None``: chosen by the caller.
        python: the Python that runs ``paralela`` in the job (default: this one; it
            must exist at the same path on the compute nodes).
        setup: shell lines run before it (``module load cuda``, ``source venv/bin/activate``).
    """

    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    gpus_per_task: int | None = None
    mem_gb: float | None = None
    timeout_min: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    additional: tuple[str, ...] = ()
    job_name: str | None = None
    python: str = sys.executable
    setup: tuple[str, ...] = ()

    def directives(self) -> list[str]:
        """The sbatch options (``--nodes=2`` ...), in a fixed order."""
        args = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.ntasks_per_node}"]
        for flag, value in (
            ("--cpus-per-task", self.cpus_per_task),
            ("--gpus-per-node", self.gpus_per_node),
            ("--gpus-per-task", self.gpus_per_task),
            ("--mem", None if self.mem_gb is None else f"{max(1, round(self.mem_gb * 1024))}M"),
            ("--time", self.timeout_min),
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--constraint", self.constraint),
        ):
            if value is not None:
                args.append(f"{flag}={value}")
        return [*args, *self.additional]


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"Option {name} must be an integer of at least {minimum}, got {value!r}.")
    return value


def job_options(
    options: Mapping[str, Any], *, valid: Sequence[str] = JOB_OPTIONS, what: str = "launch"
) -> JobOptions:
    """Validate Slurm job options into :class:`JobOptions`.

    Shared names (``nodes``, ``cpus_per_task``, ``gpus_per_task``, ``mem_gb``,
    ``timeout_min``) and ``slurm_*`` ones are checked as the ``slurm`` backend checks
    them; ``ntasks_per_node`` and ``gpus_per_node`` here. ``None`` means "not given".

    Args:
        options: the options by name.
        valid: the names this caller accepts.
        what: the command, for messages (``"launch --slurm"``).

    Raises:
        ConfigError: an unknown name (the message lists the valid ones), a bad value,
            or both ``gpus_per_node`` and ``gpus_per_task``.
    """
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(k for k in options if k not in valid)
    if unknown:
        hints = [
            f"{k!r} (did you mean 'slurm_{k}'?)" if f"slurm_{k}" in valid else repr(k)
            for k in unknown
        ]
        raise ConfigError(
            f"Unknown option(s) {', '.join(hints)} for {what}; valid options are: "
            f"{', '.join(valid)}."
        )
    shared = {k: v for k, v in given.items() if k in _backend_names()}
    parsed = parse_options(shared)  # the backend's own checks, one set of rules
    gpn = given.get("gpus_per_node")
    gpn = None if gpn is None else _count("gpus_per_node", gpn, 0)
    gpt = parsed.gpus_per_task if "gpus_per_task" in given else None
    if gpn and gpt:
        raise ConfigError(
            f"Give gpus_per_node ({gpn}) or gpus_per_task ({gpt}), not both: gpus_per_node "
            "shows every task of a node all its GPUs (each rank takes its own), "
            "gpus_per_task makes Slurm bind GPUs to each task."
        )
    return JobOptions(
        nodes=parsed.nodes,
        ntasks_per_node=_count("ntasks_per_node", given.get("ntasks_per_node", 1), 1),
        cpus_per_task=parsed.cpus_per_task if "cpus_per_task" in given else None,
        gpus_per_node=gpn or None,
        gpus_per_task=gpt or None,
        mem_gb=parsed.mem_gb,
        timeout_min=parsed.timeout_min,
        partition=parsed.slurm_partition,
        account=parsed.slurm_account,
        qos=parsed.slurm_qos,
        constraint=parsed.slurm_constraint,
        additional=parsed.slurm_additional,
        job_name=parsed.slurm_job_name if "slurm_job_name" in given else None,
        python=parsed.slurm_python,
        setup=parsed.slurm_setup,
    )


# -- the batch script ----------------------------------------------------------------


def _value(text: str) -> str:
    """A directive's value, in double quotes when it holds spaces (sbatch reads them)."""
    return f'"{text}"' if any(c.isspace() for c in text) else text


def render_script(
    options: JobOptions,
    body: Sequence[str],
    *,
    job_name: str,
    output: Path,
    workdir: Path,
    what: str,
) -> str:
    """The text of a batch script: ``#SBATCH`` lines, then the setup lines, then ``body``.

    Args:
        options: what to ask Slurm for.
        body: the shell lines that do the work (the last one usually ``exec``-s).
        job_name: ``--job-name`` unless ``options.job_name`` is set.
        output: the job's output file (``%j`` is the job id).
        workdir: the job's working directory (``--chdir``).
        what: the command that wrote it, for the comment at the top.
    """
    lines = [
        "#!/bin/bash",
        f"# Written by `paralela {what}` on {socket.gethostname()} at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; submitted with sbatch.",
        f"#SBATCH --job-name={_value(options.job_name or job_name)}",
        *(f"#SBATCH {arg}" for arg in options.directives()),
        f"#SBATCH --output={_value(str(output))}",
        f"#SBATCH --chdir={_value(str(workdir))}",
        *options.setup,
        *body,
    ]
    return "\n".join(lines) + "\n"


# -- running a job: submit, stream, wait, cancel --------------------------------------


@dataclass(frozen=True)
class JobRun:
    """A submitted job that ended (in whatever state).

    Attributes:
        job_id: Slurm's job id.
        state: its final state (``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMEOUT``,
            ... or ``VANISHED`` when no Slurm command knew it any more).
        script: the batch script that was submitted.
        output: the job's output file.
        wall_s: seconds from submission to the end.
    """

    job_id: str
    state: JobState
    script: Path
    output: Path
    wall_s: float

    def output_tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines of the job's output file, indented ("" when there is none)."""
        return tail_of(self.output, lines)


class _Follower:
    """Copies the complete lines appended to a file to the console."""

    def __init__(self, path: Path, console: IO[bytes]) -> None:
        self.path = path
        self._console = console
        self._offset = 0
        self._partial = b""

    def poll(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return
        self._offset += len(data)
        data = self._partial + data
        cut = len(data) if final else data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if cut:
            with contextlib.suppress(OSError, ValueError):
                self._console.write(data[:cut] + (b"\n" if final and data[-1:] != b"\n" else b""))
                self._console.flush()


def _state_interval(elapsed: float) -> float:
    return next(interval for until, interval in STATE_INTERVALS_S if elapsed < until)


def _say(status: TextIO, label: str, text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        status.write(f"paralela {label}: {text}\n")
        status.flush()


def submit_env() -> dict[str, str]:
    """This environment without the ``SLURM_*`` variables of an enclosing job (they would
    leak into the new job's steps), with unbuffered Python output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_job(
    script_text: str,
    *,
    script_path: Path,
    output_pattern: Path,
    workdir: Path,
    label: str,
    console: IO[bytes] | None = None,
    status: TextIO | None = None,
    progress: Callable[[], Iterable[str]] | None = None,
    reader: StateReader | None = None,
) -> JobRun:
    """Submit a batch script, copy its output to the console while it runs, and wait.

    Args:
        script_text: the script (:func:`render_script`); its ``--output`` must be
            ``output_pattern``.
        script_path: where to write it; ``{job}`` in the name is replaced by the job id
            once known (the file is renamed).
        output_pattern: the job's output file with ``%j`` for the job id.
        workdir: the submission directory.
        label: ``"launch"`` or ``"sweep"``, for the status lines.
        console: where the job's output goes (default: this process's stdout).
        status: where status lines go (default: stderr).
        progress: called between polls; each string it returns is printed as a status
            line (a sweep's "trial 3 started").
        reader: the job-state reader (default: sacct, else scontrol, else squeue).

    Returns:
        The job and its final state, whatever it is: callers decide what failed.

    Raises:
        SlurmCommandError: sbatch refused the job (the message says why), or Slurm's
            commands stopped answering for :data:`LOST_AFTER_S` while it ran.
        KeyboardInterrupt: Ctrl-C or SIGTERM: the job was cancelled (``scancel``) first,
            and waited for until it left the queue (at most :data:`CANCEL_WAIT_S`). Any
            other exception while waiting cancels the job the same way.
    """
    out = console if console is not None else sys.stdout.buffer
    say_to = status if status is not None else sys.stderr
    reader = reader or StateReader()
    script_path.parent.mkdir(parents=True, exist_ok=True)
    output_pattern.parent.mkdir(parents=True, exist_ok=True)
    pending = temp_path(script_path, ".sbatch-")  # renamed once Slurm gives the job id
    with open_new(pending) as f:
        f.write(script_text.encode("utf-8"))
    started = time.monotonic()
    with sigterm_as_interrupt():
        try:
            job_id = _sbatch(pending, cwd=workdir, env=submit_env())
        except BaseException:
            pending.unlink(missing_ok=True)  # refused: nothing of it is left behind
            raise
        script = script_path.with_name(script_path.name.replace("{job}", job_id))
        os.replace(pending, script)
        output = Path(str(output_pattern).replace("%j", job_id))
        _say(say_to, label, f"submitted Slurm job {job_id} ({script}); output: {output}")
        _say(say_to, label, f"Ctrl-C cancels job {job_id}.")
        follower = _Follower(output, out)
        try:
            state = _watch(job_id, follower, reader, say_to, label, progress)
        except SlurmCommandError:
            raise  # Slurm stopped answering: the job may still run, the message says so
        except BaseException as exc:
            # Nobody will watch the job any more (Ctrl-C, SIGTERM, or an error in this
            # process): cancel it rather than leave it running unseen.
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped waiting"
            _say(say_to, label, f"{why}: cancelling Slurm job {job_id} (scancel)")
            with contextlib.suppress(SlurmCommandError):
                cancel([job_id])
            gone = _wait_gone(job_id, reader)
            follower.poll(final=True)
            _say(say_to, label, f"job {job_id} is {gone.state if gone else 'gone'}")
            raise
        deadline = time.monotonic() + OUTPUT_WAIT_S
        while not output.exists() and time.monotonic() < deadline:
            time.sleep(TAIL_INTERVAL_S)
        follower.poll(final=True)
    return JobRun(job_id, _exact_exit(state), script, output, time.monotonic() - started)


def _exact_exit(state: JobState) -> JobState:
    """The state with the exit code as the controller has it, where it still knows the
    job: sacct shows a batch script's exit status 128 or more as a signal number
    (``exit 130`` reads ``2:0``), ``scontrol show job`` shows ``130:0``."""
    if state.source != "sacct":
        return state
    try:
        shown = run_command(["scontrol", "show", "job", state.job_id], check=False, timeout=15)
    except SlurmCommandError:
        return state
    exact = parse_scontrol(shown.stdout).get(state.job_id) if shown.returncode == 0 else None
    if exact is None or not exact.finished or not exact.exit_code:
        return state
    return JobState(state.job_id, state.state, exact.exit_code, state.source)


def _watch(
    job_id: str,
    follower: _Follower,
    reader: StateReader,
    status: TextIO,
    label: str,
    progress: Callable[[], Iterable[str]] | None,
) -> JobState:
    start = time.monotonic()
    next_ask = start
    last_known = start
    failing_since: float | None = None
    shown: set[str] = set()  # each state once: sacct can lag behind scontrol a moment
    while True:
        follower.poll()
        if progress is not None:
            for line in progress():
                _say(status, label, line)
        now = time.monotonic()
        if now >= next_ask:
            try:
                state = reader.query([job_id]).get(job_id)
                failing_since = None
            except SlurmCommandError as exc:
                failing_since = failing_since or now
                if now - failing_since > LOST_AFTER_S:
                    raise SlurmCommandError(
                        exc.command,
                        exc.returncode,
                        f"{exc.output}; gave up waiting for job {job_id} after "
                        f"{LOST_AFTER_S:g} s of failing Slurm commands (the job may still "
                        f"run: check `squeue -j {job_id}`)",
                    ) from exc
                state = None
            if state is not None:
                last_known = now
                if state.state not in shown and not state.finished:
                    shown.add(state.state)
                    _say(status, label, f"job {job_id} is {state.state}")
                if state.finished:
                    return state
            elif failing_since is None and now - last_known > LOST_AFTER_S:
                return JobState(job_id, "VANISHED", "", "paralela")
            next_ask = now + _state_interval(now - start)
        time.sleep(TAIL_INTERVAL_S)


def _wait_gone(job_id: str, reader: StateReader) -> JobState | None:
    """After scancel: wait until the job left the queue (its tasks are gone; sacct says
    CANCELLED before that, while the job is still COMPLETING), then its state
    (``None``: unknown). Gives up after :data:`CANCEL_WAIT_S`."""
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        try:
            queued = run_command(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        except SlurmCommandError:
            queued = None
        if queued is not None and (queued.returncode != 0 or not queued.stdout.strip()):
            break
        time.sleep(0.5)
    try:
        return reader.query([job_id]).get(job_id)
    except SlurmCommandError:
        return None


def tail_of(path: Path | str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a file, indented by two spaces ("" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("  " + line for line in text.rstrip().splitlines()[-lines:])
