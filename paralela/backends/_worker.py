"""The worker process of the processes backend, started as
``python -c "from paralela.backends._worker import main; main()" SOCKET_FD ARENA_FD...``.

::

    driver connection ──> reader thread ──> inbox ──> main thread: run task ──> connection
                          (EOF: the driver is gone, exit at once, even mid-task)

Messages from the driver (pickled tuples):
    ("init", sys_path, argv, preload)                 the driver's import path and sys.argv
                                                      (as multiprocessing's spawn), sent first;
                                                      modules to import before any task
    ("task", task_id, payload, arena_slot, layout)   run a task; buffers are in the arena
                                                      (layout: the arena's fd in the driver,
                                                      inode, size, and each buffer's span)
    ("ref", ref_id, payload, layout)                  cache a Broadcast value (its large
                                                      buffers in a shared block: layout)
    ("forget", ref_id)                                drop it
    b"C" + task_id (8 bytes, not a pickle)            cancel a queued task (the reader
                                                      thread notes it; it is never run)
Replies: first ``READY_TAG`` (b"Y", not a pickle: the worker has started), then
("ok", task_id, result), ("err", task_id, exc_or_None, traceback, type, message),
or ("cancelled", task_id); prefixed with b"R" + slot (``RETIRED_TAG``, not a pickle) when
the task left objects over its arena behind: the worker leaves the mapping to them and the
driver gives the slot a fresh arena (see ``_wire``). Files mapped for by-reference arrays
are let go after ``IDLE_SECONDS`` without messages.

A result that cannot be pickled may offer a picklable replacement: its method
``__paralela_unpicklable__(error)`` (the map's chunk outcome names the item at fault).

A fresh interpreter (not a fork) keeps workers safe when the driver has threads or has
initialised CUDA, and never re-runs the user's ``__main__``: functions travel by value
(cloudpickle) or by module name, found on the driver's ``sys.path``.
"""

from __future__ import annotations

import _pickle as pickle  # the C pickler: pickle.py imports re (see _wire)
import contextlib
import os
import queue
import sys
import threading

from paralela.backends._connection import Connection
from paralela.backends._context import mark_process_worker
from paralela.backends._wire import (
    IDLE_SECONDS,
    RETIRED_TAG,
    ArenaView,
    dumps,
    loads,
    map_shared,
    release_files,
)

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # its signal() and constants are _signal's, typed
    from typing import Any, NoReturn
else:  # signal.py's enums would cost every worker ~1.5 ms at start-up
    import _signal

__all__ = [
    "CANCEL_TAG",
    "READY_TAG",
    "BroadcastRef",
    "TaskLoadError",
    "kill_descendants",
    "main",
    "worker_main",
]

# First byte of a cancel message (pickles start with the PROTO opcode, 0x80).
CANCEL_TAG = b"C"
# The worker's first message: it has imported what it needs and takes tasks now.
READY_TAG = b"Y"


class TaskLoadError(Exception):
    """A task reached its worker but could not be unpickled there (whatever the
    unpickling raised, ``SystemExit`` and ``KeyboardInterrupt`` included): the task
    never ran. Its message holds the original error and its traceback."""


class BroadcastRef:
    """Stands in, inside a pickled task, for a Broadcast value cached in the worker."""

    __slots__ = ("id",)

    def __init__(self, ref_id: int) -> None:
        self.id = ref_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (BroadcastRef, (self.id,))


def _read_forever(conn: Connection, inbox: queue.SimpleQueue[bytes], cancelled: set[int]) -> None:
    try:
        while True:
            message = conn.recv_bytes()
            if message[:1] == CANCEL_TAG:  # not a pickle: those start with PROTO (0x80)
                cancelled.add(int.from_bytes(message[1:], "little"))
            else:
                inbox.put(message)
    except (EOFError, OSError):
        _driver_gone()


def _driver_gone() -> NoReturn:
    """The driver closed the connection or died: nobody wants our results, nor the
    processes the user's function started. Exit at once and quietly (a driver killed
    with SIGKILL shares its terminal with us: no traceback there)."""
    if _may_have_children():
        kill_descendants()
    os._exit(0)


def _may_have_children() -> bool:
    """``False`` when Linux says no thread of this process has a child (then the exit
    needs no psutil, whose import costs more than the rest of the worker's exit)."""
    try:
        for thread in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{thread}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:  # not Linux, or a kernel without these files: look with psutil
        return True
    return False


def _send(conn: Connection, data: bytes) -> None:
    """Send ``data`` to the driver; if it is gone (the reader thread may not have seen
    the end of the connection yet), exit as :func:`_driver_gone` does."""
    try:
        conn.send_bytes(data)
    except OSError:  # BrokenPipeError, ConnectionResetError
        _driver_gone()


