"""The model workers of ``paralela serve``: one process per slot, each fed by a coroutine
on the server's event loop.

::

    for each slot:  coroutine ──start (thread)──> process: Model() + setup(device) ──ready
                        │  loop: batch = await batcher.take(), lingering for the
                        │        clients of the batch it has just answered
                        │        send/receive on the worker's thread ──> answers to futures
                        │  the process died (EOF) ──> its batch fails at once (503), restart
                        │  a batch past stall_after (its requests had their 504): not ready,
                        │        /health "degraded", until it answers
                        │  no answer within hang_timeout ──> SIGKILL, batch fails (503), restart
                        └─ setup fails: at start, the server stops with the error; on a
                           restart, tried again (1, 2, 4 s) and given up after 3 in a row

Each worker has one thread of its own for the blocking pipe calls, so a slow or dying
worker never holds up the event loop or another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from paralela.errors import add_note
from paralela.serving._model import ModelError, model_name
from paralela.serving._serve_batcher import Batcher, Item
from paralela.serving._serve_metrics import Metrics

__all__ = ["SETUP_ATTEMPTS", "WorkerDied", "WorkerPool"]

_WORKER_CODE = "from paralela.serving._serve_worker import main; main()"
#: Restarts of one worker whose setup fails this many times in a row are given up.
SETUP_ATTEMPTS = 3
#: A worker that has answered a batch waits for those clients' next requests at most this
#: fraction of the batch's time (the batcher's linger). The clients of a closed loop are
#: back within a round trip (~1 ms with all-MiniLM-L6-v2 at c=8 on 2 cores, where a batch
#: takes 13-20 ms), and one batch of 8 costs 19 ms where two of 4 cost 26 ms
#: (bench_serve.py, bench/results/serve-profile.md); a quarter bounds what a client that
#: does not come back costs: at most a quarter of the worker's time.
LINGER = 0.25


class WorkerDied(Exception):
    """The model worker holding an input died or hung; its request gets a 503."""


class _SetupFailed(Exception):
    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def _say(message: str) -> None:
    print(f"paralela serve: {message}", file=sys.stderr, flush=True)


class _Thread:
    """A daemon thread that runs blocking calls one at a time for the event loop. Unlike an
    executor's, it never holds up the interpreter's exit (a worker's pipe can block it)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn, args = job
            try:
                outcome: tuple[Any, ...] = (fn(*args), None)
            except BaseException as exc:
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, *outcome)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class _Worker:
    """One model worker process and the thread that talks to it."""

    def __init__(self, index: int, env: dict[str, str]) -> None:
        self.index = index
        self.env = env
        self.thread = _Thread(f"paralela-serve-{index}")
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.ready = False
        self.idle = False  # waiting for a batch: a death then is noticed by its pidfd
        self.starting = False  # between the process's start and the end of its setup
        self.busy_since: float | None = None  # the event loop's time its batch was sent
        self.device = "?"

    def start(self, model_bytes: bytes) -> None:
        """Start the process and wait for its setup (blocking: on the worker's thread)."""
        self.starting = True
        try:
            self._start(model_bytes)
        finally:
            self.starting = False

    def _start(self, model_bytes: bytes) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(theirs.fileno())],
                env=self.env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        try:
            self.conn.send_bytes(pickle.dumps(("init", list(sys.path), model_bytes)))
            reply = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise _SetupFailed(f"worker {self.index} died during setup ({self.ended()})") from None
        if reply[0] == "failed":
            self.ended()
            raise _SetupFailed(reply[1], reply[2])
        _, _pid, self.device, _seconds = reply

    def call(self, payload: bytes) -> Any:
        """Send a batch and wait for its answers (blocking: on the worker's thread).

        Raises:
            WorkerDied: the process died before it answered.
        """
        assert self.conn is not None
        try:
            self.conn.send_bytes(payload)
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise WorkerDied(
                f"the model worker (pid {self.pid}) died while it held this request "
                f"({self.ended()}); it is being restarted, send the request again"
            ) from None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def ended(self) -> str:
        """Wait for the process to end (kill it after 2 s); how it ended, in words."""
        from paralela.errors import describe_exit

        if self.process is None:
            return "not started"
        try:
            code = self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return describe_exit(code)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def close(self) -> None:
        """Close the connection (the worker exits at end of file) and reap the process;
        a worker still in ``setup``, or that does not exit within 2 s, is killed."""
        if self.starting:
            self.kill()  # its thread waits in recv for setup: closing would not wake it
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        if self.process is not None:
            try:
                self.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.kill()
                self.process.wait()


