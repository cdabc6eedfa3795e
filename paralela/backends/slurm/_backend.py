"""The ``slurm`` backend: calls are buffered and submitted as one job array.

::

    submit(fn, *args) ──> buffer ──(flush(): called by map, or 0.5 s after the last submit)
        JOBDIR/calls/<i>.pkl, refs/<id>.pkl (each Broadcast once), job.sh
        ──> sbatch --array=0-(n-1)[%parallelism] --requeue --signal=B:USR1@delay
    monitor thread
      ├─ results/<i>.pkl appeared (every 0.2-2 s) ──> the future's result or exception
      ├─ states (every 1-15 s; sacct, else scontrol, else squeue)
      │    a task ended (FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, vanished)
      │    without a result ──> submitted again (``retries`` option), else its future
      │    fails with SlurmTaskDiedError: the task, its state, the tail of its log
      ├─ a future the caller cancelled ──> scancel ARRAYID_TASK
      └─ every task of an array resolved ──> its calls/, refs/ and results/ removed
         (job.sh, logs/ and tasks/ stay)

Futures stay pending (never "running") until their result is in, so ``cancel()`` works
on them at any time and stops the Slurm task. ``shutdown(cancel_futures=True)`` (also
run at interpreter exit) cancels every task still queued or running.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from paralela._files import make_dirs
from paralela.backends._base import Backend, Broadcast, Capabilities
from paralela.backends._wire import loads
from paralela.backends.slurm._commands import (
    SlurmCommandError,
    cancel,
    cluster_limits,
    require_slurm,
    run_command,
    submit_script,
    write_script,
)
from paralela.backends.slurm._options import SlurmOptions, parse_options
from paralela.backends.slurm._state import JobState, StateReader
from paralela.backends.slurm._worker import TaskRef
from paralela.errors import ConfigError, ParalelaError, UnpicklableError, WorkerDiedError

__all__ = ["SlurmBackend", "SlurmTaskDiedError", "log_tail"]

R = TypeVar("R")

# A map submits all its chunks in one go and then calls flush(); other callers get
# their calls grouped into one array when they submit within this many seconds.
FLUSH_IDLE_S = 0.5
# Results are files: listing a directory is cheap, so poll it often at first (short
# tasks), then less (long tasks on a shared filesystem).
RESULT_POLL_S = (0.2, 2.0)
# States cost the controller (or slurmdbd) a query: once a second at first, at most
# every 15 s for long jobs, which is what cluster documentation asks of tools.
STATE_POLL_S = (1.0, 15.0)
# A task that ended COMPLETED without a result file: allow for NFS attribute caching
# (up to 30-60 s on some clusters) before calling it lost.
COMPLETED_GRACE_S = 30.0
# A task in a failed state must stay there this long: PREEMPTED turns into PENDING when
# the job is requeued, and a result written just before a kill needs a moment to show.
FAILED_GRACE_S = 2.0
# A task that no command knows for this long after submission has vanished.
LOST_AFTER_S = 120.0
# Slurm's commands failing this long in a row (controller down) fails the open tasks.
COMMANDS_DOWN_LIMIT_S = 600.0
TAIL_LINES = 20


def log_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a log file, ``""`` when it is missing or empty."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _exitcode(state: JobState) -> int | None:
    status, _, sig = state.exit_code.partition(":")
    if sig.isdigit() and int(sig):
        return -int(sig)
    return int(status) if status.isdigit() else None


class SlurmTaskDiedError(WorkerDiedError):
    """A Slurm task ended without a result (failed, cancelled, timed out, lost).

    Attributes:
        task_id: ``ARRAYID_TASK``.
        state: its final :class:`JobState`.
        log_path: its log (stdout and stderr).
        detail: one paragraph with all of the above and the log's last lines.
    """

    def __init__(self, task_id: str, state: JobState, attempts: int, log_path: Path) -> None:
        super().__init__(_exitcode(state), attempts=attempts)
        self.task_id = task_id
        self.state = state
        self.log_path = log_path
        tail = log_tail(log_path)
        shown = "\n".join("    " + line for line in tail.splitlines()) if tail else "    (empty)"
        tried = f" (attempt {attempts})" if attempts > 1 else ""
        self.detail = (
            f"Slurm task {task_id} ended {state.describe()} without a result{tried}; "
            f"its log {log_path} ends with:\n{shown}"
        )
        self.args = (
            f"{self.detail}\nLook at the log for the cause: out of memory needs more "
            "mem_gb, a time limit more timeout_min; raise retries= to try more often.",
        )


@dataclass
class _Call:
    future: Future[Any]
    payload: bytes
    refs: list[Broadcast[Any]]
    attempts: int = 1


@dataclass
class _Task:
    call: _Call
    index: int
    terminal_since: float | None = None


@dataclass
class _Array:
    directory: Path
    job_id: str
    submitted: float
    tasks: dict[int, _Task] = field(default_factory=dict)

    def task_id(self, index: int) -> str:
        return f"{self.job_id}_{index}"


_array_numbers = itertools.count()


class SlurmBackend(Backend):
    """Run calls as Slurm array tasks; futures resolve when their result file appears.

    Args:
        options: see :class:`~paralela.backends.slurm.SlurmOptions` (a mapping of option
            names, or the dataclass). Keyword arguments are merged into it.

    Raises:
        ConfigError: an unknown or invalid option (the message lists the valid ones),
            Slurm's commands are not on ``PATH``, or ``sbatch --test-only`` refuses the
            options (an unknown partition or account, more GPUs than a node has).

    A task that raises sends the exception back (with the remote traceback as its
    cause). A task that ends without a result is submitted again up to ``retries``
    times, then its future fails with :class:`SlurmTaskDiedError`. Nothing waits
    forever: a task that every Slurm command has forgotten for ``LOST_AFTER_S`` counts
    as ended, and Slurm's commands failing for ``COMMANDS_DOWN_LIMIT_S`` fail the
    tasks still open.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        name="slurm",
        isolated=True,
        needs_pickling=True,
        retries_dead_workers=False,
        zero_copy_buffers=False,
        debuggable=False,
        supports_gpus=True,
        packs_tasks=True,
    )
    # Whether the one line saying the cluster lowered max_jobs was printed.
    _told_limit: bool = False

    def __init__(
        self, options: Mapping[str, Any] | SlurmOptions | None = None, **more: Any
    ) -> None:
        given = (
            {f.name: getattr(options, f.name) for f in fields(options)}
            if isinstance(options, SlurmOptions)
            else dict(options or {})
        )
        self.options = parse_options({**given, **more})
        require_slurm()
        self._check_with_sbatch()
        self._reader = StateReader()
        self._cwd = os.getcwd()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._buffer: list[_Call] = []
        self._arrays: list[_Array] = []
        self._last_submit = 0.0
        self._flush_now = False
        self._closing = False
        self._commands_down_since: float | None = None
        self._last_state_poll = 0.0
        self.arrays_submitted = 0
        self.tasks_submitted = 0
        self._monitor = threading.Thread(target=self._run, name="paralela-slurm", daemon=True)
        self._monitor.start()

    # -- the interface -------------------------------------------------------------

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        refs = [a for a in args if isinstance(a, Broadcast)]
        wire_args = tuple(TaskRef(a.id) if isinstance(a, Broadcast) else a for a in args)
        try:
            payload = _cloudpickle((fn, wire_args, kwargs))
            for ref in refs:
                ref.payload(_cloudpickle)
        except Exception as exc:
            raise UnpicklableError(
                f"Cannot send {getattr(fn, '__qualname__', fn)!s} or its arguments to a "
                f"Slurm job: {exc}. Use functions defined at module level and plain data."
            ) from exc
        future: Future[R] = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("This slurm backend was shut down; create a new one.")
            self._buffer.append(_Call(future, payload, refs))
            self._last_submit = time.monotonic()
        self._wake.set()
        return future

    def flush(self) -> None:
        """Submit the buffered calls now, as one array."""
        with self._lock:
            if not self._buffer:
                return
            self._flush_now = True
        self._wake.set()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closing = True
            calls = self._open_calls()
        if cancel_futures:
            for call in calls:
                call.future.cancel()  # the monitor scancels their tasks
        self._wake.set()
        if wait and threading.current_thread() is not self._monitor:
            self._monitor.join()

    def _open_calls(self) -> list[_Call]:
        # list() of a dict view runs in C: safe while the monitor removes tasks.
        tasks = [task for array in list(self._arrays) for task in list(array.tasks.values())]
        return [*self._buffer, *(task.call for task in tasks)]

    def effective_workers(self) -> int:
        return self.max_tasks()

    def max_tasks(self) -> int:
        limits = cluster_limits()
        limit = limits.max_tasks()
        if not limit or limit >= self.options.max_jobs:
            return self.options.max_jobs
        if not self._told_limit:
            self._told_limit = True
            print(
                f"paralela: at most {limit} Slurm array tasks per submission, not max_jobs="
                f"{self.options.max_jobs}: the cluster's {limits.binding()} "
                "(`scontrol show config`, `sacctmgr show assoc`)",
                file=sys.stderr,
            )
        return limit

    def healthy(self) -> bool:
        with self._lock:
            return not self._closing and self._monitor.is_alive()

    # -- submission ------------------------------------------------------------------

    def _check_with_sbatch(self) -> None:
        try:
            run_command(
                ["sbatch", "--test-only", *self.options.sbatch_args(), "--wrap", "true"],
                timeout=30,
            )
        except SlurmCommandError as exc:
            raise ConfigError(
                f"sbatch refuses the options of backend 'slurm': {exc.output or exc}. Check "
                "slurm_partition, slurm_account, slurm_qos, gpus_per_task and mem_gb "
                "against `sinfo` and `sacctmgr show assoc`."
            ) from exc

    def _submit_batch(self, calls: list[_Call]) -> None:
        per_array = self.max_tasks()
        if len(calls) > per_array:
            arrays = -(-len(calls) // per_array)
            print(
                f"paralela: {len(calls)} tasks go to Slurm as {arrays} arrays of at most "
                f"{per_array} (one array may hold no more)",
                file=sys.stderr,
            )
        for lo in range(0, len(calls), per_array):
            group = [c for c in calls[lo : lo + per_array] if not c.future.cancelled()]
            if not group:
                continue
            try:
                array = self._submit_array(group)
            except (SlurmCommandError, OSError) as exc:
                error = ParalelaError(
                    f"Cannot submit {len(group)} task(s) to Slurm: {exc}. Check that the "
                    f"job directory {self.options.job_dir()} is writable and on a "
                    "filesystem the nodes share."
                )
                for call in group:
                    if call.future.set_running_or_notify_cancel():
                        call.future.set_exception(error)
                continue
            with self._lock:
                self._arrays.append(array)
            self.arrays_submitted += 1
            self.tasks_submitted += len(group)

    def _submit_array(self, calls: list[_Call]) -> _Array:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{stamp}-{socket.gethostname()}-{os.getpid()}-{next(_array_numbers)}"
        directory = self.options.job_dir() / name
        for sub in ("calls", "refs", "results", "logs", "tasks"):
            make_dirs(directory / sub)  # never group- or world-writable: it holds pickles
        (directory / "sys_path.json").write_text(json.dumps([p or self._cwd for p in sys.path]))
        written: set[int] = set()
        for index, call in enumerate(calls):
            for ref in call.refs:
                if ref.id not in written:
                    (directory / "refs" / f"{ref.id}.pkl").write_bytes(ref.payload(_cloudpickle))
                    written.add(ref.id)
            (directory / "calls" / f"{index}.pkl").write_bytes(call.payload)
        python = shlex.quote(self.options.slurm_python)
        script = write_script(
            directory / "job.sh",
            [
                *self.options.slurm_setup,
                f"exec {python} -m paralela.backends.slurm {shlex.quote(str(directory))}",
            ],
        )
        throttle = self.options.slurm_array_parallelism
        array = f"--array=0-{len(calls) - 1}" + (f"%{throttle}" if throttle else "")
        job_id = submit_script(
            script,
            [
                *self.options.sbatch_args(),
                array,
                f"--output={directory}/logs/%a.out",
                "--open-mode=append",
                f"--chdir={self._cwd}",
            ],
            cwd=self._cwd,
        )
        (directory / "array_id").write_text(job_id + "\n")
        submitted = _Array(directory, job_id, time.monotonic())
        submitted.tasks = {i: _Task(call, i) for i, call in enumerate(calls)}
        return submitted

    # -- the monitor -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._poll_interval())
                self._wake.clear()
                with self._lock:
                    closing = self._closing
                    due = bool(self._buffer) and (
                        self._flush_now
                        or closing
                        or time.monotonic() - self._last_submit >= FLUSH_IDLE_S
                    )
                    batch: list[_Call] = []
                    if due:
                        batch, self._buffer = self._buffer, []
                        self._flush_now = False
                if batch:
                    self._submit_batch(batch)
                self._poll()
                with self._lock:
                    if self._closing and not self._buffer and not self._arrays:
                        return
        except BaseException as exc:  # never leave futures hanging
            with self._lock:
                self._closing = True
                calls = self._open_calls()
            for call in calls:
                if call.future.set_running_or_notify_cancel():
                    call.future.set_exception(exc)
            raise

    def _poll_interval(self) -> float:
        with self._lock:
            if self._buffer:
                return 0.05
            if not self._arrays:
                return 5.0
            age = time.monotonic() - min(a.submitted for a in self._arrays)
        lo, hi = RESULT_POLL_S
        return min(hi, lo + age / 60)

    def _state_interval(self, age: float) -> float:
        lo, hi = STATE_POLL_S
        return min(hi, max(lo, age / 10))

    def _poll(self) -> None:
        with self._lock:
            arrays = list(self._arrays)
        now = time.monotonic()
        for array in arrays:
            self._cancel_abandoned(array)
            self._collect_results(array)
        open_arrays = [a for a in arrays if a.tasks]
        if open_arrays:
            age = now - min(a.submitted for a in open_arrays)
            if now - self._last_state_poll >= self._state_interval(age):
                self._last_state_poll = now
                self._check_states(open_arrays, now)
        with self._lock:
            done = [a for a in self._arrays if not a.tasks]
            self._arrays = [a for a in self._arrays if a.tasks]
        for array in done:
            _tidy(array.directory)

    def _cancel_abandoned(self, array: _Array) -> None:
        gone = [i for i, t in array.tasks.items() if t.call.future.cancelled()]
        if not gone:
            return
        for i in gone:
            del array.tasks[i]
        try:
            cancel([array.task_id(i) for i in gone])
        except SlurmCommandError as exc:
            print(f"paralela: could not cancel Slurm tasks: {exc}", file=sys.stderr)

    def _collect_results(self, array: _Array) -> None:
        try:
            names = set(os.listdir(array.directory / "results"))
        except OSError:
            return
        for index in [i for i in array.tasks if f"{i}.pkl" in names]:
            self._resolve(array, index)

    def _resolve(self, array: _Array, index: int) -> None:
        task = array.tasks.pop(index)
        future = task.call.future
        try:
            record = loads((array.directory / "results" / f"{index}.pkl").read_bytes())
        except Exception as exc:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
            return
        if not future.set_running_or_notify_cancel():
            return
        if record[0] == "ok":
            future.set_result(record[1])
            return
        from paralela.backends._base import RemoteTraceback

        _, exc_bytes, tb, kind, text = record
        error: BaseException
        try:
            error = loads(exc_bytes) if exc_bytes is not None else ParalelaError(f"{kind}: {text}")
        except Exception:
            error = ParalelaError(f"{kind}: {text}")
        error.__cause__ = RemoteTraceback(tb)
        future.set_exception(error)

    def _check_states(self, arrays: list[_Array], now: float) -> None:
        try:
            states = self._reader.query([a.job_id for a in arrays])
            self._commands_down_since = None
        except SlurmCommandError as exc:
            self._commands_down_since = self._commands_down_since or now
            if now - self._commands_down_since < COMMANDS_DOWN_LIMIT_S:
                return
            for array in arrays:
                for index in list(array.tasks):
                    lost = JobState(array.task_id(index), "VANISHED", "", f"paralela: {exc}")
                    self._ended(array, index, lost)
            return
        for array in arrays:
            for index, task in list(array.tasks.items()):
                state = states.get(array.task_id(index))
                if state is None:
                    if now - array.submitted < LOST_AFTER_S:
                        continue
                    state = JobState(array.task_id(index), "VANISHED", "", "paralela")
                if not state.finished:
                    task.terminal_since = None
                    continue
                if task.terminal_since is None:
                    task.terminal_since = now
                grace = COMPLETED_GRACE_S if state.state == "COMPLETED" else FAILED_GRACE_S
                if (array.directory / "results" / f"{index}.pkl").exists():
                    self._resolve(array, index)
                elif now - task.terminal_since >= grace:
                    self._ended(array, index, state)

    def _ended(self, array: _Array, index: int, state: JobState) -> None:
        task = array.tasks.pop(index)
        call = task.call
        if call.future.cancelled():
            return
        if call.attempts <= self.options.retries:
            call.attempts += 1
            with self._lock:
                self._buffer.append(call)
                self._flush_now = True
            return
        error = SlurmTaskDiedError(
            array.task_id(index), state, call.attempts, array.directory / "logs" / f"{index}.out"
        )
        if call.future.set_running_or_notify_cancel():
            call.future.set_exception(error)


def _tidy(directory: Path) -> None:
    """Remove an array's data once every task has its result or has ended: calls,
    shared data and results (retries get new arrays). The batch script, the logs and
    the tasks' scratch directories stay, for reading after the run."""
    for sub in ("calls", "refs", "results"):
        shutil.rmtree(directory / sub, ignore_errors=True)


def _cloudpickle(obj: Any) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj, protocol=5)  # type: ignore[no-any-return]
