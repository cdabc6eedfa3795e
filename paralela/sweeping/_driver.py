"""The sweep driver: fill every slot with a trial, tell Optuna how each ended.

::

    slots (resources) ──> free slots ──┐
    study.ask() (one trial kept asked ahead per slot, so a freed slot restarts at once)
                                       ▼
      function trial: pinned worker ── future done ──┐
      command trial:  process ── report lines, exit ─┤ events (one queue)
                                                     ▼
    main loop: one run is a :class:`_TrialLoop`; its loop, ``run()``, and its methods:

    start_slots() ── launch() a trial on each free slot while may_start() (budget, time,
      │               failures); get_ready_at_gates(): a python script's next trial is
      │               taken ahead and its process started, held at a gate (``_gate``)
      ├─> oracle.resume() ── sample ahead while the trials run; on_change() the live table
      ├─> stop_overdue() ── trial_timeout: stop the command's group / cancel the function
      └─> wait for events (TICK_SECONDS), oracle.hold(), then handle() each:
              ├─ "done"   ──> function_ended() ─┐
              ├─ "report" ──> reported() ── a NaN or the pruner: terminate the group
              └─ "exit"   ──> command_exited() ─┴─> trial_ended() ── record, free the
                                                     slot, oracle.tell()
    no trial running, or failed_too_often() -> SweepError
    however it ended (done, SweepError, Ctrl-C) -> close(): stop the commands, give back
    the trials taken and never started, requeue the unfinished ones, shut the backend

Trials left RUNNING by a driver that died are failed and queued again on the next run
(see ``paralela.studies.recover_interrupted``); finished trials are never run again. The command
trials such a driver left running are stopped by its reaper (``_trials.Reaper``), so that
they do not hold their GPU while the next run re-runs them.

Once more than ``max_failures`` trials failed (or on Ctrl-C), the driver stops at once:
running commands are stopped (SIGTERM, SIGKILL after the grace period), running function
trials are abandoned to their workers, and those trials are queued again like
interrupted ones, for the next run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from paralela.backends import Broadcast, dumps
from paralela.errors import ParalelaError
from paralela.resources import Slot
from paralela.studies import UNUSED_ATTR, requeue_interrupted
from paralela.sweeping._budget import Budget, SharedBudget
from paralela.sweeping._context import non_finite
from paralela.sweeping._forker import Forker
from paralela.sweeping._gate import is_python_script
from paralela.sweeping._oracle import LOG_ERROR_CHARS, Oracle
from paralela.sweeping._results import TrialRecord, last_error
from paralela.sweeping._trials import (
    CommandTrial,
    FunctionJob,
    Reaper,
    TrialOutcome,
    TrialSpec,
    command_outcome,
    fill,
    run_function_trial,
)

if TYPE_CHECKING:  # one Slurm job per trial: imported by the caller that asks for it
    from paralela.sweeping._slurm_trials import SlurmTrial, SlurmTrials

__all__ = ["SweepError", "run_trials"]

# How often the loop wakes without events: checks the time budget and the live table.
TICK_SECONDS = 0.25
# How long the loop waits, at most, for the function trials it just submitted to be
# taken to their workers before it lets the sampler work (see _handed_over).
HANDOVER_SECONDS = 0.005


class SweepError(ParalelaError):
    """The sweep stopped: too many trials failed (``max_failures``)."""


class _Overdue(Exception):
    """A trial stopped for running longer than ``trial_timeout``; the text is the reason."""


class _Running(NamedTuple):
    """A trial that runs: its slot, its record, its future (or process, or Slurm job)."""

    trial: Any
    slot: Slot
    record: TrialRecord
    handle: Any


def run_trials(
    *,
    study: Any,
    distributions: dict[str, Any],
    fixed: dict[str, Any],
    objective: Callable[[dict[str, Any]], Any] | None,
    command: Sequence[str] | None,
    storage_spec: str,
    slots: list[Slot],
    backend: Any,
    budget: Budget,
    already_counted: int,
    log_dir: Path,
    budget_dir: Path | None,
    grace_period: float,
    on_change: Callable[[list[TrialRecord], list[TrialRecord]], None],
    jobs: SlurmTrials | None = None,
    define_by_run: bool = False,
    seed: int | None = None,
    sample: Callable[[Any], object] | None = None,
) -> tuple[list[TrialRecord], float, float]:
    """Run trials until the budget is spent. Returns (records of this run, wall, busy).

    ``backend``: the function trials' ``ProcessBackend`` (its workers pinned to
    ``slots``), shut down here (at a normal end the caller waits); ``None``: command trials.
    ``jobs``: run each command trial as a Slurm job of its own (the slots then only
    bound how many run at once); ``None``: as a process here.
    ``budget_dir``: where the lock of the budget shared with other drivers lives (the run
    directory); ``None``: no lock (a database shared from several run directories).
    ``define_by_run``: ``objective`` takes an Optuna trial and samples its parameters
    itself, in its worker, with the study's sampler (seeded per trial from ``seed``).
    ``sample``: sample each trial with it (a conditional space's ``Space.sample``), not
    with ``distributions``.
    """
    t0 = time.time()
    job_ref = None
    if objective is not None:
        from paralela.sweeping._worker_storage import synchronous_normal  # (SQLAlchemy)

        job_ref = Broadcast(
            FunctionJob(
                objective,
                storage_spec,
                study.study_name,
                dumps(study.pruner),
                sampler=dumps(study.sampler) if define_by_run else None,
                seed=seed,
                wal=synchronous_normal(study),
            )
        )
    limit = None if budget.n_trials is None else max(0, budget.n_trials - already_counted)
    shared = None if budget.n_trials is None else SharedBudget(study, budget.n_trials, budget_dir)
    oracle = Oracle(
        study,
        distributions,
        ahead=len(slots),
        limit=limit,
        budget=shared,
        read_back=define_by_run,  # the workers wrote the parameters: read them
        sample=sample,  # a conditional space's Space.sample: asked define-by-run
    )
    loop = _TrialLoop(
        study=study,
        oracle=oracle,
        fixed=fixed,
        job_ref=job_ref,
        command=command,
        slots=slots,
        backend=backend,
        jobs=jobs,
        budget=budget,
        already_counted=already_counted,
        log_dir=log_dir,
        grace_period=grace_period,
        on_change=on_change,
        t0=t0,
    )
    return loop.run()


class _TrialLoop:
    """One run of the driver: its state as attributes, one method per event.

    :meth:`run` is the loop (drawn at the top of this module). Everything here runs in
    the driver's main thread; the oracle samples in a thread of its own between
    :meth:`Oracle.resume` and :meth:`Oracle.hold`.
    """

    def __init__(
        self,
        *,
        study: Any,
        oracle: Oracle,
        fixed: dict[str, Any],
        job_ref: Broadcast[FunctionJob] | None,
        command: Sequence[str] | None,
        slots: list[Slot],
        backend: Any,
        jobs: SlurmTrials | None,
        budget: Budget,
        already_counted: int,
        log_dir: Path,
        grace_period: float,
        on_change: Callable[[list[TrialRecord], list[TrialRecord]], None],
        t0: float,
    ) -> None:
        self.study = study
        self.oracle = oracle
        self.fixed = fixed
        self.job_ref = job_ref
        self.command = command
        self.slots = slots
        self.backend = backend
        self.jobs = jobs
        self.budget = budget
        self.already_counted = already_counted
        self.log_dir = log_dir
        self.grace_period = grace_period
        self.on_change = on_change
        self.events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.handed: list[Any] = []  # function trials submitted since the sampler resumed
        self.free: collections.deque[Slot] = collections.deque(slots)
        self.running: dict[int, _Running] = {}
        self.records: list[TrialRecord] = []
        self.failures = 0
        self.started = 0  # trials taken from the oracle by this driver
        self.t0 = t0  # when run_trials was called: the time budget counts from there
        self.busy = 0.0  # slot seconds the ended trials ran
        # Each slot's next trial, taken ahead, its process waiting at its gate (``_gate``);
        # no process (None) when the gated one died before its turn: it starts plainly.
        self.gate = command is not None and jobs is None and is_python_script(command)
        self.standby: dict[int, tuple[Any, CommandTrial | None]] = {}
        # ... forked from one interpreter prepared for the script (``_forker``), started
        # now: it gets ready while the first trials start as fresh interpreters.
        self.forker = None
        if self.gate and command:
            self.forker = Forker.for_script(fill(command[0], {}), command[1])
        self.timed_out: dict[int, str] = {}  # function trials stopped for time: number -> why
        # Command trials run in sessions of their own; the reaper stops them if the
        # driver dies.
        self.reaper = Reaper(grace_period) if job_ref is None else None  # (no objective)
        # Ended trials that the driver stopped (pruned, timed out, a NaN): what is left of
        # their group (a child that ignores SIGTERM) is still being stopped, so the reaper
        # keeps it until then.
        self.ending: list[CommandTrial] = []
        self.ended = False  # the loop ran to its end: every trial ended, no error

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> tuple[list[TrialRecord], float, float]:
        """Start trials, wait for events, handle them; until no trial runs or the sweep
        failed too often. Returns (records of this run, wall, busy)."""
        oracle = self.oracle
        try:
            while True:
                self.start_slots()
                if not self.may_start():
                    oracle.stop_asking()
                _handed_over(self.handed)
                self.handed.clear()
                oracle.resume()  # sample and write while the trials run (see Oracle.hold)
                self.on_change(self.records, [r.record for r in self.running.values()])
                if not self.running or self.failed_too_often():  # a broken sweep stops at once
                    break
                self.stop_overdue()
                try:
                    event = self.events.get(timeout=TICK_SECONDS)
                except queue.Empty:
                    continue
                oracle.hold()
                while True:
                    self.handle(event)
                    try:
                        event = self.events.get_nowait()
                    except queue.Empty:
                        break
            self.ended = not self.failed_too_often()
            if self.failed_too_often():
                raise SweepError(
                    f"{self.failures} trials failed, more than "
                    f"max_failures={self.budget.max_failures}; the sweep stopped. "
                    f"The last error:\n{last_error(self.records, LOG_ERROR_CHARS)}"
                )
        finally:
            self.close()
        wall = time.time() - self.t0
        busy = self.busy / (wall * len(self.slots)) if wall > 0 else 0.0
        return self.records, wall, busy

    def handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "done":
            self.function_ended(self.running[event[1]], event[2])
        elif kind == "report":
            self.reported(event[1], event[2], event[3])
        elif kind == "exit":
            self.command_exited(event[1], event[2])

    # -- the budget --------------------------------------------------------------------

    def failed_too_often(self) -> bool:
        limit = self.budget.max_failures
        return limit is not None and self.failures > limit

    def stopped(self) -> bool:
        """No trial may start any more, not even one already taken."""
        timeout = self.budget.timeout
        if timeout is not None and time.time() - self.t0 >= timeout:
            return True
        return self.failed_too_often()

    def may_start(self) -> bool:
        """A new trial may be taken and started."""
        n_trials = self.budget.n_trials
        if n_trials is not None and self.already_counted + self.started >= n_trials:
            return False
        return not self.stopped() and not self.oracle.exhausted

    # -- starting trials ---------------------------------------------------------------

    def take(self) -> Any:
        """The next trial, or ``None`` when other drivers took the rest of the budget."""
        trial = self.oracle.take()
        if trial is not None:
            self.started += 1
        return trial

    def spec_of(self, trial: Any) -> TrialSpec:
        log_path = str(self.log_dir / f"trial-{trial.number:05d}.log")
        return TrialSpec(trial._trial_id, trial.number, {**trial.params, **self.fixed}, log_path)

    def start_slots(self) -> None:
        """Start a trial on every free slot that may have one; then, for python-script
        commands, get each busy slot's next trial ready at its gate."""
        free, standby = self.free, self.standby
        for slot in list(free):
            if self.stopped():
                return
            if slot.index not in standby and not self.may_start():
                if not standby:
                    continue
                # The trials are all taken, one of them waits on another slot: run it here
                # now, in a fresh process with this slot's environment.
                trial, waiting = standby.pop(next(iter(standby)))
                if waiting is not None:
                    waiting.close_gate()  # it exits unrun
                with contextlib.suppress(OSError):
                    os.unlink(self.spec_of(trial).log_path)
                standby[slot.index] = (trial, None)
            free.remove(slot)
            if not self.launch(slot):
                free.append(slot)
                return
        if self.gate:
            self.get_ready_at_gates()

    def get_ready_at_gates(self) -> None:
        """Python-script commands: take each busy slot's next trial and start its process,
        held at its gate until the slot frees."""
        for slot in self.slots:
            if slot.index not in self.standby and slot not in self.free and self.may_start():
                following = self.take()
                if following is None:
                    return
                handle = self.start_command(following, slot, gated=True)
                self.standby[slot.index] = (following, handle)

    def launch(self, slot: Slot) -> bool:
        """Start the slot's next trial; ``False`` if there is none (the budget is spent)."""
        ready = self.standby.pop(slot.index, None)
        if ready is None:
            trial, handle = self.take(), None
            if trial is None:
                return False
        else:
            trial, handle = ready
        spec = self.spec_of(trial)
        record = TrialRecord(
            trial.number,
            "RUNNING",
            None,
            spec.params,
            time.time(),
            slot=slot.index,
            devices=None if self.jobs is not None else slot.env().get("CUDA_VISIBLE_DEVICES"),
            log_path=spec.log_path,
            host=slot.host or None,
        )
        if self.backend is not None:
            future = self.backend.submit(run_function_trial, self.job_ref, spec)
            self.handed.append(future)
            events = self.events

            def done(f: Any, n: int = trial.number) -> None:
                events.put(("done", n, f))

            future.add_done_callback(done)
            self.running[trial.number] = _Running(trial, slot, record, future)
        else:
            started: CommandTrial | SlurmTrial
            if self.jobs is not None:
                started = self.start_job(trial)
            elif handle is None:
                started = self.start_command(trial, slot, gated=False)
            else:
                handle.open_gate()
                started = handle
            record.started = started.started
            self.running[trial.number] = _Running(trial, slot, record, started)
        self.records.append(record)
        return True

    def start_job(self, trial: Any) -> SlurmTrial:
        assert self.command is not None
        assert self.jobs is not None
        assert self.reaper is not None
        job = self.jobs.start(self.command, self.spec_of(trial), self.events)
        self.reaper.add_job(job.job_id)
        return job

    def start_command(self, trial: Any, slot: Slot, gated: bool) -> CommandTrial:
        assert self.command is not None
        assert self.reaper is not None
        env = {**os.environ, **slot.env()}
        handle = CommandTrial(
            self.command, self.spec_of(trial), env, self.events, gated=gated, forker=self.forker
        )
        self.reaper.add(handle.process.pid)  # its own process group: pgid == pid
        return handle

    # -- stopping trials ---------------------------------------------------------------

    def stop_overdue(self) -> None:
        """Stop the trials that ran longer than ``trial_timeout``: a command's process
        group gets SIGTERM, then SIGKILL after the grace period; a function trial's
        worker is killed and replaced. Slurm jobs have it as their time limit."""
        limit = self.budget.trial_timeout
        if limit is None:
            return
        now = time.time()
        for number, run in list(self.running.items()):
            started = run.record.started
            if started is None or now - started < limit or number in self.timed_out:
                continue
            reason = f"timed out after {limit:g} s (trial_timeout)"
            if isinstance(run.handle, CommandTrial):
                if run.handle.failed is None and not run.handle.pruned:
                    run.handle.failed = reason
                    run.handle.terminate(self.grace_period)
            elif self.backend is not None:
                self.timed_out[number] = reason
                self.backend.cancel([run.handle])

    def let_go_of_stopped(self, *, wait: bool) -> None:
        """Tell the reaper to forget the stopped trials whose whole group is gone."""
        assert self.reaper is not None
        for handle in list(self.ending):
            if wait:
                handle.wait_stopped()
            if handle.stopped():
                self.reaper.discard(handle.process.pid)
                self.ending.remove(handle)

    # -- events ------------------------------------------------------------------------

    def function_ended(self, run: _Running, future: Any) -> None:
        """A function trial's future is done: it ran, its worker died, or it was
        cancelled for time (``stop_overdue``)."""
        overdue = self.timed_out.pop(run.trial.number, None)
        try:
            if overdue is not None:  # stopped by stop_overdue: cancelled
                raise _Overdue(overdue)
            outcome = future.result()
        except Exception as exc:  # the worker died, the trial could not run, or it ran
            why = str(exc)  # out of time
            if not isinstance(exc, _Overdue):
                why = f"{type(exc).__name__}: {why}"
            outcome = TrialOutcome(
                run.trial.number, "FAIL", None, run.record.started or time.time(), time.time(), why
            )
        self.trial_ended(run, outcome)

    def reported(self, handle: Any, value: float, step: int) -> None:
        """A command trial reported a value: record it, stop it if it is not finite or
        the pruner says so."""
        run = self.running.get(handle.spec.number)
        stopping = handle.pruned or handle.failed is not None
        if run is None or run.handle is not handle or stopping:
            return
        problem = non_finite([value], step)
        if problem is not None:  # a diverged loss: stop it, record why
            handle.failed = problem
            handle.terminate(self.grace_period)
        else:
            handle.last_value = value
            run.record.intermediate[step] = value
            run.trial.report(value, step)
        if problem is None and run.trial.should_prune():
            handle.pruned = True
            handle.terminate(self.grace_period)

    def command_exited(self, handle: Any, returncode: int) -> None:
        """A command trial's process (or Slurm job) ended, running or at its gate."""
        assert self.reaper is not None
        if isinstance(handle, CommandTrial):
            if handle.stopping:  # its group may outlive it: listed until gone
                self.ending.append(handle)
            else:
                self.reaper.discard(handle.process.pid)
            self.let_go_of_stopped(wait=False)
        else:
            self.reaper.discard_job(handle.job_id)
        ended = self.running.get(handle.spec.number)
        if ended is not None and ended.handle is handle:
            self.trial_ended(
                ended, command_outcome(ended.handle, ended.record.log_path, returncode)
            )
        else:  # ended at its gate: its trial starts plainly in its turn
            for index, (trial, waiting) in list(self.standby.items()):
                if waiting is handle:
                    self.standby[index] = (trial, None)

    def trial_ended(self, run: _Running, outcome: TrialOutcome) -> None:
        """Record how a trial ended, free its slot, tell the study."""
        problem = non_finite(outcome.values or []) if outcome.state == "COMPLETE" else None
        if problem is not None:  # a diverged loss: this trial failed, the sweep goes on
            outcome.state, outcome.values, outcome.error = "FAIL", None, problem
        record = run.record
        record.started, record.finished = outcome.started, outcome.finished
        record.state, record.values = outcome.state, outcome.values
        record.error, record.exit_code = outcome.error, outcome.exit_code
        if outcome.devices is not None:
            record.devices = outcome.devices
        if outcome.slot is not None:  # where a function trial really ran
            record.slot = outcome.slot
        if outcome.params is not None:  # sampled in the worker (define-by-run)
            record.params = {**outcome.params, **self.fixed}
        self.busy += outcome.finished - outcome.started
        if outcome.state == "FAIL":
            self.failures += 1
        del self.running[run.trial.number]
        self.free.append(run.slot)
        self.oracle.tell(run.trial, outcome)

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """However the loop ended: stop what still runs, give back the trials taken and
        never started, queue the unfinished ones again, shut the backend down."""
        from optuna.trial import TrialState

        if self.reaper is not None:  # stops the commands still running: SIGTERM, SIGKILL
            self.let_go_of_stopped(wait=True)  # (at most the grace period they have left)
            self.reaper.close()  # (and scancels the trials' jobs)
        if self.jobs is not None:
            self.jobs.close()
        self.oracle.stop_asking()
        # asked ahead or reserved, never started: give them back
        unused, reserved = self.oracle.close()
        for trial, waiting in self.standby.values():  # taken, never started: the same
            if waiting is not None:
                waiting.close_gate()  # (the reaper has stopped it already)
            with contextlib.suppress(OSError):
                os.unlink(self.spec_of(trial).log_path)
            unused.append(trial)
        if self.forker is not None:
            self.forker.close()
        storage = self.study._storage
        for trial_id in [trial._trial_id for trial in unused] + reserved:
            storage.set_trial_system_attr(trial_id, UNUSED_ATTR, True)
            storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        for run in self.running.values():  # stopped unfinished (failures, Ctrl-C): re-run
            requeue_interrupted(self.study, run.trial)  # later
        if self.backend is not None:  # done: the workers exit while the caller writes
            # the result, and it waits for them then; else here, unless trials still run
            done = self.ended and not self.running
            self.backend.shutdown(wait=not done and not self.running, cancel_futures=True)


def _handed_over(futures: list[Any]) -> None:
    """Wait until the backend's thread has taken these function trials to their workers
    (their futures run), for at most ``HANDOVER_SECONDS``.

    That thread needs the GIL to send a trial; the sampler, resumed first, would hold it
    for up to 5 ms at a time (Python's switch interval), the trial's slot idle meanwhile.
    """
    deadline = time.monotonic() + HANDOVER_SECONDS
    while any(not (f.running() or f.done()) for f in futures) and time.monotonic() < deadline:
        time.sleep(0.0002)
