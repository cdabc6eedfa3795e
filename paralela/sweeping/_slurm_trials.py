"""``sweep(..., backend="slurm")``: one Slurm job per trial, the driver stays here.

::

    driver (login node)                          compute nodes
    Oracle asks trial n ──► SlurmTrials.start ──sbatch──► job: exec COMMAND (filled in)
      slots = at most ``workers`` jobs              │ $PARALELA_TRIAL_PARAMS, ..._NUMBER
      queued or running at once                     │ paralela.report(v) appends a JSON
                                                    │ line to $PARALELA_REPORT_FILE
    one watcher thread, every 0.2 s:                ▼   (trials/trial-NNNNN.reports)
      new report lines ──► ("report", trial, value, step) ──► pruner ──► scancel
      job states (sacct, else scontrol, else squeue; one query for all the jobs)
        finished ──► ("exit", trial, returncode) ──► the driver records the trial

``RUN_DIR/slurm-trials.jsonl`` says which job ran which trial. The report file, the batch
script and the trial's log (the job's output) live in the run directory, which
must be on a filesystem the compute nodes share. The study's storage stays with the
driver: the jobs never open it. Jobs are ``scancel``-ed when their trial is pruned, when
the sweep stops, and by the driver's reaper when the driver dies; a second run continues
the sweep, re-running the interrupted trials.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from paralela.backends.slurm import JOB_OPTIONS, JobState
from paralela.errors import ConfigError
from paralela.sweeping._report import ENV_PARAMS, ENV_REPORT_FILE, ENV_TRIAL_NUMBER

if TYPE_CHECKING:
    from paralela.backends.slurm import JobOptions, StateReader
    from paralela.sweeping._trials import TrialSpec

__all__ = ["DEFAULT_JOBS", "TRIAL_OPTIONS", "SlurmTrial", "SlurmTrials", "function_command"]

#: The Slurm options of a trial's job: one task on one node, running the command itself.
TRIAL_OPTIONS = tuple(
    name
    for name in JOB_OPTIONS
    if name not in ("nodes", "ntasks_per_node", "gpus_per_node", "slurm_python")
)
#: Jobs queued or running at once when ``workers`` is not given.
DEFAULT_JOBS = 4
WATCH_INTERVAL_S = 0.2
# Job states are asked this often: at first often (short trials), then less.
STATE_INTERVALS_S = ((30.0, 0.5), (300.0, 2.0), (float("inf"), 10.0))
# A job no Slurm command knows for this long (or Slurm not answering for this long)
# ends its trial as failed.
LOST_AFTER_S = 120.0


def trial_options(options: Mapping[str, Any] | None) -> JobOptions:
    """The options of each trial's job; an unknown one is a ConfigError listing the valid."""
    from paralela.backends.slurm import job_options

    return job_options(dict(options or {}), valid=TRIAL_OPTIONS, what="sweep per-trial jobs")


def function_command(spec: str, python: str = sys.executable) -> list[str]:
    """The command that runs the function ``MODULE:FUNC`` (or ``file.py:FUNC``) as a trial."""
    return [python, "-m", "paralela.sweeping._function_trial", spec]


def importable_name(function: Any) -> str:
    """``module:qualname`` of a function a job can import, else a ConfigError."""
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise ConfigError(
            f"One Slurm job per trial runs the objective in a fresh Python on a compute "
            f"node, which must import it; {name or function!r} (module {module!r}) cannot "
            "be imported there. Define it at the top level of a module on the shared "
            "filesystem, or give a command (['python', 'train.py', '--lr', '{lr}'])."
        )
    return f"{module}:{name}"


