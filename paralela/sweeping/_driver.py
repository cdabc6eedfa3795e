"""The sweep driver: fill every slot with a trial, tell Optuna how each ended.

::

    slots (resources) ──> free slots ──┐
    study.ask() (one trial kept asked ahead per slot, so a freed slot restarts at once)
                                       ▼
      function trial: pinned worker ── future done ──┐
      command trial:  process ── report lines, exit ─┤ events (one queue)
                                                     ▼
    main loop: start trials while budgets allow; on a report: record it, ask the pruner,
    stop a pruned command's process group (SIGTERM, then SIGKILL); on an end:
    study.tell(), free the slot
    python-script commands: each busy slot's next trial is taken ahead and its process
    started, held at a gate (``_gate``) until the slot frees

Trials left RUNNING by a driver that died are failed and queued again on the next run
(see ``_study.recover_interrupted``); finished trials are never run again. The command
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
import numbers
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela.backends import Broadcast, dumps
from paralela.errors import ConfigError, ParalelaError
from paralela.resources import Slot
from paralela.sweeping._budget import SharedBudget
from paralela.sweeping._context import non_finite
from paralela.sweeping._gate import is_python_script
from paralela.sweeping._oracle import LOG_ERROR_CHARS, Oracle
from paralela.sweeping._results import TrialRecord
from paralela.sweeping._study import UNUSED_ATTR, requeue_interrupted
from paralela.sweeping._trials import (
    CommandTrial,
    FunctionJob,
    Reaper,
    TrialOutcome,
    TrialSpec,
    log_tail,
    run_function_trial,
)

if TYPE_CHECKING:  # one Slurm job per trial: imported by the caller that asks for it
    from paralela.sweeping._slurm_trials import SlurmTrial, SlurmTrials

__all__ = ["Budget", "SweepError", "run_trials"]

# How often the loop wakes without events: checks the time budget and the live table.
TICK_SECONDS = 0.25
# How long the loop waits, at most, for the function trials it just submitted to be
# taken to their workers before it lets the sampler work (see _handed_over).
HANDOVER_SECONDS = 0.005


class SweepError(ParalelaError):
    """The sweep stopped: too many trials failed (``max_failures``)."""


@dataclass
class Budget:
    n_trials: int | None
    timeout: float | None
    max_failures: int | None
    trial_timeout: float | None = None  # seconds one trial may run (Slurm: its --time)


class _Overdue(Exception):
    """A trial stopped for running longer than ``trial_timeout``; the text is the reason."""


class _Running:
    __slots__ = ("handle", "record", "slot", "trial")

    def __init__(self, trial: Any, slot: Slot, record: TrialRecord, handle: Any) -> None:
        self.trial = trial
        self.slot = slot
        self.record = record
        self.handle = handle


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
    ``slots``), shut down here at the end; ``None`` for command trials.
    ``jobs``: run each command trial as a Slurm job of its own (the slots then only
    bound how many run at once); ``None``: as a process here.
    ``budget_dir``: where the lock of the budget shared with other drivers lives (the run
    directory); ``None``: no lock (a database shared from several run directories).
    ``define_by_run``: ``objective`` takes an Optuna trial and samples its parameters
    itself, in its worker, with the study's sampler (seeded per trial from ``seed``).
    ``sample``: sample each trial with it (a conditional space's ``Space.sample``), not
    with ``distributions``.
    """
    from optuna.trial import TrialState

    events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    handed: list[Any] = []  # function trials submitted since the sampler last resumed
    free: collections.deque[Slot] = collections.deque(slots)
    running: dict[int, _Running] = {}
    records: list[TrialRecord] = []
    failures = 0
    started = 0
    t0 = time.time()
    busy = 0.0
    job_ref = None
    if objective is not None:
        job_ref = Broadcast(
            FunctionJob(
                objective,
                storage_spec,
                study.study_name,
                dumps(study.pruner),
                sampler=dumps(study.sampler) if define_by_run else None,
                seed=seed,
            )
        )

    def failed_too_often() -> bool:
        return budget.max_failures is not None and failures > budget.max_failures

    def stopped() -> bool:  # no trial may start any more, not even one already taken
        if budget.timeout is not None and time.time() - t0 >= budget.timeout:
            return True
        return failed_too_often()

    def may_start() -> bool:  # a new trial may be taken and started
        if budget.n_trials is not None and already_counted + started >= budget.n_trials:
            return False
        return not stopped() and not oracle.exhausted

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
    # Each slot's next trial, taken ahead, its process waiting at its gate (``_gate``);
    # no process (None) when the gated one died before its turn: it starts plainly.
    gate = command is not None and jobs is None and is_python_script(command)
    standby: dict[int, tuple[Any, CommandTrial | None]] = {}

    def take() -> Any:
        """The next trial, or ``None`` when other drivers took the rest of the budget."""
        nonlocal started
        trial = oracle.take()
        if trial is not None:
            started += 1
        return trial

    def spec_of(trial: Any) -> TrialSpec:
        log_path = str(log_dir / f"trial-{trial.number:05d}.log")
        return TrialSpec(trial._trial_id, trial.number, {**trial.params, **fixed}, log_path)

    def start_job(trial: Any) -> SlurmTrial:
        assert command is not None
        assert jobs is not None
        assert reaper is not None
        job = jobs.start(command, spec_of(trial), events)
        reaper.add_job(job.job_id)
        return job

    def start_command(trial: Any, slot: Slot, gated: bool) -> CommandTrial:
        assert command is not None
        assert reaper is not None
        env = {**os.environ, **slot.env()}
        handle = CommandTrial(command, spec_of(trial), env, events, gated=gated)
        reaper.add(handle.process.pid)  # its own process group: pgid == pid
        return handle

    def launch(slot: Slot) -> bool:
        """Start the slot's next trial; ``False`` if there is none (the budget is spent)."""
        ready = standby.pop(slot.index, None)
        if ready is None:
            trial, handle = take(), None
            if trial is None:
                return False
        else:
            trial, handle = ready
        spec = spec_of(trial)
        record = TrialRecord(
            trial.number,
            "RUNNING",
            None,
            spec.params,
            time.time(),
            slot=slot.index,
            devices=None if jobs is not None else slot.env().get("CUDA_VISIBLE_DEVICES"),
            log_path=spec.log_path,
            host=slot.host or None,
        )
        if backend is not None:
            future = backend.submit(run_function_trial, job_ref, spec)
            handed.append(future)
            number = trial.number

            def done(f: Any, n: int = number) -> None:
                events.put(("done", n, f))

            future.add_done_callback(done)
            running[trial.number] = _Running(trial, slot, record, future)
        else:
            started: CommandTrial | SlurmTrial
            if jobs is not None:
                started = start_job(trial)
            elif handle is None:
                started = start_command(trial, slot, gated=False)
            else:
                handle.open_gate()
                started = handle
            record.started = started.started
            running[trial.number] = _Running(trial, slot, record, started)
        records.append(record)
        return True

    def start_slots() -> None:
        """Start a trial on every free slot that may have one; then, for python-script
        commands, get each busy slot's next trial ready at its gate."""
        for slot in list(free):
            if stopped():
                return
            if slot.index not in standby and not may_start():
                if not standby:
                    continue
                # The trials are all taken, one of them waits on another slot: run it here
                # now, in a fresh process with this slot's environment.
                trial, waiting = standby.pop(next(iter(standby)))
                if waiting is not None:
                    waiting.close_gate()  # it exits unrun
                with contextlib.suppress(OSError):
                    os.unlink(spec_of(trial).log_path)
                standby[slot.index] = (trial, None)
            free.remove(slot)
            if not launch(slot):
                free.append(slot)
                return
        if not gate:
            return
        for slot in slots:
            if slot.index not in standby and slot not in free and may_start():
                following = take()
                if following is None:
                    return
                standby[slot.index] = (following, start_command(following, slot, gated=True))

    timed_out: dict[int, str] = {}  # function trials stopped for time: number -> reason

    def stop_overdue() -> None:
        """Stop the trials that ran longer than ``trial_timeout``: a command's process
        group gets SIGTERM, then SIGKILL after the grace period; a function trial's
        worker is killed and replaced. Slurm jobs have it as their time limit."""
        limit = budget.trial_timeout
        if limit is None:
            return
        now = time.time()
        for number, run in list(running.items()):
            started = run.record.started
            if started is None or now - started < limit or number in timed_out:
                continue
            reason = f"timed out after {limit:g} s (trial_timeout)"
            if isinstance(run.handle, CommandTrial):
                if run.handle.failed is None and not run.handle.pruned:
                    run.handle.failed = reason
                    run.handle.terminate(grace_period)
            elif backend is not None:
                timed_out[number] = reason
                backend.cancel([run.handle])

    def finish(run: _Running, outcome: TrialOutcome) -> None:
        nonlocal failures, busy
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
            record.params = {**outcome.params, **fixed}
        busy += outcome.finished - outcome.started
        if outcome.state == "FAIL":
            failures += 1
        del running[run.trial.number]
        free.append(run.slot)
        oracle.tell(run.trial, outcome.state, outcome.values, outcome.error)

    def command_ended(run: _Running, returncode: int) -> TrialOutcome:
        handle: CommandTrial | SlurmTrial = run.handle
        now = time.time()
        if handle.failed is not None:  # stopped by the driver (a NaN report)
            return TrialOutcome(
                run.trial.number,
                "FAIL",
                None,
                handle.started,
                now,
                handle.failed,
                returncode,
                handle.devices,
            )
        if handle.pruned:
            return TrialOutcome(
                run.trial.number,
                "PRUNED",
                None,
                handle.started,
                now,
                None,
                returncode,
                handle.devices,
            )
        if returncode != 0:
            how = handle.describe_exit(returncode)
            tail = log_tail(run.record.log_path or "")
            error = f"{how}; the end of its log:\n{tail}"
            return TrialOutcome(
                run.trial.number,
                "FAIL",
                None,
                handle.started,
                now,
                error,
                returncode,
                handle.devices,
            )
        if handle.last_value is None:
            error = (
                "the trial command exited 0 but reported no value; call "
                "paralela.report(value) in it (the last value reported is the result)"
            )
            return TrialOutcome(
                run.trial.number, "FAIL", None, handle.started, now, error, 0, handle.devices
            )
        return TrialOutcome(
            run.trial.number,
            "COMPLETE",
            [handle.last_value],
            handle.started,
            now,
            None,
            0,
            handle.devices,
        )

    # Command trials run in sessions of their own; the reaper stops them if the driver dies.
    reaper = Reaper(grace_period) if objective is None else None
    # Ended trials that the driver stopped (pruned, timed out, a NaN): what is left of
    # their group (a child that ignores SIGTERM) is still being stopped, so the reaper
    # keeps it until then.
    ending: list[CommandTrial] = []

    def let_go_of_stopped(*, wait: bool) -> None:
        assert reaper is not None
        for handle in list(ending):
            if wait:
                handle.wait_stopped()
            if handle.stopped():
                reaper.discard(handle.process.pid)
                ending.remove(handle)

    try:
        while True:
            start_slots()
            if not may_start():
                oracle.stop_asking()
            _handed_over(handed)
            handed.clear()
            oracle.resume()  # sample and write while the trials run (see Oracle.hold)
            on_change(records, [r.record for r in running.values()])
            if not running or failed_too_often():  # a broken sweep stops at once
                break
            stop_overdue()
            try:
                event = events.get(timeout=TICK_SECONDS)
            except queue.Empty:
                continue
            oracle.hold()
            while True:
                kind = event[0]
                if kind == "done":
                    run = running[event[1]]
                    future = event[2]
                    overdue = timed_out.pop(run.trial.number, None)
                    try:
                        if overdue is not None:  # stopped by stop_overdue: cancelled
                            raise _Overdue(overdue)
                        outcome = future.result()
                    except Exception as exc:  # the worker died, the trial could
                        why = str(exc)  # not run, or it ran out of time
                        if not isinstance(exc, _Overdue):
                            why = f"{type(exc).__name__}: {why}"
                        outcome = TrialOutcome(
                            run.trial.number,
                            "FAIL",
                            None,
                            run.record.started or time.time(),
                            time.time(),
                            why,
                        )
                    finish(run, outcome)
                elif kind == "report":
                    handle, value, step = event[1], event[2], event[3]
                    reporting = running.get(handle.spec.number)
                    stopping = handle.pruned or handle.failed is not None
                    if reporting is not None and reporting.handle is handle and not stopping:
                        run = reporting
                        problem = non_finite([value], step)
                        if problem is not None:  # a diverged loss: stop it, record why
                            handle.failed = problem
                            handle.terminate(grace_period)
                        else:
                            handle.last_value = value
                            run.record.intermediate[step] = value
                            run.trial.report(value, step)
                        if problem is None and run.trial.should_prune():
                            handle.pruned = True
                            handle.terminate(grace_period)
                elif kind == "exit":
                    handle, returncode = event[1], event[2]
                    assert reaper is not None
                    if isinstance(handle, CommandTrial):
                        if handle.stopping:  # its group may outlive it: listed until gone
                            ending.append(handle)
                        else:
                            reaper.discard(handle.process.pid)
                        let_go_of_stopped(wait=False)
                    else:
                        reaper.discard_job(handle.job_id)
                    ended = running.get(handle.spec.number)
                    if ended is not None and ended.handle is handle:
                        finish(ended, command_ended(ended, returncode))
                    else:  # ended at its gate: its trial starts plainly in its turn
                        for index, (trial, waiting) in list(standby.items()):
                            if waiting is handle:
                                standby[index] = (trial, None)
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    break
        if failed_too_often():
            raise SweepError(
                f"{failures} trials failed, more than max_failures={budget.max_failures}; "
                f"the sweep stopped. The last error:\n{_last_error(records)}"
            )
    finally:
        if reaper is not None:  # stops the commands still running: SIGTERM, then SIGKILL
            let_go_of_stopped(wait=True)  # (at most the grace period they have left)
            reaper.close()  # (and scancels the trials' jobs)
        if jobs is not None:
            jobs.close()
        oracle.stop_asking()
        unused = oracle.close()  # asked ahead, never started: give them back
        for trial, waiting in standby.values():  # taken, never started: the same
            if waiting is not None:
                waiting.close_gate()  # (the reaper has stopped it already)
            with contextlib.suppress(OSError):
                os.unlink(spec_of(trial).log_path)
            unused.append(trial)
        for trial in unused:
            study._storage.set_trial_system_attr(trial._trial_id, UNUSED_ATTR, True)
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        for run in running.values():  # stopped unfinished (failures, Ctrl-C): re-run later
            requeue_interrupted(study, run.trial)
        if backend is not None:
            backend.shutdown(wait=not running, cancel_futures=True)
    wall = time.time() - t0
    return records, wall, busy / (wall * len(slots)) if wall > 0 else 0.0


