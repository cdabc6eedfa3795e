"""The stages of a pipeline that run work beside the consumer: ``map`` on threads or
processes, ``interleave`` over several sources at once, and ``prefetch``.

::

    upstream ──next()──> Map: a window of at most `workers` elements in flight
                           threads: a daemon pool (never holds up the interpreter's exit)
                           processes: the processes backend (arrays through shared memory)
                         deterministic: hands out in input order; else as they finish
                         the time its consumer waits on the window is its wait_seconds,
                         which the tuner reads to grow or shrink `workers`
    Interleave: cycle_length sources open at once, each read ahead by a thread of its own
    Prefetch: a thread that keeps a bounded queue of the next n elements full

Errors are the user's own exceptions, re-raised in the consumer with a note naming the
stage and the element's position (counted from 0 at the stage's input) and, from a
process, the remote traceback as ``__cause__``. A process that dies (killed, out of
memory, a crash in C) while it runs a chunk of elements: the chunk is run again one
element at a time (as ``map``'s engine does with items at fault), so that the elements
before the one that kills its worker are delivered and the
:class:`~paralela.errors.WorkerDiedError` names that element.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from paralela.data._stats import StageStats
from paralela.data._tuner import Tuner
from paralela.errors import WorkerDiedError, add_note, describe_exit

__all__ = ["DaemonPool", "Interleave", "Map", "Prefetch", "Stage", "timed_chunk"]

_END = object()
# Elements in flight per worker: one running and one waiting, so that a worker never idles
# for a round trip (as the processes backend's PREFETCH), and one slow element does not
# stall the others while the stage hands elements out in order.
WINDOW = 2


class Stage(Iterator[Any]):
    """A running stage: an iterator over its output that can be closed, with counters."""

    def __init__(self, upstream: Stage | None, stats: StageStats) -> None:
        self.upstream = upstream
        self.stats = stats

    def __iter__(self) -> Stage:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Stop this stage's workers, then those of the stages above it."""
        if self.upstream is not None:
            self.upstream.close()

    def pull(self) -> Any:
        """The next element from upstream, or ``_END``."""
        assert self.upstream is not None
        return next(self.upstream, _END)


def failed(exc: BaseException, stats: StageStats, position: int) -> BaseException:
    """``exc`` with a note naming the stage and the element (raised as it is)."""
    add_note(
        exc,
        f"paralela.data: in stage {stats.name}, on its element {position} "
        "(counted from 0 at the stage's input)",
    )
    exc.paralela_stage = stats.name  # type: ignore[attr-defined]
    exc.paralela_position = position  # type: ignore[attr-defined]
    return exc


