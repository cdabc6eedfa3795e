"""Slurm's commands, wrapped: ``sbatch``, ``scancel``, ``scontrol``, ``sacctmgr``.

Every call has a timeout and turns a failure into a :class:`SlurmCommandError` that
names the command, its exit status and what it printed. Output is parsed from the plain
``--parsable``/``key=value`` forms, which every Slurm since 17.x prints the same way
(the ``--json`` schemas change between versions).

Usable from any layer above the backends (``launch --slurm``, ``sweep --backend slurm``)::

    from paralela.backends.slurm import submit_script, cancel, cluster_limits, wait_job

    job_id = submit_script(path, ["--array=0-9%4"])   # "4242"
    state = wait_job(job_id, timeout=600)             # terminal JobState (sacct, else
                                                      # scontrol, else squeue)
    cancel([job_id])

States (``wait_job``, ``job_states``) live in :mod:`paralela.backends.slurm._state`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from paralela.errors import ConfigError, ParalelaError

__all__ = [
    "COMMAND_TIMEOUT_S",
    "ClusterLimits",
    "SlurmCommandError",
    "cancel",
    "cluster_limits",
    "parse_key_values",
    "require_slurm",
    "requeue",
    "run_command",
    "slurm_available",
    "submit_script",
    "transient_refusal",
]

# A healthy slurmctld answers in milliseconds; a busy one on a large cluster can take
# tens of seconds (Slurm's own MessageTimeout defaults to 10 s, and clients retry).
COMMAND_TIMEOUT_S = 60.0
# sbatch refusing for a reason that passes (the user's queued-job limit, the
# controller's MaxJobCount, a busy controller): wait 2, 4, 8, ... up to 60 s between
# tries and give up after 10 minutes of refusals. Slurm's own sbatch retries EAGAIN
# only a few times; a map of thousands of tasks under MaxSubmitJobs needs longer.
SUBMIT_BACKOFF_S = (2.0, 60.0)
SUBMIT_RETRY_FOR_S = 600.0
# The backoff's clock (tests replace both with a fake clock).
_now = time.monotonic
_sleep = time.sleep
# What each transient refusal means, for the one line printed while waiting. The keys
# are Slurm's own reasons, as sbatch prints them (slurm_errno.c). A timeout is not
# among them: the job may have been queued all the same, and a retry would run it twice.
TRANSIENT_REFUSALS = {
    "QOSMaxSubmitJobPerUserLimit": "the QOS limits how many jobs you may have queued",
    "QOSMaxSubmitJobPerAccountLimit": "the QOS limits how many jobs your account may queue",
    "QOSGrpSubmitJobsLimit": "the QOS limits how many jobs its users may have queued",
    "AssocMaxSubmitJobLimit": "your association limits how many jobs you may queue",
    "AssocGrpSubmitJobsLimit": "your association limits how many jobs its users may queue",
    "MaxSubmitJobs": "your association limits how many jobs you may queue",
    "job submit limit": "a submit limit (MaxSubmitJobs) is reached",
    "MaxJobCount": "the controller holds MaxJobCount jobs already",
    "temporarily unable to accept job": "the controller holds MaxJobCount jobs already",
    "Resource temporarily unavailable": "the controller is busy",
    "Unable to contact slurm controller": "the controller cannot be reached",
}


class SlurmCommandError(ParalelaError):
    """A Slurm command failed or did not answer in time.

    Attributes:
        command: the command line, as a list.
        returncode: its exit status (``None`` when it timed out).
        output: what it printed on stderr (or stdout when stderr was empty).
    """

    def __init__(self, command: Sequence[str], returncode: int | None, output: str) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.output = output.strip()
        status = "did not answer in time" if returncode is None else f"failed (exit {returncode})"
        said = f": {self.output}" if self.output else ""
        super().__init__(f"`{' '.join(self.command)}` {status}{said}")


def slurm_available() -> bool:
    """``True`` when ``sbatch`` is on ``PATH`` (whether a controller answers is not checked)."""
    return shutil.which("sbatch") is not None


def require_slurm(backend: str = "slurm") -> None:
    """Raise :class:`ConfigError` unless ``sbatch``, ``squeue`` and ``scontrol`` are on ``PATH``.

    Args:
        backend: the name shown in the message.
    """
    missing = [c for c in ("sbatch", "squeue", "scontrol", "scancel") if shutil.which(c) is None]
    if missing:
        raise ConfigError(
            f"backend {backend!r} needs Slurm's commands on PATH, and {', '.join(missing)} "
            "cannot be found. Run on a cluster's login node (or inside an allocation), or "
            "`module load slurm` first; on this machine use backend='processes'."
        )


def run_command(
    args: Sequence[str],
    *,
    timeout: float = COMMAND_TIMEOUT_S,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command and capture its output.

    Args:
        args: the command line.
        timeout: seconds to wait for it.
        check: raise on a non-zero exit status.
        env: the environment (default: this process's).
        cwd: the working directory.

    Returns:
        The finished process, with text ``stdout``/``stderr``.

    Raises:
        SlurmCommandError: it timed out, could not start, or (with ``check``) failed.
    """
    try:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(args, None, f"no answer within {timeout:g} s") from exc
    except OSError as exc:
        raise SlurmCommandError(args, None, str(exc)) from exc
    if check and done.returncode != 0:
        raise SlurmCommandError(args, done.returncode, done.stderr or done.stdout)
    return done


