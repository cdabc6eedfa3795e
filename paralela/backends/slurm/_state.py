"""Job and array-task states: ``sacct``, else ``scontrol show job``, else ``squeue -t all``.

::

    StateReader.query(["4242", "4250"])
      ├─ sacct -n -P -X -j 4242,4250 -o JobID,State,ExitCode     (the accounting database)
      │    fails ("accounting storage is disabled", not installed)? stop asking it
      ├─ ids sacct does not know yet (slurmdbd lags a second or two behind a submission):
      │    scontrol show job ID      (the controller: live jobs, and finished ones for
      │                               MinJobAge seconds, 300 by default)
      └─ still unknown: squeue -h -t all -r -j ID -o %i|%T
    -> {"4242_0": JobState("4242_0", "COMPLETED", "0:0"), "4242_1": ..., "4250": ...}

Array tasks are keyed ``ARRAYID_TASK``; a pending range (``4242_[3-9%2]``) is expanded
into one entry per task. A job that no source knows any more is simply absent: callers
decide how long to wait for it (:func:`wait_job` gives up after ``lost_after`` seconds),
so a cancelled, failed or vanished job never leaves anyone waiting forever.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from paralela.backends.slurm._commands import SlurmCommandError, run_command

__all__ = [
    "ACTIVE_STATES",
    "FAILED_STATES",
    "JobState",
    "StateReader",
    "expand_task_ids",
    "parse_sacct",
    "parse_scontrol",
    "parse_squeue",
    "wait_job",
]

# Still on its way: queued, running, being requeued or resized. REQUEUED is what sacct
# shows for the old run of a requeued job while the new one is PENDING.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "REQUEUED",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "POWER_UP_NODE",
        "UPDATE_DB",
    }
)
# Ended without finishing its work. REQUEUE_HOLD and SPECIAL_EXIT are held jobs: they
# never run again unless someone types `scontrol release`, so waiting for them would
# never end. VANISHED is ours: no command knows the job any more.
FAILED_STATES = frozenset(
    {
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "VANISHED",
    }
)


@dataclass(frozen=True)
class JobState:
    """The state of one job or array task.

    Attributes:
        job_id: ``"4242"``, or ``"4242_3"`` for task 3 of array 4242.
        state: Slurm's base state (``"CANCELLED by 0"`` reads ``"CANCELLED"``).
        exit_code: ``"status:signal"`` (``"1:0"``, ``"0:9"``), ``""`` when not known.
        source: which command said so: ``"sacct"``, ``"scontrol"`` or ``"squeue"``.
    """

    job_id: str
    state: str
    exit_code: str = ""
    source: str = ""

    @property
    def finished(self) -> bool:
        """It will not run (again) by itself: completed, failed, cancelled or held."""
        return self.state == "COMPLETED" or self.state in FAILED_STATES

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES

    def describe(self) -> str:
        """``"FAILED (exit code 1)"``, ``"CANCELLED"``, ``"FAILED (killed by signal 9)"``."""
        status, _, sig = self.exit_code.partition(":")
        detail = ""
        if sig.isdigit() and int(sig):
            detail = f" (killed by signal {sig})"
        elif status.isdigit() and int(status):
            detail = f" (exit code {status})"
        return f"{self.state}{detail}"


def _base_state(text: str) -> str:
    # "CANCELLED by 1234", "CANCELLED+" (squeue's truncation) -> "CANCELLED"
    return text.split()[0].rstrip("+").upper() if text.split() else "UNKNOWN"


def expand_task_ids(spec: str) -> list[int]:
    """``"3"``, ``"2-5%2"``, ``"[1,3-4]"`` -> task ids; ``[]`` when not a task list."""
    spec = spec.strip().strip("[]").split("%")[0]
    tasks: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            return []
        tasks.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
    return tasks


def _keys(job_field: str) -> list[str]:
    """``"4242_[3-5%1]"`` -> ``["4242_3", "4242_4", "4242_5"]``; ``"4242"`` -> ``["4242"]``."""
    base, sep, tasks = job_field.partition("_")
    if not sep:
        return [base]
    return [f"{base}_{t}" for t in expand_task_ids(tasks)]


def parse_sacct(text: str) -> dict[str, JobState]:
    """Parse ``sacct -n -P -X -o JobID,State,ExitCode`` output."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3 or not fields[0]:
            continue
        for key in _keys(fields[0]):
            states[key] = JobState(key, _base_state(fields[1]), fields[2].strip(), "sacct")
    return states


# The fields read below. A record starts at its ``JobId=`` token (``ArrayJobId=`` is
# another token). scontrol prints ~1 KB per task, so a poll of a 1,000-task array is a
# megabyte: one str.split() and a set lookup per token costs 40 % less CPU than a
# regular expression's findall per record (1,102 tasks, 1.2 MB: 26 -> 16 ms of CPU,
# best of 7, output of bench_scale.py's cluster).
_FIELDS = frozenset({"JobId", "JobState", "ExitCode", "ArrayJobId", "ArrayTaskId"})


def _scontrol_record(values: dict[str, str], states: dict[str, JobState]) -> None:
    if "JobId" not in values or "JobState" not in values:
        return
    state = _base_state(values["JobState"])
    exit_code = values.get("ExitCode", "")
    array, task = values.get("ArrayJobId"), values.get("ArrayTaskId")
    keys = [f"{array}_{t}" for t in expand_task_ids(task)] if array and task else [values["JobId"]]
    for key in keys:
        states[key] = JobState(key, state, exit_code, "scontrol")