class WorkerPool:
    """The model workers, one per environment in ``envs`` (a slot's each).

    Args:
        model: the model class (checked).
        envs: each worker's environment.
        batcher: where the workers take their batches.
        metrics: counted into.
        hang_timeout: seconds a batch may take before its worker is killed as hung.
        stall_after: seconds after which a worker still on its batch is no longer counted
            ready (its requests have had their 504): the request timeout.
        on_ready: called once, when every worker has finished its first setup.
        on_fatal: called with a :class:`ModelError` when the server cannot serve: a setup
            failed at start, or every worker was given up.
    """

    def __init__(
        self,
        model: type,
        envs: list[dict[str, str]],
        batcher: Batcher,
        metrics: Metrics,
        *,
        hang_timeout: float,
        stall_after: float,
        on_ready: Callable[[], None],
        on_fatal: Callable[[ModelError], None],
    ) -> None:
        import cloudpickle  # a class of the user's __main__ travels by value

        self.model = model
        self._model_bytes = cloudpickle.dumps(model)
        self.workers = [_Worker(i, env) for i, env in enumerate(envs)]
        self.batcher = batcher
        self.metrics = metrics
        self.hang_timeout = hang_timeout
        self.stall_after = stall_after
        self._on_ready = on_ready
        self._on_fatal = on_fatal
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False  # every worker was ready once
        self._given_up = 0
        self._closing = False

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def ready(self) -> int:
        """Workers that finished setup and answer in time: not restarting, nor past
        ``stall_after`` on a batch."""
        return sum(w.ready for w in self.workers) - self.stalled

    @property
    def stalled(self) -> int:
        """Workers set up but past ``stall_after`` on their batch (not yet killed as hung)."""
        now = asyncio.get_running_loop().time()
        return sum(
            w.ready and w.busy_since is not None and now - w.busy_since > self.stall_after
            for w in self.workers
        )

    @property
    def started(self) -> bool:
        """Every worker finished its first setup."""
        return self._started

    def start(self) -> None:
        """Start every worker (on the running event loop); returns at once."""
        self._tasks = [asyncio.ensure_future(self._run(w)) for w in self.workers]

    async def stop(self) -> None:
        """Stop taking batches and stop every worker."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.close) for w in self.workers))
        for w in self.workers:
            w.thread.stop()

    def kill(self) -> None:
        """SIGKILL every worker still running: the last resort when the server stops
        without a graceful shutdown (a second Ctrl-C)."""
        for w in self.workers:
            w.kill()

    async def _run(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._closing:
            try:
                await worker.thread.run(worker.start, self._model_bytes)
            except _SetupFailed as exc:
                failures += 1
                if not self._started or failures >= SETUP_ATTEMPTS:
                    self._give_up(worker, exc, failures)
                    return
                _say(f"worker {worker.index} failed to set up again ({exc}); retrying")
                await asyncio.sleep(2 ** (failures - 1))
                continue
            failures = 0
            worker.ready = True
            self.batcher.workers = max(1, self.ready)  # fair shares among those serving
            if not self._started and all(w.ready for w in self.workers):
                self._started = True
                self._on_ready()
            serving = asyncio.ensure_future(self._serve(worker, loop))
            unwatch = _watch_exit(loop, worker, functools.partial(_cancel_if_idle, worker, serving))
            try:
                await serving
            except asyncio.CancelledError:
                if self._closing or not serving.cancelled():
                    raise
                _say(f"worker {worker.index} (pid {worker.pid}) died while idle "
                     f"({worker.ended()}); restarting it")  # fmt: skip
            finally:
                worker.ready = False
                self.batcher.workers = max(1, self.ready)
                unwatch()
            if not self._closing:
                self.metrics.restarts += 1

    async def _serve(self, worker: _Worker, loop: asyncio.AbstractEventLoop) -> None:
        """Take batches until the worker dies or hangs (then returns) or the pool stops."""
        answered, took = 0, 0.0  # the last batch: its clients are expected back
        while True:
            worker.idle = True
            try:
                batch = await self.batcher.take(answered, LINGER * took)
            finally:
                worker.idle = False
            self.metrics.batch_size.observe(len(batch))
            payload = pickle.dumps([item.value for item in batch], pickle.HIGHEST_PROTOCOL)
            sent = worker.busy_since = loop.time()
            call = worker.thread.run(worker.call, payload)
            try:
                _, outputs = await asyncio.wait_for(asyncio.shield(call), self.hang_timeout)
            except asyncio.TimeoutError:
                worker.kill()
                _fail(batch, WorkerDied(
                    f"the model worker (pid {worker.pid}) took more than "
                    f"{self.hang_timeout:g} s on a batch of {len(batch)} and was stopped; "
                    "it is being restarted"
                ))  # fmt: skip
                _say(f"worker {worker.index} (pid {worker.pid}) hung; restarting it")
                with contextlib.suppress(WorkerDied):
                    await call
                return
            except WorkerDied as exc:
                _fail(batch, exc)
                _say(f"worker {worker.index} (pid {worker.pid}) died; restarting it")
                return
            except asyncio.CancelledError:  # the pool stops: the batch's requests are gone
                _fail(batch, WorkerDied("the server is stopping"))
                raise
            finally:
                worker.busy_since = None
                self.batcher.release(len(batch))
            took = loop.time() - sent
            answered = len(batch)
            self.metrics.batch_seconds.observe(took)
            self.metrics.inputs += len(batch)
            for item, output in zip(batch, outputs, strict=True):
                if not item.future.done():
                    item.future.set_result(output)

    def _give_up(self, worker: _Worker, exc: _SetupFailed, failures: int) -> None:
        name = model_name(self.model)
        if not self._started:
            error = ModelError(f"{name}: worker {worker.index} failed to set up: {exc}")
        else:
            self._given_up += 1
            _say(f"worker {worker.index} failed to set up {failures} times in a row; "
                 f"given up ({self.size - self._given_up} of {self.size} left): {exc}")  # fmt: skip
            if self._given_up < self.size:
                return
            error = ModelError(f"{name}: every worker failed to set up again; last: {exc}")
        if exc.detail:
            add_note(error, exc.detail.rstrip())
        self._on_fatal(error)


def _watch_exit(
    loop: asyncio.AbstractEventLoop, worker: _Worker, on_exit: Callable[[], Any]
) -> Callable[[], None]:
    """Call ``on_exit`` when the worker's process ends (its pidfd becomes readable);
    returns the function that stops watching. Without pidfds (not Linux), a death is
    noticed when the next batch is sent."""
    if worker.pid is None or not hasattr(os, "pidfd_open"):
        return lambda: None
    try:
        fd = os.pidfd_open(worker.pid)
    except OSError:  # already reaped
        return lambda: None
    loop.add_reader(fd, on_exit)

    def unwatch() -> None:
        loop.remove_reader(fd)
        os.close(fd)

    return unwatch


def _cancel_if_idle(worker: _Worker, serving: asyncio.Future[None]) -> None:
    if worker.idle:  # else the pending call notices the death and fails its batch
        serving.cancel()


def _fail(batch: list[Item], exc: BaseException) -> None:
    for item in batch:
        if not item.future.done():
            item.future.set_exception(exc)


#: OpenMP's threads sleep when they wait (unless the user's environment says otherwise).
#: By default a thread of a team spins for milliseconds after each parallel region: a
#: worker of 2 torch threads on 2 CPUs then burns CPU between batches that the HTTP
#: process and the clients need, and on a machine busy with other work, a spinning thread
#: holds a CPU while its team waits at a barrier for the thread that lost its own.
#: bench_serve.py's model (all-MiniLM-L6-v2) in process on 2 threads, on 2 CPUs with a
#: load average of 11-14 from other work: spinning, 346-1,148 ms a sentence and
#: 473-1,638 ms a batch of 8; sleeping, 18-31 ms and 69-99 ms (3 runs each;
#: bench/results/serve-profile.md). Set OMP_WAIT_POLICY=ACTIVE for CPUs of the server's own.
OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}


def worker_envs(slots: list[Any]) -> list[dict[str, str]]:
    """Each slot's worker environment: its GPUs and thread limits over this one's, and
    OpenMP's threads sleeping when they wait (:data:`OPENMP_WAIT`)."""
    from paralela.backends import worker_envs as slot_envs  # as the processes backend's

    envs = slot_envs(len(slots), slots) if slots else []
    return [{**OPENMP_WAIT, **env} for env in envs]