def _handed_over(futures: list[Any]) -> None:
    """Wait until the backend's thread has taken these function trials to their workers
    (their futures run), for at most ``HANDOVER_SECONDS``.

    That thread needs the GIL to send a trial; the sampler, resumed first, would hold it
    for up to 5 ms at a time (Python's switch interval), the trial's slot idle meanwhile.
    """
    deadline = time.monotonic() + HANDOVER_SECONDS
    while any(not (f.running() or f.done()) for f in futures) and time.monotonic() < deadline:
        time.sleep(0.0002)


def _last_error(records: list[TrialRecord]) -> str:
    for record in reversed(records):
        if record.state == "FAIL" and record.error:
            return record.error.strip()[-LOG_ERROR_CHARS:]
    return "(no error text)"


def check_budget(n_trials: object, timeout: float | None) -> None:
    if n_trials is None and timeout is None:
        raise ConfigError(
            "Give a trial budget (n_trials=, --trials) or a time budget (timeout=, "
            "--timeout), or both."
        )
    if n_trials is not None and (
        isinstance(n_trials, bool) or not isinstance(n_trials, numbers.Integral) or n_trials < 1
    ):
        raise ConfigError(
            f"n_trials must be a positive whole number (an int), got {n_trials!r}; "
            "round it yourself (the budget is a count of trials)."
        )
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}.")