class DaemonPool:
    """Threads for a stage, started as needed up to ``max_workers``; daemons, so that a
    function stuck in I/O never holds up the interpreter's exit."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = 0
        self._idle = 0
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:  # a stage still pulling while the run stops: never runs
                future.cancel()
                return future
        self._jobs.put((future, fn, args))
        with self._lock:
            spawn = self._idle == 0 and self._threads < self.max_workers
            if spawn:
                self._threads += 1
        if spawn:  # started outside the lock: a start waits for the thread to run
            threading.Thread(target=self._work, name=self.name, daemon=True).start()
        return future

    def resize(self, workers: int) -> None:
        """At most ``workers`` threads from now on (extra ones end after their job)."""
        with self._lock:
            extra = self._threads - workers
            self.max_workers = workers
            if extra > 0:
                self._threads -= extra
        for _ in range(max(0, extra)):
            self._jobs.put(None)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, 0
        for _ in range(threads):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


#: A process stage sends its elements in chunks of about this much work (measured), so
#: that a task's round trip to its process (pickling, the pipe: ~0.3 ms of CPU) is a few
#: percent of it; bench_data.py's 2 ms decode goes 5 to a task. Threads take one at a time.
TASK_SECONDS = 0.01
MAX_CHUNK = 64


def timed_chunk(fn: Callable[[Any], Any], elements: list[Any], process: bool) -> tuple[Any, ...]:
    """``fn`` over ``elements`` (in a worker): the results, the CPU and wall time they took,
    and, when one raised, its index, the exception and its formatted traceback (the
    results before it are kept)."""
    import traceback

    from paralela.tasks import exception_bytes

    clock = time.process_time if process else time.thread_time
    cpu, wall = clock(), time.perf_counter()
    results = []
    failure = None
    for index, element in enumerate(elements):
        try:
            results.append(fn(element))
        except Exception as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if process and exception_bytes(exc) is None:
                # an exception that does not travel: its type and text
                exc = RuntimeError(f"{type(exc).__qualname__}: {exc}")
            failure = (index, exc, tb)
            break
    return results, clock() - cpu, time.perf_counter() - wall, failure


class Map(Stage):
    """``fn`` over every element, ``workers`` at a time, on threads or processes."""

    def __init__(
        self,
        upstream: Stage,
        stats: StageStats,
        fn: Callable[[Any], Any],
        *,
        workers: int | None,
        kind: str,
        deterministic: bool,
        tuner: Tuner,
        maximum: int,
    ) -> None:
        super().__init__(upstream, stats)
        self.fn = fn
        self.kind = kind
        self.deterministic = deterministic
        self.tuner = tuner
        self.tuned = tuner.register(stats, maximum) if workers is None else None
        if workers is not None:
            stats.set_workers(workers)
        elif not stats.history:  # a repeat's rebuild keeps what was tuned
            stats.set_workers(1)
        # (position of the chunk's first element, its elements, its future)
        self.window: collections.deque[tuple[int, list[Any], Future[Any]]] = collections.deque()
        self.ready: collections.deque[Any] = collections.deque()  # a chunk's results
        self.failure: BaseException | None = None  # raised once `ready` is drained
        self.rerun: set[int] = set()  # positions run again alone after a worker died
        self.chunk = 1
        self.closed = False
        self.done_elements = 0  # elements whose busy time is measured
        self.position = 0
        self.exhausted = False
        self.backend: Any = None
        self.pool: DaemonPool | None = None
        # As many processes or threads as workers (processes grow with the tuner; threads
        # also shrink); up to WINDOW x workers chunks in flight keep each busy.
        if kind == "process":
            from paralela.backends import make_backend

            self.backend = make_backend("processes", stats.workers)  # the stage's own
        else:
            self.pool = DaemonPool(stats.workers, stats.name)

    def _submit(self, elements: list[Any]) -> Future[Any]:
        if self.kind == "process":
            future: Future[Any] = self.backend.submit(timed_chunk, self.fn, elements, True)
            return future
        assert self.pool is not None
        return self.pool.submit(timed_chunk, self.fn, elements, False)

    def _fill(self) -> None:
        while (not self.exhausted and not self.closed
               and len(self.window) < self.stats.workers * WINDOW):  # fmt: skip
            elements: list[Any] = []
            error: Exception | None = None
            while len(elements) < self.chunk:
                try:
                    element = self.pull()
                except Exception as exc:  # upstream failed: raised when its turn comes
                    error = exc
                    break
                if element is _END:
                    self.exhausted = True
                    break
                elements.append(element)
            if elements:
                self.window.append((self.position, elements, self._submit(elements)))
                self.position += len(elements)
            if error is not None:
                upstream_failed: Future[Any] = Future()
                upstream_failed.set_exception(error)
                self.window.append((-1, [], upstream_failed))
                self.exhausted = True

    def __next__(self) -> Any:
        if self.ready:
            return self._hand_out()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        if self.tuned is not None:
            before = self.stats.workers
            after = self.tuner.tick(self.tuned, sum(f.done() for _, _, f in self.window))
            if after != before:
                if self.backend is not None:
                    self.backend.grow(after)
                if self.pool is not None:
                    self.pool.resize(after)
        self._fill()
        if not self.window:
            raise StopIteration
        started = time.perf_counter()
        waiting = [self.window[0][2]] if self.deterministic else [f for _, _, f in self.window]
        while not wait(waiting, timeout=0.1, return_when=FIRST_COMPLETED).done:
            if self.closed:  # closed by the consumer while a prefetch thread waits here
                raise StopIteration
        if self.deterministic:
            position, elements, future = self.window.popleft()
        else:
            index = next(i for i, (_, _, f) in enumerate(self.window) if f.done())
            position, elements, future = self.window[index]
            del self.window[index]
        self.stats.wait_seconds += time.perf_counter() - started
        self.stats.queue = sum(f.done() for _, _, f in self.window)
        try:
            results, cpu, wall, failure = future.result()
        except WorkerDiedError as died:
            if len(elements) > 1:  # which element killed it? Each alone, in its place
                singles = [(position + i, [e], self._submit([e])) for i, e in enumerate(elements)]
                self.window.extendleft(reversed(singles))
                self.rerun.update(range(position, position + len(elements)))
                return next(self)
            error = _died_on(died, self.stats.name, position, position in self.rerun)
            raise failed(error, self.stats, position) from None
        except BaseException as exc:
            if position < 0:  # an upstream stage's error, named there
                raise
            raise failed(exc, self.stats, position) from exc.__cause__
        self.stats.cpu_seconds += cpu
        self.stats.busy_seconds += wall
        self.done_elements += len(results) + (failure is not None)
        if failure is not None:
            self.failure = self._failure(position, *failure)
        if self.kind == "process" and self.done_elements:
            per_element = self.stats.busy_seconds / self.done_elements
            self.chunk = max(1, min(MAX_CHUNK, round(TASK_SECONDS / max(per_element, 1e-6))))
        self.ready.extend(results)
        self._fill()  # keep the workers busy while the consumer works
        return next(self)

    def _hand_out(self) -> Any:
        self.stats.elements += 1
        return self.ready.popleft()

    def _failure(self, position: int, index: int, exc: BaseException, tb: str) -> BaseException:
        if self.kind == "process":
            from paralela.backends import RemoteTraceback

            exc.__cause__ = RemoteTraceback(tb)
        return failed(exc, self.stats, position + index)

    def close(self) -> None:
        self.closed = True
        for _, _, future in self.window:
            future.cancel()
        self.window.clear()
        if self.backend is not None:
            self.backend.terminate()
            self.backend.shutdown(wait=False)
        if self.pool is not None:
            self.pool.shutdown()
        super().close()


def _died_on(died: WorkerDiedError, stage: str, position: int, rerun: bool) -> WorkerDiedError:
    """The error of an element that killed its worker when it ran alone (``rerun``: a
    second time, after its chunk's worker died)."""
    error = WorkerDiedError(died.exitcode, indices=[position], attempts=1 + rerun, pid=died.pid)
    who = f"A worker (pid {died.pid})" if died.pid is not None else "A worker"
    again = ", run alone after its chunk's worker died too" if rerun else ""
    error.args = (
        f"{who} died while running element {position} of stage {stage}{again}: "
        f"{describe_exit(died.exitcode)}. If it ran out of "
        "memory, use fewer workers or smaller elements; else see what the function does "
        "with this element (a crash in compiled code, os._exit, a signal).",
    )
    return error


def feed(elements: Iterable[Any], into: queue.Queue[Any], stop: threading.Event) -> None:
    """Put ``("ok", element)`` for each element into ``into``, then ``("end", None)`` (or
    ``("err", exc)``); a thread's body. Gives up once ``stop`` is set (the run closed)."""

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                into.put(item, timeout=0.1)
                return True
        return False

    try:
        for element in elements:
            if not put(("ok", element)):
                return
        put(("end", None))
    except BaseException as exc:
        put(("err", exc))


class _Reader:
    """One source of an interleave, read ahead by a thread into a small queue."""

    def __init__(self, elements: Iterable[Any], stop: threading.Event, name: str) -> None:
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self.stop = stop
        threading.Thread(
            target=feed, args=(elements, self.queue, stop), name=name, daemon=True
        ).start()


class Interleave(Stage):
    """``fn(element)`` is an iterable (a file's records); ``cycle_length`` of them are
    read at once, ``block_length`` elements of each in turn, as tf.data's interleave: a
    source that ends is replaced in its place in the cycle by the next element's, which
    starts when the cycle comes back to it."""

    def __init__(
        self,
        upstream: Stage,
        stats: StageStats,
        fn: Callable[[Any], Iterable[Any]],
        *,
        cycle_length: int,
        block_length: int = 1,
        parallel: bool,
        deterministic: bool,
    ) -> None:
        super().__init__(upstream, stats)
        self.fn = fn
        self.cycle_length = cycle_length
        self.block_length = block_length
        self.taken = 0  # elements of the current source's block handed out
        self.parallel = parallel
        self.deterministic = deterministic
        self.stop = threading.Event()
        self.open: list[tuple[int, Any]] = []  # (position, reader or iterator)
        self.turn = 0
        self.position = 0
        self.exhausted = False
        stats.set_workers(cycle_length if parallel else 1)

    def _open(self) -> tuple[int, Any] | None:
        """The next upstream element's source, or None when upstream is done."""
        element = self.pull()
        if element is _END:
            self.exhausted = True
            return None
        try:
            elements = self.fn(element)
        except BaseException as exc:
            raise failed(exc, self.stats, self.position) from None
        source: Any = (
            _Reader(elements, self.stop, self.stats.name) if self.parallel else iter(elements)
        )
        self.position += 1
        return self.position - 1, source

    def __next__(self) -> Any:
        while not self.exhausted and len(self.open) < self.cycle_length:
            opened = self._open()
            if opened is not None:
                self.open.append(opened)
        while self.open:
            index = self._choose()
            position, source = self.open[index]
            started = time.perf_counter()
            if self.parallel:
                status, value = source.queue.get()
            else:
                try:
                    status, value = "ok", next(source)
                except StopIteration:
                    status, value = "end", None
                except BaseException as exc:
                    status, value = "err", exc
            elapsed = time.perf_counter() - started
            if self.parallel:
                self.stats.wait_seconds += elapsed
            else:
                self.stats.busy_seconds += elapsed
            if status == "end":  # the next source takes its place in the cycle
                opened = None if self.exhausted else self._open()
                if opened is not None:
                    self.open[index] = opened
                    self.turn = index + 1
                else:
                    del self.open[index]
                    self.turn = index
                self.taken = 0
                continue
            if status == "err":
                raise failed(value, self.stats, position) from None
            self.taken += 1
            if self.taken >= self.block_length or index != self.turn % len(self.open):
                self.turn, self.taken = index + 1, 0
            self.stats.elements += 1
            return value
        raise StopIteration

    def _choose(self) -> int:
        turn = self.turn % len(self.open)
        if self.deterministic or not self.parallel:
            return turn
        for k in range(len(self.open)):  # the first source, from its turn on, with data
            index = (turn + k) % len(self.open)
            if not self.open[index][1].queue.empty():
                return index
        return turn

    def close(self) -> None:
        self.stop.set()
        super().close()


class Prefetch(Stage):
    """A thread that keeps the next ``n`` elements of upstream ready."""

    def __init__(self, upstream: Stage, stats: StageStats, n: int) -> None:
        super().__init__(upstream, stats)
        stats.relay = True
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=n)
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=feed, args=(upstream, self.queue, self.stop), name=stats.name, daemon=True
        )
        self.thread.start()

    def __next__(self) -> Any:
        started = time.perf_counter()
        status, value = self.queue.get()
        self.stats.wait_seconds += time.perf_counter() - started
        self.stats.queue = self.queue.qsize()
        if status == "end":
            self.queue.put(("end", None))  # a later next() ends too
            raise StopIteration
        if status == "err":
            raise value
        self.stats.elements += 1
        return value

    def close(self) -> None:
        self.stop.set()
        super().close()  # the thread's pending next() on upstream ends with it
        self.thread.join(timeout=1)
