"""``paralela.map`` and ``paralela.imap``: a function over many items, on every core."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from paralela._config import UNSET, resolve
from paralela.backends import LOCAL_POOLS, Backend, get_backend, make_backend, worker_share
from paralela.errors import ConfigError, MapError, UnpicklableError

if TYPE_CHECKING:
    from paralela.mapping._engine import MapIterator, Plan
    from paralela.mapping._summary import Results

# The engine, the chunkers, the progress bar, the summary and the task runner are
# imported by _plan only once the backend is chosen: a processes backend starts its
# workers then, and they boot (~30 ms each, bench/bench_map.py workload d) while this
# process imports the rest, instead of after it.

__all__ = ["check_picklable", "choose_backend", "imap", "map"]

R = TypeVar("R")
OnError = Literal["raise", "collect"]


def check_picklable(what: str, obj: Any) -> None:
    """Raise :class:`UnpicklableError` naming ``what`` when ``obj`` cannot be sent to a
    worker process (as the backend pickles it), with what to do instead."""
    from paralela.backends import dumps_with_buffers

    try:
        dumps_with_buffers(obj, False)
    except Exception as exc:
        raise UnpicklableError(
            f"The {what} ({getattr(obj, '__qualname__', type(obj).__name__)}) cannot be sent "
            f"to worker processes: {exc}. Define it at module level (or as a lambda) and "
            "let it open files, connections or models itself, e.g. in an initializer; "
            "or use backend='threads'."
        ) from exc


def imap(
    fn: Callable[..., R],
    items: Iterable[Any],
    *,
    workers: int | Any | None = UNSET,
    backend: str | Backend | Any = UNSET,
    chunksize: int | Literal["auto"] = "auto",
    ordered: bool = True,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
    shared: Any = UNSET,
    on_error: OnError = "raise",
    retries: int | Any = UNSET,
    run_dir: str | os.PathLike[str] | None = None,
    fingerprint: str | None = None,
    progress: bool | Any | None = UNSET,
    backend_options: Mapping[str, Any] | None = None,
) -> MapIterator[R]:
    """Like :func:`map`, but returns an iterator that yields results as they are ready.

    The input is read lazily and at most a few chunks per worker are in flight, so a
    generator of any length runs in bounded memory. The iterator's ``summary`` fills
    in as it runs. Leaving the loop early (or ``close()``) cancels the chunks in flight.
    With ordered results, a failing item (or a failing input generator) first lets
    every result before it through, then raises.
    With ``on_error="collect"`` a failed item yields ``None`` and :class:`MapError`
    is raised once the input is done. On a backend that packs tasks (Slurm) a generator
    is read into a list first: the number of items decides the size of the chunks.
    """
    plan = _plan(
        fn,
        items,
        workers=workers,
        backend=backend,
        chunksize=chunksize,
        ordered=ordered,
        initializer=initializer,
        initargs=initargs,
        shared=shared,
        on_error=on_error,
        retries=retries,
        run_dir=run_dir,
        fingerprint=fingerprint,
        progress=progress,
        backend_options=backend_options,
    )
    from paralela.mapping._engine import MapIterator

    return MapIterator(plan)


def _plan(
    fn: Callable[..., R],
    items: Iterable[Any],
    *,
    workers: int | Any | None = UNSET,
    backend: str | Backend | Any = UNSET,
    chunksize: int | Literal["auto"] = "auto",
    ordered: bool = True,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
    shared: Any = UNSET,
    on_error: OnError = "raise",
    retries: int | Any = UNSET,
    run_dir: str | os.PathLike[str] | None = None,
    fingerprint: str | None = None,
    progress: bool | Any | None = UNSET,
    backend_options: Mapping[str, Any] | None = None,
    write_behind: bool = False,
) -> Plan:
    """The checked :class:`Plan` of a call to :func:`imap`, or of :func:`map` (which
    takes the results only at the end: ``write_behind``)."""
    backend_obj, owns_backend = choose_backend(backend, workers, backend_options)
    from paralela.mapping._chunking import FixedChunker, make_chunker
    from paralela.mapping._engine import Packing, Plan
    from paralela.mapping._progress import make_progress
    from paralela.tasks import Job

    if on_error not in ("raise", "collect"):
        raise ConfigError(f"on_error must be 'raise' or 'collect', got {on_error!r}.")
    n_retries = resolve("retries", retries, 2)
    if isinstance(n_retries, bool) or not isinstance(n_retries, int) or n_retries < 0:
        raise ConfigError(f"retries must be a non-negative integer, got {n_retries!r}.")
    if not callable(fn):
        raise ConfigError(f"fn must be callable, got {type(fn).__name__}.")
    if initializer is not None and not callable(initializer):
        raise ConfigError(f"initializer must be callable, got {type(initializer).__name__}.")
    chunker = make_chunker(chunksize, backend_obj.effective_workers())
    if not isinstance(items, Iterable):
        raise ConfigError(
            f"items must be iterable (a list, range, generator...), got {type(items).__name__}."
        )
    if backend_obj.capabilities.needs_pickling:
        check_picklable("function", fn)
        if initializer is not None:
            check_picklable("initializer", initializer)
            check_picklable("initializer arguments", initargs)
        if shared is not UNSET:
            check_picklable("shared object", shared)
    job = Job(
        fn,
        initializer,
        tuple(initargs),
        None if shared is UNSET else shared,
        shared is not UNSET,
        on_error == "raise",
    )
    total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    packed = backend_obj.capabilities.packs_tasks
    nodes = getattr(getattr(backend_obj, "options", None), "nodes", 1)
    if packed and isinstance(nodes, int) and nodes > 1:
        raise ConfigError(
            f"map runs each cluster task's share on the node it starts on, so nodes={nodes} "
            "would leave the other nodes idle. Leave nodes at 1: more nodes come from more "
            "array tasks (raise max_jobs), each on a node of its own."
        )
    if packed:
        # One chunk per cluster task, at most max_tasks() of them; each task splits its
        # chunk again over its own CPUs (paralela.mapping._packed).
        if total is None:
            items = list(items)
            total = len(items)
        chunker = FixedChunker(_packed_chunk_size(total, backend_obj, chunksize))
    if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint):
        raise ConfigError(f"fingerprint must be a non-empty string, got {fingerprint!r}.")
    if fingerprint is not None and run_dir is None:
        raise ConfigError("fingerprint= names the results kept in a run_dir=; pass run_dir= too.")
    store = None
    if run_dir is not None:
        from paralela.runs import RunStore, fingerprint_function, fingerprint_object

        identity = {
            "function": fingerprint if fingerprint is not None else fingerprint_function(fn)
        }
        if shared is not UNSET:
            identity["shared"] = fingerprint_object(shared)
        store = RunStore(
            run_dir,
            identity,
            {"kind": "map", "function_name": getattr(fn, "__qualname__", repr(fn)), "items": total},
        )
    bar = make_progress(resolve("progress", progress, None), total, getattr(fn, "__name__", "map"))
    packing = None
    if packed:
        from paralela.mapping._packed import remove_finished_pieces, run_packed

        packing = Packing(run_packed, remove_finished_pieces)
    return Plan(
        backend_obj, job, items, total, chunker, ordered, n_retries, store, bar, packing,
        owns_backend, write_behind,
    )  # fmt: skip


def choose_backend(
    backend: Any, workers: Any, options: Mapping[str, Any] | None
) -> tuple[Backend, bool]:
    """The backend a call runs on, and whether it was made for this call alone.

    Inside a worker of another map (nested parallelism) nothing is shared with the pool
    running us, which could deadlock, and nothing outgrows the worker's CPU share: the
    default is a plain loop (as in joblib), and a local pool asked for by name is a
    private one of at most that share, stopped when the call ends.
    """
    name = resolve("backend", backend, UNSET)
    n = resolve("workers", workers, None)
    share = worker_share()
    if share is None or isinstance(name, Backend):
        return get_backend("processes" if name is UNSET else name, n, options), False
    if name is UNSET:
        name = "sequential"
    if name not in LOCAL_POOLS:
        return get_backend(name, n, options), False
    if n is not None and not isinstance(n, bool) and isinstance(n, int):
        n = max(1, min(n, share))
    return make_backend(name, share if n is None else n, options), True


def _packed_chunk_size(total: int, backend: Backend, chunksize: int | str) -> int:
    """Items per cluster task: all items over at most ``max_tasks()`` tasks, or
    ``chunksize`` when that is larger (fewer, longer tasks)."""
    limit = backend.max_tasks() or 1
    size = max(1, -(-total // limit))
    return max(size, chunksize) if isinstance(chunksize, int) else size


def map(
    fn: Callable[..., R],
    items: Iterable[Any],
    *,
    workers: int | Any | None = UNSET,
    backend: str | Backend | Any = UNSET,
    chunksize: int | Literal["auto"] = "auto",
    ordered: bool = True,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
    shared: Any = UNSET,
    on_error: OnError = "raise",
    retries: int | Any = UNSET,
    run_dir: str | os.PathLike[str] | None = None,
    fingerprint: str | None = None,
    progress: bool | Any | None = UNSET,
    backend_options: Mapping[str, Any] | None = None,
) -> Results[R]:
    """Apply ``fn`` to every item, in parallel; return the results as a list.

    Args:
        fn: called as ``fn(item)``, or ``fn(item, shared)`` when ``shared`` is given.
        items: any iterable; read lazily, so it may be a generator of unknown length.
        workers: how many workers (default: the CPUs this process may use); for
            ``backend="slurm"``, the most array tasks (``max_jobs``).
        backend: ``"processes"`` (default), ``"threads"``, ``"sequential"`` (a plain loop
            where pdb works), ``"slurm"`` (array jobs on a cluster, see docs/slurm.md),
            or a :class:`~paralela.backends.Backend`.
        chunksize: ``"auto"`` bunches items so that a chunk takes about 50 ms; or a
            fixed number of items per chunk.
        ordered: results in input order (default), or in the order they finish.
        initializer: called as ``initializer(*initargs)`` once in each worker before its
            first item (load a model, open a database).
        shared: a read-only object sent once to each worker (not once per item).
        on_error: ``"raise"`` stops at the first exception in ``fn`` and re-raises it
            as its own type, with ``paralela_index``, ``paralela_item_repr``, a note and
            (from a worker process) the remote traceback as ``__cause__``;
            :class:`~paralela.errors.TaskError` when it cannot be rebuilt here or is a
            ``KeyboardInterrupt``/``SystemExit`` raised by ``fn``. ``"collect"``
            finishes the input, then raises :class:`~paralela.errors.MapError` with
            every failure and the results (``None`` where an item failed).
        retries: how many times a chunk is run again when its worker dies (killed,
            crashed, out of memory) before :class:`~paralela.errors.WorkerDiedError`.
        run_dir: a directory that keeps finished chunks; running again with the same
            directory computes only what is missing. A directory made for another
            function or input raises :class:`~paralela.errors.FingerprintMismatchError`.
        fingerprint: your own key for the results in ``run_dir``, replacing the
            computed fingerprint of ``fn`` and what it depends on (its helpers and
            module constants). Change it when results would change, e.g. for what the
            fingerprint cannot see (files the function reads). Passing the
            ``fingerprint='...'`` that a ``FingerprintMismatchError`` quotes resumes that
            directory after an edit that cannot change results; you then answer for
            mixing results.
        progress: ``True`` shows a progress bar, ``False`` hides it; by default it
            shows on a terminal.
        backend_options: options of a backend given by name, e.g. for ``"slurm"``:
            ``{"slurm_partition": "gpu", "cpus_per_task": 8, "timeout_min": 60}``. An
            unknown option raises :class:`ConfigError` listing the valid ones.

    Returns:
        A list of results with a ``summary`` attribute (:class:`MapSummary`): items,
        wall time, busy share per worker, and each chunk's timing.

    Raises:
        ConfigError: a bad option, before any work starts.
        UnpicklableError: ``fn``, ``shared``, the initializer or an item cannot reach a
            worker process; raised before that work starts.

    On KeyboardInterrupt (or any early stop) the chunks in flight are cancelled: none
    starts any more, and workers running them are killed with the processes they
    started (``processes`` backend); finished chunks are already in ``run_dir``.
    Inside a worker of another map, the default backend is ``"sequential"``.
    """
    plan = _plan(
        fn,
        items,
        workers=workers,
        backend=backend,
        chunksize=chunksize,
        ordered=ordered,
        initializer=initializer,
        initargs=initargs,
        shared=shared,
        on_error=on_error,
        retries=retries,
        run_dir=run_dir,
        fingerprint=fingerprint,
        progress=progress,
        backend_options=backend_options,
        write_behind=True,
    )
    from paralela.mapping._engine import MapIterator
    from paralela.mapping._summary import Results

    iterator: MapIterator[R] = MapIterator(plan)
    # The list is filled in place (the summary fills in as the run goes): no copy of
    # every result at the end.
    results: Results[R] = Results((), iterator.summary)
    try:
        for chunk in iterator.chunks():
            results.extend(chunk)
    except MapError as exc:
        raise MapError(exc.failures, list(results), iterator.summary) from None
    return results