class SlurmTrial:
    """One trial running as a Slurm job; the driver handles it as a command trial.

    Attributes:
        spec: the trial.
        job_id: its job.
        started: submission time (the job may wait in the queue after it).
        devices: always ``None`` (Slurm chooses the job's GPUs).
        state: the job's final state, once it ended.
    """

    def __init__(self, spec: TrialSpec, job_id: str, reports: Path) -> None:
        self.spec = spec
        self.job_id = job_id
        self.started = time.time()
        self.devices: str | None = None
        self.last_value: float | None = None
        self.pruned = False
        self.failed: str | None = None  # why the driver stopped it (a NaN report)
        self.state: JobState | None = None
        self.note = ""
        self.reports = reports
        self._offset = 0
        self._partial = b""

    def terminate(self, grace: float) -> None:
        """``scancel`` the job (Slurm sends SIGTERM, then SIGKILL after its KillWait)."""
        from paralela.backends.slurm import SlurmCommandError, cancel

        with contextlib.suppress(SlurmCommandError):
            cancel([self.job_id])

    def describe_exit(self, returncode: int) -> str:
        """How the job ended: ``"the trial's Slurm job 12 ended FAILED (exit code 3)"``."""
        if self.state is None:
            return f"the trial's Slurm job {self.job_id} ended with exit code {returncode}"
        note = f" ({self.note})" if self.note else ""
        if self.state.state == "VANISHED" and not note:
            note = f" (no Slurm command knew it for {LOST_AFTER_S:g} s)"
        return f"the trial's Slurm job {self.job_id} ended {self.state.describe()}{note}"

    def new_reports(self) -> list[tuple[float, int]]:
        """The (value, step) of the report lines appended since the last call."""
        try:
            with open(self.reports, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        found = []
        for line in data[:cut].splitlines():
            try:
                message = json.loads(line)
                found.append((float(message["value"]), int(message["step"])))
            except (ValueError, KeyError, TypeError):
                continue  # not ours: only paralela.report writes this file
        return found


def returncode_of(state: JobState) -> int:
    """0 for COMPLETED; else the exit status, minus the signal, or 1."""
    if state.state == "COMPLETED":
        return 0
    status, _, sig = state.exit_code.partition(":")
    if status.isdigit() and int(status):
        return int(status)
    if sig.isdigit() and int(sig):
        return -int(sig)
    return 1


class SlurmTrials:
    """Submits each trial as a Slurm job and watches all of them from one thread.

    Args:
        options: the jobs' options (:data:`TRIAL_OPTIONS`).
        workdir: the jobs' working directory (relative paths in the command).
        ledger: a JSON-lines file that gets ``{"trial": N, "job": "ID", "submitted":
            TIME}`` for each job submitted (which job ran which trial).
        reader: the job-state reader (default: sacct, else scontrol, else squeue).

    Raises:
        ConfigError: an unknown or bad option, or no Slurm commands on PATH.
    """

    def __init__(
        self,
        options: Mapping[str, Any] | None,
        *,
        workdir: Path | None = None,
        ledger: Path | None = None,
        reader: StateReader | None = None,
    ) -> None:
        from paralela.backends.slurm import StateReader, require_slurm

        self.options = trial_options(options)
        require_slurm("sweep --backend slurm")
        self.workdir = workdir or Path.cwd()
        self.ledger = ledger
        self._reader = reader or StateReader()
        self._lock = threading.Lock()
        self._trials: dict[str, tuple[SlurmTrial, SimpleQueue[tuple[Any, ...]]]] = {}
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(
        self, argv: Sequence[str], spec: TrialSpec, events: SimpleQueue[tuple[Any, ...]]
    ) -> SlurmTrial:
        """Submit the trial's job (its command filled in with the trial's parameters).

        Raises:
            SlurmCommandError: sbatch refused the job.
        """
        from paralela.backends.slurm import render_script, submit_env, submit_script
        from paralela.sweeping._trials import fill

        log = Path(spec.log_path)
        base = log.with_suffix("")
        reports = base.with_suffix(".reports")
        reports.unlink(missing_ok=True)  # a re-run trial starts with no reports
        filled = [fill(arg, spec.params) for arg in argv]
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(filled)}\n".encode())
        script = render_script(
            self.options,
            ["exec " + " ".join(shlex.quote(a) for a in filled)],
            job_name=f"paralela-trial-{spec.number}",
            output=log,
            workdir=self.workdir,
            what="sweep (one job per trial)",
        )
        path = base.with_suffix(".sbatch")
        path.write_text(script)
        env = {
            **submit_env(),
            ENV_PARAMS: json.dumps(spec.params),
            ENV_TRIAL_NUMBER: str(spec.number),
            ENV_REPORT_FILE: str(reports.absolute()),
        }
        # The log holds the command line already: the job appends to it.
        job_id = submit_script(path, ["--open-mode=append"], cwd=self.workdir, env=env)
        trial = SlurmTrial(spec, job_id, reports)
        if self.ledger is not None:
            entry = {"trial": spec.number, "job": job_id, "submitted": trial.started}
            with open(self.ledger, "a") as ledger:
                ledger.write(json.dumps(entry) + "\n")
        self.follow(trial, events)
        return trial

    def follow(self, trial: SlurmTrial, events: SimpleQueue[tuple[Any, ...]]) -> None:
        """Watch a submitted trial's reports and job state (events go to ``events``)."""
        with self._lock:
            self._trials[trial.job_id] = (trial, events)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="paralela-slurm-trials", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        """Stop watching (the driver cancels the jobs it stopped itself)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _watch(self) -> None:
        from paralela.backends.slurm import SlurmCommandError

        first = time.monotonic()
        next_ask = first
        last_known: dict[str, float] = {}
        failing_since: float | None = None
        while not self._closed.wait(WATCH_INTERVAL_S):
            with self._lock:
                watched = dict(self._trials)
            for trial, events in watched.values():
                for value, step in trial.new_reports():
                    events.put(("report", trial, value, step))
            now = time.monotonic()
            if not watched or now < next_ask:
                continue
            youngest = max(t.started for t, _ in watched.values())
            next_ask = now + _interval(time.time() - youngest)
            try:
                states = self._reader.query(list(watched))
                failing_since = None
            except SlurmCommandError as exc:
                failing_since = failing_since or now
                if now - failing_since > LOST_AFTER_S:
                    self._end_all(watched, f"Slurm stopped answering: {exc}")
                continue
            for job_id, (trial, events) in watched.items():
                state = states.get(job_id)
                if state is not None:
                    last_known[job_id] = now
                elif now - last_known.setdefault(job_id, now) > LOST_AFTER_S:
                    state = JobState(job_id, "VANISHED", "", "paralela")
                if state is not None and state.finished:
                    last_known.pop(job_id, None)
                    self._end(trial, events, state)

    def _end(
        self,
        trial: SlurmTrial,
        events: SimpleQueue[tuple[Any, ...]],
        state: JobState,
        note: str = "",
    ) -> None:
        for value, step in trial.new_reports():  # what the job wrote before it ended
            events.put(("report", trial, value, step))
        trial.state, trial.note = state, note
        with self._lock:
            self._trials.pop(trial.job_id, None)
        events.put(("exit", trial, returncode_of(state)))

    def _end_all(self, watched: Mapping[str, Any], why: str) -> None:
        for job_id, (trial, events) in watched.items():
            self._end(trial, events, JobState(job_id, "VANISHED", "", "paralela"), why)


def _interval(age: float) -> float:
    return next(interval for until, interval in STATE_INTERVALS_S if age < until)