def kill_descendants(pid: int | None = None, *, itself: bool = False) -> None:
    """SIGKILL every descendant of ``pid`` (default: this process), and ``pid`` itself
    first when ``itself`` (so that it starts nothing more); never raises."""
    try:
        import psutil

        process = psutil.Process(pid)
        children = process.children(recursive=True)
    except Exception:  # psutil missing, or the process is gone
        return
    for child in [process, *children] if itself else children:
        with contextlib.suppress(Exception):  # already gone
            child.kill()


def _ignore_stop_signal(signum: int, frame: Any) -> None:
    """Ctrl-C reaches the whole process group, and Slurm sends SIGTERM to every process
    of a job step (time limit, preemption, scancel): the driver decides what stops, keeps
    what finished and then stops its workers itself (or they exit when its end of the
    connection closes). A Python handler, unlike SIG_IGN, is reset by ``exec``: programs
    the user's function starts still stop on Ctrl-C and SIGTERM."""


def _error_reply(task_id: int, exc: BaseException) -> bytes:
    import traceback  # only on failure: workers start without it

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    exc_bytes: bytes | None
    try:
        exc_bytes = dumps(exc)
        pickle.loads(exc_bytes)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        exc_bytes = None
    return dumps(("err", task_id, exc_bytes, tb, kind, str(exc)))


def _format(exc: BaseException) -> str:
    import traceback  # only on failure: workers start without it

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _ok_reply(task_id: int, result: Any) -> bytes:
    try:
        return dumps(("ok", task_id, result))
    except Exception as exc:
        replace = getattr(result, "__paralela_unpicklable__", None)
        if replace is None:
            raise
        return dumps(("ok", task_id, replace(exc)))


def _next_message(inbox: queue.SimpleQueue[bytes]) -> bytes:
    """The next message from the driver; files mapped for by-reference arrays are let go
    once idle, so that a file deleted after a map is not kept by a pool that lives on."""
    try:
        return inbox.get(timeout=IDLE_SECONDS)
    except queue.Empty:
        release_files()
        return inbox.get()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def main() -> None:
    """Entry point: file descriptors of the driver connection and the arenas in argv."""
    fds = [int(a) for a in sys.argv[1:]]
    for fd in fds:  # processes the user's code starts must not hold them
        os.set_inheritable(fd, False)
    worker_main(Connection(fds[0]), fds[1:])


def worker_main(conn: Connection, arena_fds: list[int]) -> None:
    """Serve tasks until the driver closes the connection."""
    _signal.signal(_signal.SIGINT, _ignore_stop_signal)
    _signal.signal(_signal.SIGTERM, _ignore_stop_signal)
    mark_process_worker(_env_int("OMP_NUM_THREADS", 1))
    cpus = os.environ.get("PARALELA_CPU_AFFINITY")
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    cancelled: set[int] = set()
    threading.Thread(
        target=_read_forever, args=(conn, inbox, cancelled), name="paralela-reader", daemon=True
    ).start()
    arenas = [ArenaView(fd) for fd in arena_fds]
    refs: dict[int, Any] = {}
    _send(conn, READY_TAG)

    while True:
        message = loads(_next_message(inbox))
        kind = message[0]
        if kind == "init":
            sys.path[:] = message[1]
            sys.argv[:] = message[2]
            for name in message[3]:
                try:
                    __import__(name)
                except BaseException:  # the task that needs it raises the error
                    continue
            continue
        if kind == "ref":
            _, ref_id, payload, layout = message
            refs[ref_id] = loads(payload, map_shared(layout) if layout else None)
            continue
        if kind == "forget":
            refs.pop(message[1], None)
            continue
        _, task_id, payload, slot, layout = message
        if task_id in cancelled:
            cancelled.discard(task_id)
            _send(conn, dumps(("cancelled", task_id)))
            continue
        try:
            buffers = arenas[slot].views(layout) if layout else None
            try:
                fn, args, kwargs = loads(payload, buffers)
            except BaseException as exc:  # a bad __setstate__ may raise anything
                raise TaskLoadError(_format(exc)) from None
            args = tuple(refs[a.id] if isinstance(a, BroadcastRef) else a for a in args)
            result = fn(*args, **kwargs)
            del fn, args, kwargs, buffers
            reply = _ok_reply(task_id, result)
            del result
        except BaseException as exc:  # everything goes back to the driver
            reply = _error_reply(task_id, exc)
        fn = args = kwargs = buffers = result = None  # the task's own references go,
        if layout and arenas[slot].retire_if_kept():  # then: did fn keep an array?
            reply = RETIRED_TAG + bytes((slot,)) + reply
        _send(conn, reply)