def transient_refusal(output: str) -> str | None:
    """Why sbatch refused, when the refusal passes by itself (a submit limit, a busy
    controller); ``None`` for a refusal that waiting does not cure (a bad option)."""
    for key, meaning in TRANSIENT_REFUSALS.items():
        if key.lower() in output.lower():
            return f"{key}: {meaning}"
    return None


def submit_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    retry_for: float = SUBMIT_RETRY_FOR_S,
) -> str:
    """Submit a batch script with ``sbatch --parsable``; return the job id.

    A refusal that passes (``QOSMaxSubmitJobPerUserLimit``, ``MaxJobCount`` reached, a
    busy controller: :data:`TRANSIENT_REFUSALS`) is retried after 2, 4, 8, ... s (at
    most 60 s apart) for up to ``retry_for`` seconds; each wait prints one line on
    stderr saying what was limited and why.

    Args:
        script: path of the batch script.
        args: more ``sbatch`` options, e.g. ``["--array=0-9", "-p", "debug"]`` (they win
            over ``#SBATCH`` lines in the script).
        cwd: the submission directory (the job's working directory by default).
        env: the environment to submit with (and export to the job).
        timeout: seconds to wait for ``sbatch``.
        retry_for: seconds to keep retrying transient refusals (0: never retry).

    Returns:
        The job id, e.g. ``"4242"`` (for an array: the array's id; a ``;cluster``
        suffix is removed).

    Raises:
        SlurmCommandError: sbatch refused the job (its message says why: an unknown
            partition, a limit, a bad option), still refused it after ``retry_for``
            seconds, or did not answer.
    """
    command = ["sbatch", "--parsable", *args, os.fspath(script)]
    start = _now()
    wait, most = SUBMIT_BACKOFF_S
    while True:
        try:
            done = run_command(command, timeout=timeout, cwd=cwd, env=env)
            break
        except SlurmCommandError as exc:
            why = transient_refusal(exc.output)
            waited = _now() - start
            if why is None or waited + wait > retry_for:
                raise
            print(
                f"paralela: sbatch refused the job ({why}); trying again in {wait:g} s "
                f"(refused for {waited:.0f} s, giving up after {retry_for:g} s)",
                file=sys.stderr,
            )
            _sleep(wait)
            wait = min(most, wait * 2)
    job_id = done.stdout.strip().splitlines()[-1].split(";")[0] if done.stdout.strip() else ""
    if not job_id.isdigit():
        raise SlurmCommandError(["sbatch", *args], done.returncode, f"unexpected output {job_id!r}")
    return job_id


def cancel(
    job_ids: Sequence[str],
    *,
    signal: str | None = None,
    batch_only: bool = False,
    timeout: float = COMMAND_TIMEOUT_S,
) -> None:
    """``scancel`` jobs or array tasks (``"4242"``, ``"4242_3"``); unknown ids are ignored.

    Args:
        job_ids: the ids; nothing is run for an empty list.
        signal: send this signal (``"USR1"``) instead of cancelling.
        batch_only: with ``signal``, signal only the batch shell (``--batch``).
        timeout: seconds to wait for ``scancel``.

    Raises:
        SlurmCommandError: scancel did not answer or failed for another reason than an
            id that already left the queue.
    """
    if not job_ids:
        return
    args = ["scancel"]
    if signal is not None:
        args.append(f"--signal={signal}")
        if batch_only:
            args.append("--batch")
    done = run_command([*args, *job_ids], timeout=timeout, check=False)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise SlurmCommandError(args, done.returncode, done.stderr or done.stdout)


