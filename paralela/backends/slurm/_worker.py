"""What an array task runs: ``python -m paralela.backends.slurm JOBDIR``.

::

    JOBDIR/calls/<task>.pkl ──> (fn, args, kwargs) ──> fn(*args, **kwargs)
                                                          │
    JOBDIR/results/<task>.pkl <── ("ok", value) | ("err", exception, traceback, type, text)
                                  written to a temp file, then renamed: all or nothing

The task is ``SLURM_ARRAY_TASK_ID`` (or the second argument). ``PARALELA_TASK_DIR`` points
at ``JOBDIR/tasks/<task>``, a directory that survives requeues: code that checkpoints
(the packed map's chunk runner does) resumes from it.

Preemption and time limits: the job is submitted with ``--signal=B:USR1@<delay>``. On
``USR1`` the task asks Slurm to requeue it (``scontrol requeue ARRAYID_TASK``) and stops
the function; Slurm then ends this run and starts the task again later, with
``SLURM_RESTART_COUNT`` one higher. Whatever the function saved before (finished chunks
in its run store) is not computed again. If the requeue is refused, the task goes on and
may still finish in time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from paralela._files import atomic_write, make_dirs

__all__ = ["REF_PREFIX", "TaskRef", "main", "task_dir"]

REF_PREFIX = "paralela-ref:"
# After asking for a requeue, Slurm stops this run within its KillWait (30 s by
# default); a run still alive after this long exits by itself.
REQUEUE_WAIT_S = 120.0
# A task warned this many times already runs to the end instead: a time limit shorter
# than the warning delay (a partition's default) would otherwise requeue it forever.
MAX_REQUEUES = 20


class TaskRef:
    """Stands in, inside a pickled call, for a value stored once per array (``refs/``)."""

    __slots__ = ("id",)

    def __init__(self, ref_id: int) -> None:
        self.id = ref_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskRef, (self.id,))


class _Requeued(BaseException):
    """Raised into the running function when the task has been requeued."""


def task_dir(job_dir: Path, task: int) -> Path:
    return job_dir / "tasks" / str(task)


def _own_id() -> str:
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")


def _log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[paralela {stamp}] {message}", file=sys.stderr, flush=True)


def _on_warning(signum: int, frame: FrameType | None) -> None:
    from paralela.backends.slurm._commands import SlurmCommandError, requeue

    job = _own_id()
    name = signal.Signals(signum).name
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts >= MAX_REQUEUES:
        _log(f"got {name}, but this task was requeued {restarts} times already: going on")
        return
    _log(f"got {name} (time limit or preemption near); requeueing {job}")
    try:
        requeue(job)
    except SlurmCommandError as exc:
        _log(f"cannot requeue ({exc}); going on, hoping to finish in time")
        return
    raise _Requeued


def _error_record(exc: BaseException) -> tuple[Any, ...]:
    from paralela.backends._wire import dumps, loads

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    exc_bytes: bytes | None
    try:
        exc_bytes = dumps(exc)
        loads(exc_bytes)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        exc_bytes = None
    return ("err", exc_bytes, tb, kind, str(exc))


def run_task(job_dir: Path, task: int) -> int:
    """Run task ``task`` of the array in ``job_dir``; return the exit status."""
    from paralela.backends._wire import dumps, loads

    sys_path = json.loads((job_dir / "sys_path.json").read_text())
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    here = task_dir(job_dir, task)
    make_dirs(here)
    os.environ["PARALELA_TASK_DIR"] = str(here)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    _log(f"task {task} of {job_dir.name} on {socket.gethostname()} (restart {restarts})")
    signal.signal(signal.SIGUSR1, _on_warning)
    record: tuple[Any, ...]
    try:
        fn, args, kwargs = loads((job_dir / "calls" / f"{task}.pkl").read_bytes())
        refs: dict[int, Any] = {}
        resolved = []
        for arg in args:
            if isinstance(arg, TaskRef):
                if arg.id not in refs:
                    refs[arg.id] = loads((job_dir / "refs" / f"{arg.id}.pkl").read_bytes())
                arg = refs[arg.id]
            resolved.append(arg)
        record = ("ok", fn(*resolved, **kwargs))
    except _Requeued:
        _log("requeued: waiting for Slurm to stop this run")
        time.sleep(REQUEUE_WAIT_S)
        return 0
    except BaseException as exc:  # everything goes back to the driver
        record = _error_record(exc)
    try:
        data = dumps(record)
    except Exception as exc:
        data = dumps(_error_record(exc))
    atomic_write(job_dir / "results" / f"{task}.pkl", data)
    _log(f"task {task} done ({record[0]})")
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.exit("usage: python -m paralela.backends.slurm JOBDIR [TASK]")
    task_text = args[1] if len(args) > 1 else os.environ.get("SLURM_ARRAY_TASK_ID", "0")
    sys.exit(run_task(Path(args[0]), int(task_text)))
