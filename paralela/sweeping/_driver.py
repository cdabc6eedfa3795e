"""The sweep driver: fill every slot with a trial, tell Optuna how each ended.

::

    slots (resources) ──> free slots ──┐
    study.ask() (one trial kept asked ahead per slot, so a freed slot restarts at once)
                                       ▼
      function trial: pinned worker ── future done ──┐
      command trial:  process ── report lines, exit ─┤ events (one queue)
                                                     ▼
    main loop: start trials while budgets allow; on a report: record it, ask the pruner,
    stop a pruned command (SIGTERM, then SIGKILL); on an end: study.tell(), free the slot

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
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela.backends import Broadcast
from paralela.errors import ConfigError, ParalelaError
from paralela.resources import Slot
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

__all__ = ["Budget", "SweepError", "run_trials"]

# How often the loop wakes without events: checks the time budget and the live table.
TICK_SECONDS = 0.25


class SweepError(ParalelaError):
    """The sweep stopped: too many trials failed (``max_failures``)."""


@dataclass
class Budget:
    n_trials: int | None
    timeout: float | None
    max_failures: int | None


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
    budget: Budget,
    already_counted: int,
    log_dir: Path,
    grace_period: float,
    on_change: Callable[[list[TrialRecord], list[TrialRecord]], None],
) -> tuple[list[TrialRecord], float, float]:
    """Run trials until the budget is spent. Returns (records of this run, wall, busy)."""
    from optuna.trial import TrialState

    events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    free: collections.deque[Slot] = collections.deque(slots)
    running: dict[int, _Running] = {}
    records: list[TrialRecord] = []
    failures = 0
    started = 0
    t0 = time.time()
    busy = 0.0
    backend = None
    job_ref = None
    if objective is not None:
        from paralela.backends._processes import ProcessBackend

        backend = ProcessBackend(slots=slots)
        job_ref = Broadcast(FunctionJob(objective, storage_spec, study.study_name, study.pruner))

    def failed_too_often() -> bool:
        return budget.max_failures is not None and failures > budget.max_failures

    def may_start() -> bool:
        if budget.n_trials is not None and already_counted + started >= budget.n_trials:
            return False
        if budget.timeout is not None and time.time() - t0 >= budget.timeout:
            return False
        return not failed_too_often()

    limit = None if budget.n_trials is None else max(0, budget.n_trials - already_counted)
    oracle = Oracle(study, distributions, ahead=len(slots), limit=limit)

    def launch(slot: Slot) -> None:
        nonlocal started
        trial = oracle.take()
        started += 1
        params = {**trial.params, **fixed}
        log_path = str(log_dir / f"trial-{trial.number:05d}.log")
        spec = TrialSpec(trial._trial_id, trial.number, params, log_path)
        record = TrialRecord(
            trial.number,
            "RUNNING",
            None,
            params,
            time.time(),
            slot=slot.index,
            devices=slot.env().get("CUDA_VISIBLE_DEVICES"),
            log_path=log_path,
        )
        handle: Any
        if backend is not None:
            future = backend.submit(run_function_trial, job_ref, spec)
            number = trial.number

            def done(f: Any, n: int = number) -> None:
                events.put(("done", n, f))

            future.add_done_callback(done)
            handle = future
        else:
            assert command is not None
            env = {**os.environ, **slot.env()}
            handle = CommandTrial(command, spec, env, events)
            record.started = handle.started
            assert reaper is not None
            reaper.add(handle.process.pid)  # its own process group: pgid == pid
        running[trial.number] = _Running(trial, slot, record, handle)
        records.append(record)

    def finish(run: _Running, outcome: TrialOutcome) -> None:
        nonlocal failures, busy
        record = run.record
        record.started, record.finished = outcome.started, outcome.finished
        record.state, record.values = outcome.state, outcome.values
        record.error, record.exit_code = outcome.error, outcome.exit_code
        if outcome.devices is not None:
            record.devices = outcome.devices
        if outcome.slot is not None:  # where a function trial really ran
            record.slot = outcome.slot
        busy += outcome.finished - outcome.started
        if outcome.state == "FAIL":
            failures += 1
        del running[run.trial.number]
        free.append(run.slot)
        oracle.tell(run.trial, outcome.state, outcome.values, outcome.error)

    def command_ended(run: _Running, returncode: int) -> TrialOutcome:
        handle: CommandTrial = run.handle
        now = time.time()
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
            how = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
            tail = log_tail(run.record.log_path or "")
            error = f"the trial command ended with {how}; the end of its log:\n{tail}"
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
    try:
        while True:
            while free and may_start():
                launch(free.popleft())
            if not may_start():
                oracle.stop_asking()
            on_change(records, [r.record for r in running.values()])
            if not running or failed_too_often():  # a broken sweep stops at once
                break
            try:
                event = events.get(timeout=TICK_SECONDS)
            except queue.Empty:
                continue
            while True:
                kind = event[0]
                if kind == "done":
                    run = running[event[1]]
                    future = event[2]
                    try:
                        outcome = future.result()
                    except Exception as exc:  # the worker died or the trial could not run
                        outcome = TrialOutcome(
                            run.trial.number,
                            "FAIL",
                            None,
                            run.record.started or time.time(),
                            time.time(),
                            f"{type(exc).__name__}: {exc}",
                        )
                    finish(run, outcome)
                elif kind == "report":
                    handle, value, step = event[1], event[2], event[3]
                    reporting = running.get(handle.spec.number)
                    if reporting is not None and not handle.pruned:
                        run = reporting
                        handle.last_value = value
                        run.record.intermediate[step] = value
                        run.trial.report(value, step)
                        if run.trial.should_prune():
                            handle.pruned = True
                            handle.terminate(grace_period)
                elif kind == "exit":
                    handle, returncode = event[1], event[2]
                    run = running[handle.spec.number]
                    assert reaper is not None
                    reaper.discard(handle.process.pid)
                    finish(run, command_ended(run, returncode))
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
            reaper.close()
        oracle.stop_asking()
        for trial in oracle.close():  # asked ahead, never started: give them back
            study._storage.set_trial_system_attr(trial._trial_id, UNUSED_ATTR, True)
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        for run in running.values():  # stopped unfinished (failures, Ctrl-C): re-run later
            requeue_interrupted(study, run.trial)
        if backend is not None:
            backend.shutdown(wait=not running, cancel_futures=True)
    wall = time.time() - t0
    return records, wall, busy / (wall * len(slots)) if wall > 0 else 0.0


def _last_error(records: list[TrialRecord]) -> str:
    for record in reversed(records):
        if record.state == "FAIL" and record.error:
            return record.error.strip()[-LOG_ERROR_CHARS:]
    return "(no error text)"


def check_budget(n_trials: int | None, timeout: float | None) -> None:
    if n_trials is None and timeout is None:
        raise ConfigError(
            "Give a trial budget (n_trials=, --trials) or a time budget (timeout=, "
            "--timeout), or both."
        )
    if n_trials is not None and (isinstance(n_trials, bool) or n_trials < 1):
        raise ConfigError(f"n_trials must be a positive whole number, got {n_trials!r}.")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}.")
