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

Stopping: when the run ends early (an item failed with ``on_error="raise"``, Ctrl-C,
``close()``, a loop left early), the chunks still in flight are cancelled through
``backend.cancel``: nothing more starts, and the processes backend kills the workers
running them (they are replaced when work needs them). With ordered results, a failed
item (or an input generator that raised) first lets every result before it through.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from paralela.backends import Backend, Broadcast, using
from paralela.backends._processes import RemoteTraceback
from paralela.backends._worker import TaskLoadError
from paralela.errors import (
    FingerprintMismatchError,
    MapError,
    TaskError,
    UnpicklableError,
    WorkerDiedError,
    add_note,
)
from paralela.mapping._chunking import Chunker
from paralela.mapping._packed import remove_finished_pieces, run_packed
from paralela.mapping._progress import NullProgress
from paralela.mapping._summary import ChunkTiming, MapSummary, record_timings
from paralela.mapping._task import ChunkOutcome, ItemFailure, Job, run_chunk, short_repr
from paralela.runs import RunStore, StoredChunk
from paralela.runs._fingerprint import digest_items

__all__ = ["MapIterator", "Plan", "run"]

R = TypeVar("R")
# Chunks kept in flight per worker: the backend's prefetch (2) plus one being prepared.
IN_FLIGHT_PER_WORKER = 3


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
    # Chunks go through run_packed (a local pool inside each cluster task).
    packed: bool = False
    # The backend was made for this run alone (a map nested in a worker): stop it after.
    owns_backend: bool = False


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


def _task_error(f: ItemFailure) -> TaskError:
    error = TaskError(
        f.message,
        index=f.index,
        item_repr=f.item_repr,
        remote_traceback=f.traceback,
        exc_type=f.exc_type,
    )
    error.exception = f.exception
    return error


def user_error(f: ItemFailure, isolated: bool) -> BaseException:
    """The exception to raise for a failed item: the user's own, of its own type, with
    the item attached (``paralela_index``, ``paralela_item_repr`` and a note) and, from
    another process, the remote traceback as its ``__cause__``. A :class:`TaskError`
    when it could not be rebuilt here, or is not an ``Exception`` (a ``KeyboardInterrupt``
    or ``SystemExit`` raised by the function must not pass for a Ctrl-C or an exit)."""
    exc = f.exception
    if not isinstance(exc, Exception) or isinstance(exc, TaskError):
        return _task_error(f)
    try:
        exc.paralela_index = f.index  # type: ignore[attr-defined]
        exc.paralela_item_repr = f.item_repr  # type: ignore[attr-defined]
    except Exception:  # an exception type that refuses attributes
        return _task_error(f)
    add_note(exc, f"paralela: raised by fn on item {f.index} ({f.item_repr})")
    if isolated and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(f.traceback)
    return exc


def failure_record(exc: BaseException) -> ItemFailure | None:
    """The item failure that :func:`user_error` raised as ``exc`` (``None``: not one)."""
    if isinstance(exc, TaskError):
        if exc.index is None:
            return None
        return ItemFailure(
            exc.index, exc.exc_type, str(exc.args[0]), exc.item_repr, exc.remote_traceback,
            exc.exception,
        )  # fmt: skip
    index = getattr(exc, "paralela_index", None)
    if not isinstance(index, int):
        return None
    cause = exc.__cause__
    tb = cause.tb if isinstance(cause, RemoteTraceback) else ""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    item = str(getattr(exc, "paralela_item_repr", ""))
    return ItemFailure(index, kind, str(exc), item, tb or repr(exc), exc)


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
        if plan.packed:
            return plan.backend.submit(run_packed, job_ref, chunk.start, chunk.items, plan.store)
        return plan.backend.submit(run_chunk, job_ref, chunk.start, chunk.items)
    except UnpicklableError:
        from paralela.backends._wire import dumps_with_buffers

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
            yield from _run(plan, summary)
        finally:
            if plan.owns_backend:
                plan.backend.shutdown(wait=False, cancel_futures=True)


