"""The chunk runner of backends that pack tasks (``Capabilities.packs_tasks``: Slurm).

One packed chunk is one cluster task. Inside it, the chunk runs as a map of its own on
a local pool over the CPUs the task was given (two levels of parallelism)::

    driver: map ──> chunk [start, end) ──> backend.submit(run_packed, ...) ──> array task
    array task: run_packed
      ├─ workers = CPUs given (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE), at most the
      │   CPUs usable here; 1 ──> a thread (the task process's own CPU), more ──> processes;
      │   a task given GPUs gets one worker per GPU instead, each pinned to its GPU
      │   (CUDA_VISIBLE_DEVICES) with an even share of the CPUs as its thread limits
      ├─ inner map over the chunk's items, its finished pieces kept in a sub run
      │   directory: run_dir/packed/<start>-<end>/ (or the task's own directory when the
      │   map has no run_dir), so a task that is requeued or retried resumes there
      └─ the whole chunk written to the run store by the task itself, so chunks that
         finished while the driver was gone count when it resumes; the driver, told
         ``stored=True``, does not write it again

A function that fails on an item is reported as by any backend (the item's index is the
position in the whole input).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela.errors import MapError
from paralela.tasks import HOST, ChunkOutcome, ItemFailure, Job

if TYPE_CHECKING:
    from paralela.resources import Slot

__all__ = ["given_cpus", "given_gpu_slots", "remove_finished_pieces", "run_packed"]


def given_cpus(env: dict[str, str] | None = None) -> int:
    """The CPUs this cluster task was given (1 outside a cluster task)."""
    from paralela.resources import detect_cpus, detect_slurm

    env = dict(os.environ) if env is None else env
    usable = detect_cpus().usable
    slurm = detect_slurm(env)
    if slurm is None:
        return 1
    given = slurm.cpus_per_task or slurm.cpus_on_node or usable
    return max(1, min(given, usable))


def given_gpu_slots(cpus: int) -> list[Slot]:
    """One slot per GPU this cluster task was given, splitting its ``cpus`` among them;
    ``[]`` without GPUs (or outside a cluster task)."""
    from paralela.resources import detect, detect_slurm, make_slots

    if detect_slurm(dict(os.environ)) is None:
        return []
    resources = detect()
    if not resources.gpus:
        return []
    slots = make_slots(resources, gpus_per_slot=1)
    per_slot = max(1, cpus // len(slots))
    return [replace(slot, cpus=slot.cpus[:per_slot] or slot.cpus) for slot in slots]


def _inner_dir(store: Any, start: int, end: int) -> Path | None:
    if store is not None:
        return Path(store.path) / "packed" / f"{start:012d}-{end:012d}"
    task_dir = os.environ.get("PARALELA_TASK_DIR")
    return Path(task_dir) / "map" if task_dir else None


def run_packed(job: Job, start: int, items: Sequence[Any], store: Any) -> ChunkOutcome:
    """Run one packed chunk (input positions ``start``...) inside a cluster task.

    Args:
        job: the map's function, initializer and shared data.
        start: the chunk's first input position.
        items: the chunk's items.
        store: the map's :class:`~paralela.runs.RunStore`, or ``None``.

    Returns:
        The chunk's outcome; ``stored`` is true when the task wrote it to ``store``.

    Raises:
        WorkerDiedError: a local worker died more often than the inner retries allow.
        TaskError: the initializer failed (an item's failure is in the outcome).
    """
    from paralela.backends import Backend, make_backend
    from paralela.mapping._chunking import AutoChunker
    from paralela.mapping._engine import Plan, run
    from paralela.mapping._failures import failure_record
    from paralela.mapping._progress import NullProgress
    from paralela.mapping._summary import MapSummary
    from paralela.runs import RunStore, StoredChunk, digest_items, fingerprint_function

    end = start + len(items)
    done = store.finished().get(start) if store is not None else None
    if done is not None and done.end == end:
        # An earlier run of this task stored the chunk, then was stopped (killed, or a
        # requeue that came late): it is done if it was made from these very items.
        stored_chunk = store.load(done)
        if stored_chunk.input_digest == digest_items(items):
            now = time.time()
            return ChunkOutcome(stored_chunk.results, [], now, now, os.getpid(), HOST, 0, True)
    workers = given_cpus()
    # With GPUs, one worker per GPU, each seeing only its own (CUDA_VISIBLE_DEVICES) and
    # an even share of the task's CPUs as its thread limits.
    gpu_slots = given_gpu_slots(workers)
    if gpu_slots:
        workers = len(gpu_slots)
    inner_dir = _inner_dir(store, start, end)
    inner_store = None
    if inner_dir is not None:
        identity = store.identity if store is not None else {
            "function": fingerprint_function(job.fn)
        }  # fmt: skip
        inner_store = RunStore(inner_dir, identity, {"kind": "packed-chunk", "items": len(items)})
    local: Backend  # the task's own, shut down below
    if gpu_slots:
        local = make_backend("processes", slots=gpu_slots)
    else:
        local = make_backend("processes", workers) if workers > 1 else make_backend("threads", 1)
    plan = Plan(local, job, list(items), len(items), AutoChunker(workers), True, 2,
                inner_store, NullProgress())  # fmt: skip
    results: list[Any] = []
    failures: list[ItemFailure] = []
    started = time.time()
    try:
        for piece in run(plan, MapSummary()):
            results.extend(piece)
    except MapError as exc:
        for task_error in exc.failures:
            failure = failure_record(task_error)
            if failure is not None:
                failures.append(failure.replace(index=start + failure.index))
    except Exception as exc:  # on_error="raise": the item's own exception, or a TaskError
        failure = failure_record(exc)
        if failure is None:
            raise
        failures.append(failure.replace(index=start + failure.index))
    finally:
        local.shutdown(wait=False, cancel_futures=True)
    finished = time.time()
    results.extend([None] * (len(items) - len(results)))
    host, pid = HOST, os.getpid()
    stored = False
    if store is not None and not failures:
        timing = {"started": started, "finished": finished, "worker": str(pid), "host": host,
                  "attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1}  # fmt: skip
        store.write(StoredChunk(start, end, digest_items(items), results, timing))
        stored = True
    if inner_dir is not None and (stored or store is None) and not failures:
        shutil.rmtree(inner_dir, ignore_errors=True)  # its pieces are in the chunk now
        with contextlib.suppress(OSError):  # the last one out removes packed/
            inner_dir.parent.rmdir()
    return ChunkOutcome(results, failures, started, finished, pid, host, 0, stored)


def remove_finished_pieces(store: Any) -> None:
    """Delete ``packed/START-END/`` of chunks the store holds: a task stopped between
    storing its chunk and cleaning up leaves one behind (the driver calls this at the end)."""
    packed = Path(store.path) / "packed"
    if not packed.is_dir():
        return
    finished = store.finished()
    for entry in os.scandir(packed):
        start, _, end = entry.name.partition("-")
        record = finished.get(int(start)) if start.isdigit() else None
        if record is not None and end.isdigit() and int(end) == record.end:
            shutil.rmtree(entry.path, ignore_errors=True)
    with contextlib.suppress(OSError):
        packed.rmdir()