def parse_scontrol(text: str) -> dict[str, JobState]:
    """Parse ``scontrol show job`` output: one record per job or array task (or range)."""
    states: dict[str, JobState] = {}
    values: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or key not in _FIELDS:
            continue
        if key == "JobId" and values:
            _scontrol_record(values, states)
            values = {}
        values[key] = value
    _scontrol_record(values, states)
    return states


def parse_squeue(text: str) -> dict[str, JobState]:
    """Parse ``squeue -h -t all -r -o %i|%T`` output (no exit codes there)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        job_field, sep, state = line.strip().partition("|")
        if not sep:
            continue
        for key in _keys(job_field):
            states[key] = JobState(key, _base_state(state), "", "squeue")
    return states


def _belongs(key: str, job_id: str) -> bool:
    return key == job_id or key.startswith(job_id + "_")


class StateReader:
    """Asks Slurm for job states, falling back from ``sacct`` to ``scontrol`` to ``squeue``.

    Args:
        use_sacct: ask ``sacct`` first (default). Once it fails (accounting disabled,
            not installed, slurmdbd down) it is not asked again by this reader.
        timeout: seconds each command may take.

    Attributes:
        notes: why a source was dropped, for error messages and logs.
    """

    def __init__(self, *, use_sacct: bool = True, timeout: float = 30.0) -> None:
        self._sacct = use_sacct and shutil.which("sacct") is not None
        self._timeout = timeout
        self.notes: list[str] = []

    @property
    def uses_sacct(self) -> bool:
        return self._sacct

    def query(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """The states of the jobs ``job_ids`` (plain or array ids) and their tasks.

        Jobs that no source knows are absent from the result.

        Raises:
            SlurmCommandError: neither ``scontrol`` nor ``squeue`` answered (the
                controller is down or unreachable); callers retry later.
        """
        states: dict[str, JobState] = {}
        if not job_ids:
            return states
        if self._sacct:
            try:
                states.update(self._run_sacct(job_ids))
            except SlurmCommandError as exc:
                self._sacct = False
                self.notes.append(f"sacct is not usable, using scontrol/squeue: {exc}")
        for job_id in job_ids:
            if not any(_belongs(k, job_id) for k in states):
                states.update(self._live(job_id))
        return states

    def _run_sacct(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        done = run_command(
            ["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode"],
            timeout=self._timeout,
        )
        return parse_sacct(done.stdout)

    def _live(self, job_id: str) -> dict[str, JobState]:
        show = run_command(["scontrol", "show", "job", job_id], timeout=self._timeout, check=False)
        if show.returncode == 0:
            found = parse_scontrol(show.stdout)
            if found:
                return found
        queue = run_command(
            ["squeue", "-h", "-t", "all", "-r", "-j", job_id, "-o", "%i|%T"],
            timeout=self._timeout,
            check=False,
        )
        if queue.returncode == 0:
            return parse_squeue(queue.stdout)
        if "Invalid job id" in queue.stderr or "Invalid job id" in show.stderr:
            return {}  # purged from the controller (older than MinJobAge), or never known
        raise SlurmCommandError(
            ["squeue", "-j", job_id], queue.returncode, queue.stderr or show.stderr
        )


def _all_finished(states: Iterable[JobState]) -> bool:
    listed = list(states)
    return bool(listed) and all(s.finished for s in listed)


def wait_job(
    job_id: str,
    *,
    timeout: float | None = None,
    interval: float = 2.0,
    lost_after: float = 120.0,
    reader: StateReader | None = None,
) -> dict[str, JobState]:
    """Wait until a job (every task, for an array) has finished; return the states.

    Args:
        job_id: a job or array id as ``sbatch`` printed it.
        timeout: give up after this many seconds (``None``: wait as long as it runs).
        interval: seconds between polls.
        lost_after: a job that no command knows for this long (never seen, or purged
            from the controller without accounting) ends as ``VANISHED``.
        reader: the :class:`StateReader` to use (a fresh one by default).

    Returns:
        ``{"4242": JobState(...)}``, or one entry per task of an array.

    Raises:
        TimeoutError: ``timeout`` passed first; the job keeps running (``cancel`` it).
        SlurmCommandError: Slurm's commands stopped answering for ``lost_after`` seconds.
    """
    reader = reader or StateReader()
    start = time.monotonic()
    last_known = start
    seen: dict[str, JobState] = {}
    failing_since: float | None = None
    while True:
        now = time.monotonic()
        try:
            states = {k: v for k, v in reader.query([job_id]).items() if _belongs(k, job_id)}
            failing_since = None
        except SlurmCommandError:
            failing_since = failing_since or now
            if now - failing_since > lost_after:
                raise
            states = {}
        if states:
            seen.update(states)
            last_known = now
            if _all_finished(seen.values()):
                return seen
        elif failing_since is None and now - last_known > lost_after:
            return {
                k: (v if v.finished else JobState(k, "VANISHED", "", "paralela"))
                for k, v in (seen or {job_id: JobState(job_id, "VANISHED")}).items()
            }
        if timeout is not None and now - start > timeout:
            raise TimeoutError(
                f"Slurm job {job_id} did not finish within {timeout:g} s; it is still queued "
                "or running. Cancel it with `scancel` if it is no longer wanted."
            )
        time.sleep(interval)