def _run(plan: Plan, summary: MapSummary) -> Generator[list[Any], None, None]:
    backend = plan.backend
    isolated = backend.capabilities.isolated
    job_ref = Broadcast(plan.job)
    workers = backend.effective_workers()
    window = workers * IN_FLIGHT_PER_WORKER
    # Lists, tuples and ranges are sliced (a memcpy; a range slice pickles in a few
    # bytes) instead of being read item by item through an iterator.
    sliceable = plan.items if isinstance(plan.items, (list, tuple, range)) else None
    source = iter(plan.items)
    peeked: list[Any] = []
    finished = plan.store.finished() if plan.store is not None else {}
    resume_starts = sorted(finished)
    inflight: dict[Future[ChunkOutcome], _Chunk] = {}
    ready: dict[int, tuple[int, list[Any]]] = {}
    failures: list[TaskError] = []
    next_index = 0
    next_yield = 0
    exhausted = False
    # The input generator's own exception, raised once every item before it is through.
    source_error: Exception | None = None
    # on_error="raise": the first failed item's position and the exception to raise.
    stop_at: int | None = None
    stop_error: BaseException | None = None
    record = record_timings()
    t0 = time.perf_counter()

    def read(n: int) -> list[Any]:
        nonlocal source_error
        try:
            return list(itertools.islice(source, n))
        except Exception as exc:  # raised by the input generator: the items before it count
            source_error = exc
            return []

    def take(n: int) -> Sequence[Any]:
        if sliceable is not None:
            return sliceable[next_index : next_index + n]
        got = peeked[:n]
        del peeked[:n]
        if len(got) < n and source_error is None:
            got.extend(read(n - len(got)))
        return got

    def peek() -> Any:
        if sliceable is not None:
            return sliceable[next_index] if next_index < len(sliceable) else None
        if not peeked and source_error is None:
            peeked.extend(read(1))
        return peeked[0] if peeked else None

    def resume_chunk(start: int) -> None:
        nonlocal next_index, exhausted
        assert plan.store is not None
        stored = plan.store.load(finished.pop(start))
        items = take(stored.end - stored.start)
        if len(items) < stored.end - stored.start or digest_items(items) != stored.input_digest:
            raise FingerprintMismatchError(
                f"Items {stored.start}..{stored.end - 1} differ from those the run directory "
                f"{plan.store.path} computed (or the input is shorter). Pass a new run_dir= "
                "for new inputs, or delete the directory to start afresh."
            )
        ready[stored.start] = (stored.end, stored.results)
        summary.resumed_items += len(items)
        plan.progress.advance(len(items))
        next_index = stored.end

    def fill() -> None:
        nonlocal next_index, exhausted
        while (
            not exhausted
            and len(inflight) < plan.chunker.max_in_flight(window, workers)
            and len(ready) < window
        ):
            if next_index in finished:
                resume_chunk(next_index)
                continue
            limit = next((s for s in resume_starts if s > next_index), None)
            remaining = None if plan.total is None else plan.total - next_index
            size = plan.chunker.next_size(remaining, peek())
            if limit is not None:
                size = min(size, limit - next_index)
            items = take(size)
            if not items:
                exhausted = True
                break
            chunk = _Chunk(next_index, items)
            next_index = chunk.end
            inflight[_submit(plan, job_ref, chunk)] = chunk
        backend.flush()  # backends that group submissions (Slurm arrays) send them now

    def stop_after(index: int, error: BaseException) -> None:
        """Ordered results with on_error="raise": keep what comes before ``index``,
        cancel the rest, raise ``error`` once the results before it are out."""
        nonlocal stop_at, stop_error, exhausted
        if stop_at is not None and stop_at <= index:
            return
        stop_at, stop_error, exhausted = index, error, True
        beyond = [f for f, c in inflight.items() if c.start >= index]
        for future in beyond:
            del inflight[future]
        backend.cancel(beyond)
        for start in [s for s in ready if s >= index]:
            del ready[start]

    def accept(chunk: _Chunk, outcome: ChunkOutcome) -> None:
        n = len(chunk.items)
        plan.chunker.observe(n, outcome.finished - outcome.started)
        summary.chunks += 1
        summary.computed_items += n
        if record:
            summary.timeline.append(
                ChunkTiming(
                    chunk.start,
                    n,
                    outcome.started,
                    outcome.finished,
                    _worker_name(outcome, isolated),
                    outcome.host,
                    chunk.attempts,
                )
            )
        if outcome.failures:
            summary.failures += len(outcome.failures)
            if plan.job.stop_at_first_error:
                first = outcome.failures[0]
                error = user_error(first, isolated)
                if not plan.ordered:
                    _raise(error)
                before = first.index - chunk.start
                stop_after(first.index, error)
                ready[chunk.start] = (first.index, outcome.results[:before])
                plan.progress.advance(before)
                return
            failures.extend(_task_error(f) for f in outcome.failures)
        elif plan.store is not None and not outcome.stored:
            plan.store.write(
                StoredChunk(
                    chunk.start,
                    chunk.end,
                    digest_items(chunk.items),
                    outcome.results,
                    {
                        "started": outcome.started,
                        "finished": outcome.finished,
                        "worker": _worker_name(outcome, isolated),
                        "host": outcome.host,
                        "attempt": chunk.attempts,
                    },
                )
            )
        ready[chunk.start] = (chunk.end, outcome.results)
        plan.progress.advance(n)

    def item_at_fault(chunk: _Chunk, exc: Exception) -> None:
        """A chunk's items could not be loaded in the worker, or its results cannot be
        rebuilt here: run its items one chunk each, so that the item at fault is named
        (and fails like any other) while the others are kept."""
        if len(chunk.items) > 1:
            for offset, item in enumerate(chunk.items):
                single = _Chunk(chunk.start + offset, [item], chunk.attempts)
                inflight[_submit(plan, job_ref, single)] = single
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
        accept(chunk, ChunkOutcome([None], [failure], now, now, 0, "", 0))

    def collect(future: Future[ChunkOutcome]) -> None:
        chunk = inflight.pop(future)
        # Read the error off the future rather than catching what result() raises: a
        # KeyboardInterrupt or SystemExit that came back from a worker is data, not ours.
        error = future.exception()
        if error is None:
            accept(chunk, future.result())
            return
        try:
            raise error
        except WorkerDiedError as died:
            chunk.attempts += died.attempts - 1  # the backend may have retried already
            if chunk.attempts > plan.retries:
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
            summary.retries += 1
            inflight[_submit(plan, job_ref, chunk)] = chunk
            return
        except (UnpicklableError, TaskLoadError) as exc:
            item_at_fault(chunk, exc)
        except (TaskError, MapError):
            raise
        except BaseException as exc:
            raise _chunk_error(chunk, exc) from exc

    pending: BaseException | None = None  # what the run raises, if anything
    try:
        fill()
        while inflight or ready:
            if plan.ordered:
                while next_yield in ready:
                    end, results = ready.pop(next_yield)
                    next_yield = end
                    if results:
                        summary.items += len(results)
                        yield results
            else:
                for start in list(ready):
                    _, results = ready.pop(start)
                    summary.items += len(results)
                    yield results
            if stop_error is not None and stop_at is not None and next_yield >= stop_at:
                _raise(stop_error)
            fill()
            if not inflight:
                if ready or not exhausted:
                    continue
                break
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for future in done:
                if future in inflight:  # a stop may have dropped it meanwhile
                    collect(future)
            fill()
        if stop_error is not None:
            _raise(stop_error)
        if source_error is not None:
            raise source_error
        if plan.packed and plan.store is not None:
            remove_finished_pieces(plan.store)
        if failures:
            failures.sort(key=lambda e: e.index if e.index is not None else -1)
            raise MapError(failures, [], summary)
    except BaseException as exc:
        pending = exc
        raise
    finally:
        if inflight:  # stopped early: nothing more starts, running chunks are stopped
            backend.cancel(list(inflight))
        backend.forget(job_ref)
        plan.progress.close()
        summary.finish(time.perf_counter() - t0)
        if plan.store is not None:
            try:
                plan.store.write_summary(summary.to_dict())
            except OSError as exc:  # a full disk: say so, but not instead of the run's error
                if pending is None:
                    raise
                add_note(pending, f"paralela: the run's summary could not be written: {exc}")
