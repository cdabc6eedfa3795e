"""The processes backend (the default): a pool of worker processes with one manager thread.

::

    submit() ── pickle (cloudpickle, big buffers out of band) ──> pending queue
                                                                     │
    manager thread: wait(connections, process sentinels, wake pipe) ─┤
      ├─ dispatch: give each worker up to PREFETCH tasks; copy buffers into its arena
      ├─ receive:  result or remote error ──> future; a task that kept arrays of its
      │            arena leaves it to them: the slot gets a fresh one (_wire.RETIRED_TAG)
      ├─ idle:     arenas unused for _wire.IDLE_SECONDS shrink to nothing (wait() wakes
      │            for it only while a large idle arena exists)
      ├─ death:    the running task's future fails with WorkerDiedError (the caller may
                   submit it again); the tasks queued behind it go back to the queue;
                   a fresh worker takes the dead one's place once work waits for it
      └─ cancel(): queued tasks are dropped; a worker running a cancelled task is killed
                   with the processes it started (the caller's thread does it at once),
                   one holding only queued ones is told to skip them

Workers are fresh interpreters (fork + exec: safe when the caller has threads or has
initialised CUDA, unlike plain fork, and the user's ``__main__`` is never re-run), stay
alive across calls, and exit on their own when the driver dies: their connection reaches
end-of-file and a reader thread ends the process. Each worker holds only its own
connection, so no worker keeps another's pipe open.
"""

from __future__ import annotations

import _socket  # socketpair: socket.py's enum conversions cost ~2 ms of a cold map
import collections
import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from paralela.backends._base import Backend, Broadcast, Capabilities, RemoteTraceback, usable_cpus
from paralela.backends._connection import Connection, wait
from paralela.backends._environment import worker_envs
from paralela.backends._wire import (
    RETIRED_TAG,
    Arena,
    Layout,
    dumps,
    dumps_with_buffers,
    loads,
    shrink_idle,
    zero_copy_available,
)
from paralela.backends._worker import CANCEL_TAG, READY_TAG, BroadcastRef, kill_descendants
from paralela.errors import ConfigError, ParalelaError, UnpicklableError, WorkerDiedError
from paralela.resources import Slot

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["ProcessBackend"]

R = TypeVar("R")

# Tasks queued on a worker at once: one running and one waiting, so that a worker never
# idles for a round trip between tasks. More would only worsen balance at the end.
PREFETCH = 2
# A task carrying this many bytes of arrays goes only to an idle worker: the copy into
# its arena is the bottleneck then (130-160 us/MiB on 2-core machines), and a worker
# that reads what was just copied finds it still in the CPU's cache; prefetching it
# measured ~10-15 % fewer arrays/s on bench/bench_map.py workload (c).
NO_PREFETCH_BYTES = 4 << 20
# A worker that dies this many times in a row before finishing any task is broken
# (bad environment, import error at start-up): stop instead of respawning forever.
MAX_STARTUP_DEATHS = 3
_WORKER_CODE = "from paralela.backends._worker import main; main()"


class _Task:
    __slots__ = ("buffers", "future", "id", "payload", "refs", "started")

    def __init__(
        self,
        task_id: int,
        future: Future[Any],
        payload: bytes,
        buffers: list[Any],
        refs: list[Broadcast[Any]],
    ) -> None:
        self.id = task_id
        self.future = future
        self.payload = payload
        self.buffers = buffers
        self.refs = refs
        self.started = False


class _Worker:
    __slots__ = (
        "arenas",
        "conn",
        "free_slots",
        "inflight",
        "known_refs",
        "place",
        "process",
        "ready",
        "sentinel",
    )

    def __init__(
        self, process: subprocess.Popen[bytes], conn: Connection, arenas: list[Arena], place: int
    ) -> None:
        self.place = place  # which of the backend's places (and slot) this worker fills
        self.process = process
        self.conn = conn
        # A pidfd becomes readable when the process exits; without one (not Linux), the
        # connection's end-of-file tells the same, as only the worker holds its end.
        self.sentinel: int | None = (
            os.pidfd_open(process.pid) if hasattr(os, "pidfd_open") else None
        )
        self.arenas = arenas
        self.inflight: collections.deque[tuple[_Task, int]] = collections.deque()
        self.free_slots = list(range(PREFETCH))
        self.known_refs: set[int] = set()
        self.ready = False  # it sent READY_TAG: imported, taking tasks

    def close(self) -> None:
        self.conn.close()
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None
        for arena in self.arenas:
            arena.close()