def requeue(job_id: str, *, timeout: float = COMMAND_TIMEOUT_S) -> None:
    """``scontrol requeue JOB``: stop a running job (or array task ``"4242_3"``) and queue
    it again; it restarts with ``SLURM_RESTART_COUNT`` one higher.

    Raises:
        SlurmCommandError: the controller refused (the job is not requeueable, or the
            cluster sets ``JobRequeue=0`` and the job was not submitted with ``--requeue``).
    """
    run_command(["scontrol", "requeue", job_id], timeout=timeout)


def parse_key_values(text: str) -> dict[str, str]:
    """Parse ``Key = Value`` lines (``scontrol show config``) into a dict."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def _limit(value: str | None) -> int | None:
    if value is None:
        return None
    head = value.split()[0] if value.split() else ""
    return int(head) if head.isdigit() and int(head) > 0 else None


@dataclass(frozen=True)
class ClusterLimits:
    """The cluster's limits on what one user may submit.

    Attributes:
        max_array_size: ``MaxArraySize``: array indices must be below it, so an array
            holds at most this many tasks.
        max_job_count: ``MaxJobCount``: jobs the controller keeps at once (all users).
        max_submit_jobs: ``MaxSubmitJobs`` of the user's association (from
            ``sacctmgr``, when accounting answers), else ``None``.
        version: ``SLURM_VERSION``.
    """

    max_array_size: int | None
    max_job_count: int | None
    max_submit_jobs: int | None
    version: str

    def max_tasks(self) -> int | None:
        """The most array tasks one submission may hold under these limits."""
        limits = [v for v in (self.max_array_size, self.max_job_count, self.max_submit_jobs) if v]
        return min(limits) if limits else None

    def binding(self) -> str:
        """The limit that sets :meth:`max_tasks`, as ``"MaxArraySize=1001"`` (``""``: none)."""
        named = [
            (v, k)
            for k, v in (
                ("MaxArraySize", self.max_array_size),
                ("MaxJobCount", self.max_job_count),
                ("MaxSubmitJobs", self.max_submit_jobs),
            )
            if v
        ]
        if not named:
            return ""
        value, name = min(named)
        return f"{name}={value}"


def parse_limits(config_text: str, assoc_text: str = "") -> ClusterLimits:
    """Limits from ``scontrol show config`` and ``sacctmgr -nP ... format=MaxSubmit``."""
    config = parse_key_values(config_text)
    submit = [_limit(v) for line in assoc_text.splitlines() for v in line.split("|")]
    known = [v for v in submit if v]
    return ClusterLimits(
        max_array_size=_limit(config.get("MaxArraySize")),
        max_job_count=_limit(config.get("MaxJobCount")),
        max_submit_jobs=min(known) if known else None,
        version=config.get("SLURM_VERSION", ""),
    )


@functools.lru_cache(maxsize=1)
def cluster_limits() -> ClusterLimits:
    """The cluster's submission limits, read once per process.

    ``MaxArraySize`` and ``MaxJobCount`` come from ``scontrol show config``;
    ``MaxSubmitJobs`` (an association or QOS limit, not a config value) from
    ``sacctmgr show assoc`` for this user when accounting answers, else it is unknown.

    Raises:
        SlurmCommandError: ``scontrol show config`` failed (no controller answers).
    """
    config = run_command(["scontrol", "show", "config"]).stdout
    assoc = ""
    if shutil.which("sacctmgr") is not None:
        user = os.environ.get("USER") or _user_name()
        try:
            assoc = run_command(
                [
                    "sacctmgr",
                    "-nP",
                    "show",
                    "assoc",
                    f"where user={user}",
                    "format=MaxSubmit,GrpSubmit",
                ],
                timeout=15,
            ).stdout
        except SlurmCommandError:
            assoc = ""  # no accounting: the limit is unknown, not zero
    return parse_limits(config, assoc)


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def write_script(path: Path, lines: Sequence[str]) -> Path:
    """Write an executable batch script (``#!/bin/bash`` first) and return its path."""
    path.write_text("#!/bin/bash\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return path
