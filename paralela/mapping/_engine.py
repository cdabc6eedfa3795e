"""The map engine: chunks in, results out, over any backend.

::

    items ──> chunker ──> backend.submit(run_chunk, job, start, chunk) ──> futures
     (lazy)     ^  sizes from measured time              │
                └────────── observe(n, seconds) ─────────┤
    run store: finished chunks are read instead of computed; new ones written atomically
    results ──> in input order (a bounded reorder buffer) or as they finish

At most ``window`` chunks are in flight and at most ``window`` more wait to be yielded,
so memory stays bounded for inputs of any length. A chunk whose worker died is
submitted again, up to ``retries`` times.

One run is a :class:`_MapRun`; its loop, ``results()``, and the method for each event::

    fill() ── take items, submit chunks (or resume_chunk() a stored one) until the window is full
      │
      ├─> drain() ── yield ready results (in input order, or as they ended)
      │
      └─> wait_for_chunks() ── chunk_ended(future) for each future done:
              ├─ ran ─────────────> accept() ── observe timing, store(), progress(), -> ready
              │                       └─ an item failed, on_error="raise" -> first_failure()
              │                            (unordered: raise now; ordered: stop_after() it)
              ├─ worker died ─────> worker_died() ── submit again, or WorkerDiedError
              ├─ unpicklable ─────> item_at_fault() ── one chunk per item, to name it
              └─ anything else ───> TaskError (the initializer failed)
    the window and ready results are empty -> finish() raises what stopped the run
    however it ended (error, Ctrl-C, close()) -> end(): cancel in flight, write the summary

Stopping: when the run ends early (an item failed with ``on_error="raise"``, Ctrl-C,
``close()``, a loop left early), the chunks still in flight are cancelled through
``backend.cancel``: nothing more starts, and the processes backend kills the workers
running them (they are replaced when work needs them). With ordered results, a failed
item (or an input generator that raised) first lets every result before it through.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from paralela.backends import Backend, Broadcast, RemoteTraceback, TaskLoadError, using
from paralela.errors import (
    FingerprintMismatchError,
    MapError,
    TaskError,
    UnpicklableError,
    WorkerDiedError,
    add_note,
)
from paralela.mapping._chunking import AutoChunker, Chunker
from paralela.mapping._failures import task_error, user_error
from paralela.mapping._progress import NullProgress
from paralela.mapping._storing import PendingStores
from paralela.mapping._summary import ChunkTiming, MapSummary, record_timings
from paralela.tasks import ChunkOutcome, ItemFailure, Job, run_chunk, short_repr

if TYPE_CHECKING:  # the run store loads only for a run with a run_dir
    from paralela.runs import ChunkRecord, RunStore

__all__ = ["MapIterator", "Packing", "Plan", "run"]

R = TypeVar("R")
# Chunks kept in flight per worker: the backend's prefetch (2) plus one being prepared.
IN_FLIGHT_PER_WORKER = 3


@dataclass(frozen=True)
class Packing:
    """How chunks run when each cluster task packs a local pool (``paralela.mapping._packed``,
    chosen by :func:`paralela.map`; the engine only calls it): ``task(job_ref, start,
    items, store)`` runs one chunk inside a cluster task, and ``tidy(store)`` removes the
    pieces the tasks left in the run directory once the run is whole."""

    task: Callable[..., ChunkOutcome]
    tidy: Callable[[RunStore], None]


@dataclass
class Plan:
    """Everything a run needs, validated by :func:`paralela.map`."""

    backend: Backend
    job: Job
    items: Iterable[Any]
    total: int | None
    chunker: Chunker
    ordered: bool
    retries: int
    store: RunStore | None
    progress: NullProgress
    # Chunks go through a packed task (a local pool inside each cluster task).
    packed: Packing | None = None
    # The backend was made for this run alone (a map nested in a worker): stop it after.
    owns_backend: bool = False
    # The caller takes the results only at the end (map, not imap): finished chunks are
    # written to the run store by a thread of their own (paralela.mapping._storing).
    write_behind: bool = False


@dataclass
class _Chunk:
    start: int
    items: Sequence[Any]
    attempts: int = 1

    @property
    def end(self) -> int:
        return self.start + len(self.items)


class MapIterator(Iterator[R], Generic[R]):
    """The iterator :func:`paralela.imap` returns; ``summary`` fills in as it runs.

    Closing it (or leaving a ``for`` loop early) cancels the chunks not yet started.
    """

    def __init__(self, plan: Plan) -> None:
        self.summary = MapSummary()
        self._chunks = run(plan, self.summary)
        self._items: Iterator[Any] = itertools.chain.from_iterable(self._chunks)

    def __iter__(self) -> MapIterator[R]:
        return self

    def __next__(self) -> R:
        return next(self._items)  # type: ignore[no-any-return]

    def chunks(self) -> Iterator[list[R]]:
        """The results a chunk at a time (a list each), for callers that want speed."""
        return self._chunks

    def close(self) -> None:
        """Stop at once: nothing more is yielded, and chunks in flight are cancelled."""
        self._items = iter(())
        self._chunks.close()


def _worker_name(outcome: ChunkOutcome, isolated: bool) -> str:
    return str(outcome.pid) if isolated else f"{outcome.pid}:{outcome.thread}"


def _raise(exc: BaseException) -> NoReturn:
    raise exc from exc.__cause__


def _chunk_error(chunk: _Chunk, exc: BaseException) -> TaskError:
    cause = exc.__cause__
    tb = cause.tb if isinstance(cause, RemoteTraceback) else ""
    return TaskError(
        f"the chunk of items {chunk.start}..{chunk.end - 1} failed outside the function "
        f"(in the initializer): {type(exc).__name__}: {exc}",
        index=None,
        item_repr="",
        remote_traceback=tb or repr(exc),
        exc_type=type(exc).__qualname__,
    )


def _submit(plan: Plan, job_ref: Broadcast[Job], chunk: _Chunk) -> Future[ChunkOutcome]:
    try:
        if plan.packed is not None:
            return plan.backend.submit(
                plan.packed.task, job_ref, chunk.start, chunk.items, plan.store
            )
        return plan.backend.submit(run_chunk, job_ref, chunk.start, chunk.items)
    except UnpicklableError:
        from paralela.backends import dumps_with_buffers

        for offset, item in enumerate(chunk.items):
            try:
                dumps_with_buffers(item, False)
            except Exception as item_exc:
                raise UnpicklableError(
                    f"Item {chunk.start + offset} ({short_repr(item)}) cannot be sent to a "
                    f"worker process: {item_exc}. Pass plain data (numbers, strings, "
                    "arrays, paths) as items, or use backend='threads'."
                ) from item_exc
        raise


def run(plan: Plan, summary: MapSummary) -> Generator[list[Any], None, None]:
    """Generate the results of ``plan``, a list per chunk, and fill ``summary``.

    Yielding whole lists keeps the per-item cost in C (``list.extend``,
    ``itertools.chain``): a Python-level yield per item cost more than the whole
    parallel overhead budget on trivial items.
    """
    with using(plan.backend):
        try:
            yield from _MapRun(plan, summary).results()
        finally:
            if plan.owns_backend:
                plan.backend.shutdown(wait=False, cancel_futures=True)


class _MapRun:
    """One run of the engine: its state as attributes, one method per event.

    :meth:`results` is the loop (drawn at the top of this module); each method below is
    one thing that can happen in it. Everything here runs in the caller's process.
    """

    def __init__(self, plan: Plan, summary: MapSummary) -> None:
        self.plan = plan
        self.summary = summary
        self.backend = plan.backend
        self.isolated = plan.backend.capabilities.isolated
        self.job_ref = Broadcast(plan.job)
        self.workers = self.backend.effective_workers()
        self.window = self.workers * IN_FLIGHT_PER_WORKER
        # The input. Lists, tuples and ranges are sliced (a memcpy; a range slice pickles
        # in a few bytes) instead of being read item by item through an iterator.
        self.sliceable = plan.items if isinstance(plan.items, (list, tuple, range)) else None
        self.source = iter(plan.items)
        self.peeked: list[Any] = []
        self.next_index = 0  # the first item not yet taken from the input
        self.exhausted = False  # no more chunks are taken (input ended, or a stop)
        # The input generator's own exception, raised once every item before it is through.
        self.source_error: Exception | None = None
        # Chunks a previous run with this run directory finished, by start index.
        self.finished: dict[int, ChunkRecord] = (
            plan.store.finished() if plan.store is not None else {}
        )
        # Chunks that ran, on their way to the run store.
        self.pending = (
            PendingStores(
                plan.store,
                background=plan.write_behind,
                merge=isinstance(plan.chunker, AutoChunker),
            )
            if plan.store is not None
            else None
        )
        self.resume_starts = sorted(self.finished)
        # Chunks submitted and not yet ended; results not yet yielded, by start index.
        self.inflight: dict[Future[ChunkOutcome], _Chunk] = {}
        self.ready: dict[int, tuple[int, list[Any]]] = {}
        self.next_yield = 0  # ordered results: the start of the next chunk to yield
        self.failures: list[TaskError] = []  # on_error="collect": every failed item
        # on_error="raise": the first failed item's position and the exception to raise.
        self.stop_at: int | None = None
        self.stop_error: BaseException | None = None
        self.record = record_timings()
        self.t0 = time.perf_counter()

    # -- the loop ----------------------------------------------------------------------

    def results(self) -> Generator[list[Any], None, None]:
        """Generate the results, a list per chunk, until the input and the window are
        empty; then raise what stopped the run, if anything. However it ends (a
        ``close()``, Ctrl-C, an error), :meth:`end` cancels what is still in flight."""
        pending: BaseException | None = None  # what the run raises, if anything
        try:
            self.fill()
            while self.inflight or self.ready:
                yield from self.drain()
                stop_at, stop_error = self.stop_at, self.stop_error
                if stop_error is not None and stop_at is not None and self.next_yield >= stop_at:
                    _raise(stop_error)  # ordered: every result before the failed item is out
                self.fill()
                if not self.inflight:
                    if self.ready or not self.exhausted:
                        continue
                    break
                self.wait_for_chunks()
                self.write_stores()
                self.fill()
            self.finish()
        except BaseException as exc:
            pending = exc
            raise
        finally:
            self.end(pending)

    # -- the input ---------------------------------------------------------------------

    def read(self, n: int) -> list[Any]:
        """Up to ``n`` items from the input iterator; none once the generator raised."""
        try:
            return list(itertools.islice(self.source, n))
        except Exception as exc:  # raised by the input generator: the items before it count
            self.source_error = exc
            return []

    def take(self, n: int) -> Sequence[Any]:
        """The next ``n`` items (fewer at the end of the input)."""
        if self.sliceable is not None:
            return self.sliceable[self.next_index : self.next_index + n]
        peeked = self.peeked
        got = peeked[:n]
        del peeked[:n]
        if len(got) < n and self.source_error is None:
            got.extend(self.read(n - len(got)))
        return got

    def peek(self) -> Any:
        """The next item, not taken (``None`` at the end of the input)."""
        if self.sliceable is not None:
            i = self.next_index
            return self.sliceable[i] if i < len(self.sliceable) else None
        if not self.peeked and self.source_error is None:
            self.peeked.extend(self.read(1))
        return self.peeked[0] if self.peeked else None

    # -- fill the window ---------------------------------------------------------------

    def fill(self) -> None:
        """Take chunks from the input and submit them until the window is full."""
        plan, chunker = self.plan, self.plan.chunker
        while (
            not self.exhausted
            and len(self.inflight) < chunker.max_in_flight(self.window, self.workers)
            and len(self.ready) < self.window
        ):
            start = self.next_index
            if start in self.finished:
                self.resume_chunk(start)
                continue
            limit = next((s for s in self.resume_starts if s > start), None)
            remaining = None if plan.total is None else plan.total - start
            size = chunker.next_size(remaining, self.peek())
            if limit is not None:
                size = min(size, limit - start)
            items = self.take(size)
            if not items:
                self.exhausted = True
                break
            chunk = _Chunk(start, items)
            self.next_index = chunk.end
            self.submit(chunk)
        self.backend.flush()  # backends that group submissions (Slurm arrays) send them now

    def submit(self, chunk: _Chunk) -> None:
        self.inflight[_submit(self.plan, self.job_ref, chunk)] = chunk

    def resume_chunk(self, start: int) -> None:
        """The chunk at ``start`` was finished by an earlier run: read it, after checking
        that the input still holds the same items."""
        from paralela.runs import digest_items

        store = self.plan.store
        assert store is not None
        stored = store.load(self.finished.pop(start))
        items = self.take(stored.end - stored.start)
        if len(items) < stored.end - stored.start or digest_items(items) != stored.input_digest:
            raise FingerprintMismatchError(
                f"Items {stored.start}..{stored.end - 1} differ from those the run directory "
                f"{store.path} computed (or the input is shorter). Pass a new run_dir= "
                "for new inputs, or delete the directory to start afresh."
            )
        self.ready[stored.start] = (stored.end, stored.results)
        self.summary.resumed_items += len(items)
        self.progress(len(items))
        self.next_index = stored.end

    # -- chunks end --------------------------------------------------------------------

    def wait_for_chunks(self) -> None:
        """Block until a chunk in flight ends, and take every one that has."""
        done, _ = wait(self.inflight, return_when=FIRST_COMPLETED)
        for future in done:
            if future in self.inflight:  # a stop may have dropped it meanwhile
                self.chunk_ended(future)

    def chunk_ended(self, future: Future[ChunkOutcome]) -> None:
        """A chunk's future is done: its outcome, or what went wrong around it."""
        chunk = self.inflight.pop(future)
        # Read the error off the future rather than catching what result() raises: a
        # KeyboardInterrupt or SystemExit that came back from a worker is data, not ours.
        error = future.exception()
        if error is None:
            self.accept(chunk, future.result())
            return
        try:
            raise error
        except WorkerDiedError as died:
            self.worker_died(chunk, died)
        except (UnpicklableError, TaskLoadError) as exc:
            self.item_at_fault(chunk, exc)
        except (TaskError, MapError):
            raise
        except BaseException as exc:
            raise _chunk_error(chunk, exc) from exc

    def accept(self, chunk: _Chunk, outcome: ChunkOutcome) -> None:
        """A chunk ran: count it, keep its results, and handle the items that failed."""
        n = len(chunk.items)
        self.plan.chunker.observe(n, outcome.finished - outcome.started)
        summary = self.summary
        summary.chunks += 1
        summary.computed_items += n
        if self.record:
            summary.timeline.append(
                ChunkTiming(
                    chunk.start,
                    n,
                    outcome.started,
                    outcome.finished,
                    _worker_name(outcome, self.isolated),
                    outcome.host,
                    chunk.attempts,
                )
            )
        if outcome.failures:
            summary.failures += len(outcome.failures)
            if self.plan.job.stop_at_first_error:
                self.first_failure(chunk, outcome)
                return
            self.failures.extend(task_error(f) for f in outcome.failures)
        elif self.plan.store is not None and not outcome.stored:
            self.store(chunk, outcome)
        self.ready[chunk.start] = (chunk.end, outcome.results)
        self.progress(n)

    def store(self, chunk: _Chunk, outcome: ChunkOutcome) -> None:
        """Keep a chunk that ran without failures for the run directory."""
        assert self.pending is not None
        self.pending.add(
            chunk.start,
            chunk.items,
            outcome.results,
            {
                "started": outcome.started,
                "finished": outcome.finished,
                "worker": _worker_name(outcome, self.isolated),
                "host": outcome.host,
                "attempt": chunk.attempts,
            },
        )

    def write_stores(self) -> None:
        """imap: write the chunks that ended, before their results are handed out (map's
        are written behind, by a thread of their own)."""
        if self.pending is not None and not self.plan.write_behind:
            self.pending.flush()

    def first_failure(self, chunk: _Chunk, outcome: ChunkOutcome) -> None:
        """on_error="raise" and an item failed: raise at once (unordered), or keep the
        results before it and stop after them (ordered)."""
        first = outcome.failures[0]
        error = user_error(first, self.isolated)
        if not self.plan.ordered:
            _raise(error)
        before = first.index - chunk.start
        self.stop_after(first.index, error)
        self.ready[chunk.start] = (first.index, outcome.results[:before])
        self.progress(before)

    def worker_died(self, chunk: _Chunk, died: WorkerDiedError) -> None:
        """The worker running ``chunk`` died: submit it again, or raise once it has
        been tried ``retries`` times more."""
        chunk.attempts += died.attempts - 1  # the backend may have retried already
        if chunk.attempts > self.plan.retries:
            error = WorkerDiedError(
                died.exitcode,
                indices=range(chunk.start, chunk.end),
                attempts=chunk.attempts,
                pid=died.pid,
            )
            detail = getattr(died, "detail", "")  # how the backend saw it die
            if detail:
                error.args = (f"{error.args[0]}\n{detail}",)
            raise error from None
        chunk.attempts += 1
        self.summary.retries += 1
        self.submit(chunk)

    def item_at_fault(self, chunk: _Chunk, exc: Exception) -> None:
        """A chunk's items could not be loaded in the worker, or its results cannot be
        rebuilt here: run its items one chunk each, so that the item at fault is named
        (and fails like any other) while the others are kept."""
        if len(chunk.items) > 1:
            for offset, item in enumerate(chunk.items):
                self.submit(_Chunk(chunk.start + offset, [item], chunk.attempts))
            return
        if isinstance(exc, TaskLoadError):
            kind = "UnpicklableItem"
            message = f"item {chunk.start} could not be unpickled in the worker:\n{exc}"
        else:
            kind = "UnpicklableResult"
            cause = exc.__cause__
            why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            message = (
                f"The result of item {chunk.start} came back from its worker but cannot be "
                f"rebuilt in this process: {why}. Return plain data (numbers, strings, "
                "lists, dicts, arrays)."
            )
        failure = ItemFailure(chunk.start, kind, message, short_repr(chunk.items[0]), message)
        now = time.time()
        self.accept(chunk, ChunkOutcome([None], [failure], now, now, 0, "", 0))

    def progress(self, n: int) -> None:
        """``n`` more items are done (computed, failed or resumed)."""
        self.plan.progress.advance(n)

    # -- results out -------------------------------------------------------------------

    def drain(self) -> Generator[list[Any], None, None]:
        """Yield the results whose turn has come: in input order up to the first chunk
        still missing, or (unordered) every chunk that ended."""
        ready, summary = self.ready, self.summary
        if self.plan.ordered:
            while self.next_yield in ready:
                end, results = ready.pop(self.next_yield)
                self.next_yield = end
                if results:
                    summary.items += len(results)
                    yield results
        else:
            for start in list(ready):
                _, results = ready.pop(start)
                summary.items += len(results)
                yield results

    # -- stop and finish ---------------------------------------------------------------

    def stop_after(self, index: int, error: BaseException) -> None:
        """Ordered results with on_error="raise": keep what comes before ``index``,
        cancel the rest, raise ``error`` once the results before it are out."""
        if self.stop_at is not None and self.stop_at <= index:
            return
        self.stop_at, self.stop_error, self.exhausted = index, error, True
        beyond = [f for f, c in self.inflight.items() if c.start >= index]
        for future in beyond:
            del self.inflight[future]
        self.backend.cancel(beyond)
        for start in [s for s in self.ready if s >= index]:
            del self.ready[start]

    def finish(self) -> None:
        """Nothing is left in flight or to yield: raise what stopped the run (a failed
        item, the input's own error, the failures collected), or tidy up after it."""
        if self.stop_error is not None:
            _raise(self.stop_error)
        if self.source_error is not None:
            raise self.source_error
        if self.plan.packed is not None and self.plan.store is not None:
            self.plan.packed.tidy(self.plan.store)
        if self.failures:
            self.failures.sort(key=lambda e: e.index if e.index is not None else -1)
            raise MapError(self.failures, [], self.summary)

    def end(self, pending: BaseException | None) -> None:
        """However the run ended: cancel the chunks still in flight (nothing more starts,
        running ones are stopped), close the progress bar, write the summary.
        ``pending`` is the exception the run raises, if any."""
        if self.inflight:
            self.backend.cancel(list(self.inflight))
        self.backend.forget(self.job_ref)
        self.plan.progress.close()
        self.summary.finish(time.perf_counter() - self.t0)
        store, kept = self.plan.store, self.pending
        if store is None or kept is None:
            return
        for what, write in (("finished chunks", kept.close), ("summary", self.summary_out)):
            try:
                write()
            except OSError as exc:  # a full disk: say so, not instead of the run's error
                if pending is None:
                    raise
                add_note(pending, f"paralela: the run's {what} could not be written: {exc}")

    def summary_out(self) -> None:
        assert self.plan.store is not None
        self.plan.store.write_summary(self.summary.to_dict())