class ProcessBackend(Backend):
    """A pool of worker processes, started once and reused across calls.

    Args:
        workers: number of worker processes (default: one per slot when ``slots`` is
            given, else the CPUs this process may use).
        env: extra environment variables for the workers (applied before any task).
        slots: pin worker ``i`` to ``slots[i % len(slots)]``: its ``CUDA_VISIBLE_DEVICES``
            and thread limits (see :func:`paralela.make_slots`) are in the worker's
            environment before it imports anything. A replacement worker takes the
            dead one's slot.
        pin_cpus: with ``slots``, also restrict each worker to its slot's CPUs.

    A worker's exception comes back as the original exception (when it can be pickled)
    with the remote traceback as its ``__cause__``. When a worker dies, the future of
    the task it was running fails with :class:`~paralela.errors.WorkerDiedError`.
    ``shutdown(cancel_futures=True)`` cancels queued tasks; running ones finish.
    :meth:`cancel` stops given tasks, running ones included (their workers are killed,
    with every process they started, and replaced when work needs them).
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        name="processes",
        isolated=True,
        needs_pickling=True,
        retries_dead_workers=True,
        zero_copy_buffers=zero_copy_available(),
        debuggable=False,
        supports_gpus=True,
    )

    def __init__(
        self,
        workers: int | None = None,
        *,
        env: dict[str, str] | None = None,
        slots: Sequence[Slot] | None = None,
        pin_cpus: bool = False,
        preload: Sequence[str] = (),
    ) -> None:
        if slots is not None and not slots:
            raise ConfigError("slots is empty; pass None or at least one Slot.")
        n = workers if workers is not None else len(slots) if slots else usable_cpus()
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"workers must be a positive integer, got {n!r}.")
        self._n = n
        self._envs = worker_envs(n, slots, env=env, pin_cpus=pin_cpus)
        self._cwd = os.getcwd()
        self._preload = list(preload)  # modules each worker imports at its start
        self._zero_copy = zero_copy_available()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending: collections.deque[_Task] = collections.deque()
        self._workers: list[_Worker] = []
        self._forget: list[int] = []
        # Each broadcast's pickle and shared block, made once (see _shared_payload).
        self._broadcasts: dict[int, tuple[bytes, Arena | None, Layout | None]] = {}
        self._broadcast_lock = threading.Lock()
        self._closing = False
        self._broken: BaseException | None = None
        self._startup_deaths = 0
        # Places of workers killed by cancel(): refilled only once work waits for them.
        self._lazy_places: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # Wait for the spawns (~1 ms): a caller importing meanwhile holds the GIL they need.
        self._spawned = threading.Event()
        self._manager = threading.Thread(target=self._run, name="paralela-manager", daemon=True)
        self._manager.start()
        self._spawned.wait()

    # -- public interface ----------------------------------------------------------

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        refs = [a for a in args if isinstance(a, Broadcast)]
        wire_args = tuple(BroadcastRef(a.id) if isinstance(a, Broadcast) else a for a in args)
        try:
            payload, buffers = dumps_with_buffers((fn, wire_args, kwargs), self._zero_copy)
        except Exception as exc:
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise UnpicklableError(
                f"Cannot send {name} or its arguments to a worker process: {exc}. "
                "Use a function defined at module level or a lambda, and pass objects "
                "such as open files, locks or connections as something workers can "
                "rebuild (a path, a URL); or use backend='threads'."
            ) from exc
        for ref in refs:
            self._shared_payload(ref)
        # Imported here, not at the top: a cold paralela.map makes this backend (its
        # workers start) before concurrent.futures and its logging (~5 ms) are imported.
        from concurrent.futures import Future

        future: Future[R] = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("This processes backend was shut down; create a new one.")
            if self._broken is not None:
                raise self._broken
            self._pending.append(_Task(next(self._ids), future, payload, buffers, refs))
        self._wake()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closing = True
            if cancel_futures:
                while self._pending:
                    self._pending.popleft().future.cancel()
        self._wake()
        if wait and threading.current_thread() is not self._manager:
            self._manager.join()

    def effective_workers(self) -> int:
        return self._n

    def grow(self, workers: int) -> None:
        """Run ``workers`` processes from now on, when that is more than now (an input
        pipeline's tuner adds workers while it runs); the new ones start at once."""
        with self._lock:
            if workers > self._n:
                self._n = workers
        self._wake()

    def terminate(self) -> None:
        with self._lock:
            self._closing = True
            while self._pending:
                _cancel_future(self._pending.popleft().future)
            doomed = []
            for w in self._workers:
                inflight = list(w.inflight)  # a copy, as in cancel()
                for task, _ in inflight:
                    _cancel_future(task.future)
                if inflight:
                    doomed.append(w.process.pid)
        for pid in doomed:
            kill_descendants(pid, itself=True)
        self._wake()

    def cancel(self, futures: Iterable[Future[Any]]) -> None:
        targets = set(futures)
        if not targets:
            return
        doomed: list[int] = []
        with self._lock:
            kept: collections.deque[_Task] = collections.deque()
            for task in self._pending:
                if task.future in targets:
                    _cancel_future(task.future)
                else:
                    kept.append(task)
            self._pending = kept
            for w in self._workers:
                # The manager thread pops finished tasks without the lock: look at a copy
                # (list() of a deque runs no Python code, so no thread switch within it).
                inflight = list(w.inflight)
                hit = [task for task, _ in inflight if task.future in targets]
                if not hit:
                    continue
                if inflight[0][0].future in targets:  # running: only a kill stops it
                    doomed.append(w.process.pid)
                    self._lazy_places.add(w.place)
                else:  # queued behind another caller's task: the worker skips them
                    for task in hit:
                        self._send(w, CANCEL_TAG + task.id.to_bytes(8, "little"))
                for task in hit:
                    _cancel_future(task.future)
        for pid in doomed:  # the manager sees them die and requeues what was not ours
            kill_descendants(pid, itself=True)
        self._wake()

    def healthy(self) -> bool:
        with self._lock:
            return self._broken is None and not self._closing

    def _shared_payload(self, ref: Broadcast[Any]) -> tuple[bytes, Layout | None]:
        """A broadcast's pickle and, for its large buffers (a data set's arrays), where
        they lie in one shared memory block: written once here, mapped read-only by
        every worker that needs the value, so that N workers hold one copy, not N."""
        with self._broadcast_lock:
            made = self._broadcasts.get(ref.id)
            if made is None:
                payload, buffers = _payload_of(ref, self._zero_copy)
                block = Arena() if buffers else None
                layout = block.write(buffers) if block is not None else None
                made = self._broadcasts[ref.id] = (payload, block, layout)
        return made[0], made[2]

    def _drop_broadcast(self, ref_id: int) -> None:
        with self._broadcast_lock:
            made = self._broadcasts.pop(ref_id, None)
        if made is not None and made[1] is not None:
            made[1].close()  # workers that mapped it keep their mapping

    def forget(self, broadcast: Broadcast[Any]) -> None:
        with self._lock:
            self._forget.append(broadcast.id)
        self._wake()

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        with self._lock:
            return [w.process.pid for w in self._workers]

    # -- manager thread ---------------------------------------------------------------

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w < 0:  # the manager has stopped and closed the pipe
                return
            # A full pipe means the manager wakes anyway.
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")

    def _run(self) -> None:
        try:
            with self._lock:
                self._spawn_missing()
            self._spawned.set()  # the constructor waits for these first spawns
            while True:
                with self._lock:
                    if self._broken is None:
                        self._spawn_missing()
                    self._dispatch()
                    if self._closing and not self._pending and not self._busy():
                        return
                    watch: dict[Any, tuple[str, _Worker | None]] = {self._wake_r: ("wake", None)}
                    for w in self._workers:
                        watch[w.conn] = ("conn", w)
                        if w.sentinel is not None:
                            watch[w.sentinel] = ("dead", w)
                    idle = [w.arenas[s] for w in self._workers if w.arenas for s in w.free_slots]
                    timeout = shrink_idle(idle, time.monotonic())
                for ready in wait(list(watch), timeout):
                    what, worker = watch[ready]
                    if what == "wake":
                        os.read(self._wake_r, 65536)
                    elif worker is not None and worker in self._workers:
                        if what == "conn":
                            self._receive(worker)
                        else:
                            self._on_death(worker)
        except BaseException as exc:  # never leave futures hanging
            with self._lock:
                self._broken = exc  # later submits fail at once instead of waiting forever
            self._fail_everything(exc)
            raise
        finally:
            self._spawned.set()  # the constructor never waits for a manager that died
            self._stop_workers()
            for ref_id in list(self._broadcasts):
                self._drop_broadcast(ref_id)

    def _busy(self) -> bool:
        return any(w.inflight for w in self._workers)

    def _spawn_missing(self) -> None:
        taken = {w.place for w in self._workers}
        for place in range(self._n):
            if self._closing:
                return
            if place in self._lazy_places and not self._pending:
                continue
            if place not in taken:
                self._lazy_places.discard(place)
                self._workers.append(self._spawn(place))

    def _spawn(self, place: int) -> _Worker:
        ours, theirs = _socket.socketpair()  # AF_UNIX, not inheritable
        arenas = [Arena() for _ in range(PREFETCH)] if self._zero_copy else []
        fds = [theirs.fileno(), *(a.fd for a in arenas)]
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, *map(str, fds)],
                env=self._envs[place % len(self._envs)],
                cwd=self._cwd,
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        # A worker that died at once (broken environment) is reported by its sentinel.
        with contextlib.suppress(OSError):
            conn.send_bytes(dumps(("init", list(sys.path), list(sys.argv), self._preload)))
        return _Worker(process, conn, arenas, place)

    def _dispatch(self) -> None:
        for ref_id in self._forget:
            for w in self._workers:
                if ref_id in w.known_refs:
                    w.known_refs.discard(ref_id)
                    self._send(w, dumps(("forget", ref_id)))
            self._drop_broadcast(ref_id)
        self._forget.clear()
        while self._pending:
            # Tasks go to started workers only, so that the first one up takes the work
            # while the others still boot (a cold map of a few items returns after one
            # worker's start, not the slowest's); a second, prefetched task only once no
            # worker is booting, so that none waits behind another's long task.
            ready = [w for w in self._workers if w.ready]
            worker = min(ready, key=lambda w: len(w.inflight), default=None)
            limit = PREFETCH if len(ready) == len(self._workers) else 1
            if worker is None or len(worker.inflight) >= limit:
                return
            if worker.inflight and _buffer_bytes(self._pending[0]) >= NO_PREFETCH_BYTES:
                return  # big arrays: copied when a worker is free, read while still cached
            task = self._pending.popleft()
            if not task.started:
                if not task.future.set_running_or_notify_cancel():
                    continue
                task.started = True
            slot = worker.free_slots.pop()
            for ref in task.refs:
                if ref.id not in worker.known_refs:
                    payload, shared = self._shared_payload(ref)
                    self._send(worker, dumps(("ref", ref.id, payload, shared)))
                    worker.known_refs.add(ref.id)
            layout = worker.arenas[slot].write(task.buffers) if task.buffers else []
            worker.inflight.append((task, slot))
            self._send(worker, dumps(("task", task.id, task.payload, slot, layout)))

    def _send(self, worker: _Worker, message: bytes) -> None:
        # If the worker died, its sentinel reports it next.
        with contextlib.suppress(OSError):
            worker.conn.send_bytes(message)

    def _receive(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._on_death(worker)
            return
        self._complete(worker, message)

    def _complete(self, worker: _Worker, data: bytes) -> None:
        if data == READY_TAG:
            worker.ready = True
            return
        if data[:1] == RETIRED_TAG:  # the task kept arrays: the arena is theirs now
            worker.arenas[data[1]].close()
            worker.arenas[data[1]] = Arena()
            data = data[2:]
        task, slot = worker.inflight.popleft()
        worker.free_slots.append(slot)
        task.buffers = []
        self._startup_deaths = 0
        try:
            message = loads(data)
        except BaseException as load_error:  # e.g. the result's class does not import here
            if not task.future.done():
                error = UnpicklableError(
                    "A task's result came back from its worker but cannot be rebuilt "
                    f"in this process: {type(load_error).__name__}: {load_error}. "
                    "Return plain data (numbers, strings, lists, dicts, arrays)."
                )
                error.__cause__ = load_error  # callers that know the task say more
                task.future.set_exception(error)
            return
        if task.future.done():  # cancelled while it ran or waited
            return
        if message[0] == "cancelled":
            return
        if message[0] == "ok":
            task.future.set_result(message[2])
            return
        _, _, exc_bytes, tb, kind, text = message
        exc: BaseException
        try:
            exc = loads(exc_bytes) if exc_bytes is not None else ParalelaError(f"{kind}: {text}")
        except BaseException:
            exc = ParalelaError(f"{kind}: {text}")
        exc.__cause__ = RemoteTraceback(tb)
        task.future.set_exception(exc)

    def _on_death(self, worker: _Worker) -> None:
        # Results the worker sent before it died are still in the pipe: keep them.
        try:
            while worker.inflight and worker.conn.poll(0):
                self._complete(worker, worker.conn.recv_bytes())
        except (EOFError, OSError):
            pass
        try:
            exitcode: int | None = worker.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # connection lost but still alive: end it
            worker.process.kill()
            exitcode = worker.process.wait()
        self._workers.remove(worker)
        worker.close()
        if not worker.inflight:
            if not self._closing:
                self._count_startup_death(exitcode)
            return
        (running, _), *queued = worker.inflight
        for task, _ in reversed(queued):  # not started: they simply run elsewhere
            if not task.future.done():
                self._pending.appendleft(task)
        if not running.future.done():  # else cancelled: killed on purpose
            running.future.set_exception(WorkerDiedError(exitcode, pid=worker.process.pid))

    def _count_startup_death(self, exitcode: int | None) -> None:
        from paralela.errors import describe_exit

        self._startup_deaths += 1
        if self._startup_deaths >= MAX_STARTUP_DEATHS:
            self._broken = WorkerDiedError(exitcode)
            self._broken.args = (
                f"Worker processes die at start-up ({self._startup_deaths} in a row, last: "
                f"{describe_exit(exitcode)}). Check that paralela and your modules import in a "
                "fresh interpreter with the same environment.",
            )
            self._fail_everything(self._broken)

    def _fail_everything(self, exc: BaseException) -> None:
        for w in self._workers:
            for task, _ in w.inflight:
                if not task.future.done():
                    task.future.set_exception(exc)
            w.inflight.clear()
        while self._pending:
            task = self._pending.popleft()
            if not task.future.done():
                if not task.started and not task.future.set_running_or_notify_cancel():
                    continue
                task.future.set_exception(exc)

    def _stop_workers(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for w in workers:
            w.conn.close()  # end-of-file: the worker exits
        for w in workers:
            try:
                w.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
            w.close()
        with self._lock:  # a later shutdown() or forget() must not write to a reused fd
            fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            os.close(fd)


def _buffer_bytes(task: _Task) -> int:
    return sum(memoryview(b).nbytes for b in task.buffers) if task.buffers else 0


def _cancel_future(future: Future[Any]) -> None:
    if not future.cancel() and not future.done():  # already running
        from concurrent.futures import CancelledError

        future.set_exception(CancelledError())


def _payload_of(ref: Broadcast[Any], zero_copy: bool) -> tuple[bytes, list[Any]]:
    """The pickle of a broadcast value and its large buffers, kept out of band."""
    try:
        return dumps_with_buffers(ref.value, zero_copy)
    except Exception as exc:
        raise UnpicklableError(
            f"Cannot send the shared object ({type(ref.value).__name__}) to worker "
            f"processes: {exc}. Share plain data (arrays, dicts, paths) instead."
        ) from exc
