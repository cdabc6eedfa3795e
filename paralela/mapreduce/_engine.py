"""The local engine: a MapReduce job as two ``paralela.imap`` phases over one backend.

::

    inputs ──plan_splits──> splits ──group_splits──> map tasks (small splits joined)
      ──imap(run_map_task)──> per task: segments per partition
                              (a dead worker's task is submitted again by imap, as for any map)
    segments regrouped by partition ──imap(run_reduce_task)──> one part file per partition
    parts ──> MapReduceResult (lazy)  |  output=: part-NNNNN.<ext> + _SUCCESS

    job directory: run_dir/ (kept, resumable) or a temporary directory (removed at the
    end, on error and on Ctrl-C; without output= it lives as long as the result)
      manifest.json   what the job is: inputs, mapper, combiner, reducer, partitions, output
      map/            imap's run store: one record per finished map task (its segments)
      reduce/         the same per finished reduce partition
      spills/         the map tasks' sorted spill files (removed once the job is done)
      parts/          the result's part files when output= is not given

Running again with the same ``run_dir`` reads the finished tasks' records instead of
running them: a job killed in the map phase redoes only the map tasks not recorded, one
killed in the reduce phase redoes only the partitions not written. Retries, progress
bars, cancelling on error or Ctrl-C, and Slurm's array jobs all come from ``imap``;
nothing here talks to workers.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela._files import make_dirs
from paralela.backends import Backend
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    MapReduceError,
    WorkerDiedError,
    add_note,
)
from paralela.mapping import imap
from paralela.mapreduce._output import (
    Part,
    claim_output_dir,
    remove_own_temporaries,
    remove_stale_parts,
    remove_temporaries,
    type_empty_parquet_parts,
    write_success,
)
from paralela.mapreduce._result import MapReduceResult, MapReduceSummary
from paralela.mapreduce._tasks import (
    MapJob,
    MapTaskResult,
    ReduceJob,
    ReduceTask,
    ReduceTaskResult,
    run_map_task,
    run_reduce_task,
)
from paralela.runs import RunStore, describe_changes, digest_bytes, fingerprint_function
from paralela.tasks import TaskFailed

__all__ = ["LocalJob", "run_local"]


@dataclass
class LocalJob:
    """A validated job for the local engine (see :func:`paralela.mapreduce`)."""

    mapper: Callable[[Any], Any]
    reducer: Callable[[Any, Iterator[Any]], Any]
    combiner: Callable[[Any, Iterator[Any]], Any] | None
    tasks: Iterable[tuple[Any, ...]]  # the splits of each map task (_inputs.group_splits):
    # a list, or an iterator pulled lazily by the map phase
    partitions: int
    backend: Backend
    memory_limit: int
    run_dir: Path | None
    output: Path | None
    output_format: str
    retries: Any
    progress: Any
    summary: MapReduceSummary
    started: float  # time.perf_counter() when the call began
    batched: bool = False  # the mapper takes a list of records


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Name a task function for imap's progress bar and run manifest."""
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def identity_of(job: LocalJob, input_identity: str) -> dict[str, str]:
    """What a run directory must have been made for to be resumed by ``job``."""
    output = "none" if job.output is None else f"{job.output_format}:{job.output.resolve()}"
    return {
        "inputs": input_identity,
        "mapper": _function_identity(job.mapper) + (" (batched)" if job.batched else ""),
        "combiner": "none" if job.combiner is None else _function_identity(job.combiner),
        "reducer": _function_identity(job.reducer),
        "partitions": str(job.partitions),
        "output": output,
    }


def _function_identity(fn: Any) -> str:
    """A function's fingerprint; a command's (``_streaming``) own identity: its command
    line and the contents of the scripts it names."""
    from paralela.mapreduce._streaming import CommandMapper, CommandReducer

    if isinstance(fn, (CommandMapper, CommandReducer)):
        return fn.identity()
    return fingerprint_function(fn)


def open_run_dir(path: Path, identity: dict[str, str], describe: dict[str, Any]) -> RunStore:
    """The job's run directory, checked against ``identity``.

    Raises:
        FingerprintMismatchError: it was made for other inputs, functions, partitions or
            output; the message names what changed (and, for a function, which code).
        RunStoreError: it cannot be made or read.
    """
    try:
        return RunStore(path, identity, describe)
    except FingerprintMismatchError:
        pass
    manifest = json.loads((path / "manifest.json").read_text())
    theirs: dict[str, str] = manifest.get("identity", {})
    recorded = manifest.get("dependencies", {})
    changes = []
    for key in identity:
        if theirs.get(key) == identity[key]:
            continue
        ours = identity[key]
        detail = ""
        deps = recorded.get(key) if isinstance(recorded, dict) else None
        if isinstance(deps, dict) and hasattr(ours, "dependencies"):
            found = describe_changes(deps, ours.dependencies)
            detail = f" ({found})" if found else ""
        what = {
            "inputs": "the inputs (files, their sizes or times, or the splitting)",
            "partitions": f"partitions (was {theirs.get(key)}, now {ours})",
            "output": "the output directory or format",
        }.get(key, f"the {key}")
        changes.append(what + detail)
    raise FingerprintMismatchError(
        f"The run directory {path} belongs to another MapReduce job: "
        f"{'; '.join(changes) or 'its manifest'} changed since it was made "
        f"(on {manifest.get('created', '?')}). Resuming would mix results. Pass a new "
        "run_dir= to start afresh, or delete the directory if its results are no longer "
        "wanted."
    )


def run_local(job: LocalJob) -> MapReduceResult:
    """Run ``job`` on its backend; see the module docstring.

    Raises:
        UserFunctionError: the mapper, combiner or reducer raised (the user's exception
            is ``__cause__``) or the mapper yielded something that is not a pair.
        InputError: an input cannot be read (names the file and line).
        WorkerDiedError: a task's worker died more often than ``retries`` allows.
        FingerprintMismatchError: ``run_dir`` belongs to another job.
        MapReduceError: spill or result files cannot be written.

    On Ctrl-C or an error, the tasks in flight are stopped and the temporary directory
    is removed; a ``run_dir`` keeps what finished, for the next run to resume.
    """
    from paralela.files import input_identity

    summary = job.summary
    t0 = time.perf_counter()
    temporary: str | None = None
    spill_dir: Path | None = None
    keep_temporary = False
    try:
        if job.run_dir is not None:
            job.tasks = list(job.tasks)  # the identity covers every split, and the tasks
            splits = [split for task in job.tasks for split in task]
            layout = ",".join(str(len(task)) for task in job.tasks)
            identity = identity_of(job, f"{input_identity(splits)} tasks {layout}")
            open_run_dir(
                job.run_dir,
                identity,
                {"kind": "mapreduce", "function_name": getattr(job.mapper, "__qualname__", "?")},
            )
            home = job.run_dir
            key: str | None = digest_bytes(json.dumps(identity, sort_keys=True).encode())
        else:
            temporary = tempfile.mkdtemp(prefix="paralela-mapreduce-")
            home = Path(temporary)
            key = None
        spill_dir = home / "spills"
        parts_dir = job.output if job.output is not None else home / "parts"
        if job.output is not None:  # checked by the API: it holds paralela's files only
            # Lists the parts this job writes, so that a rerun after a crash knows them
            # as paralela's; removes a former _SUCCESS, which must not vouch for them.
            claim_output_dir(job.output, job.partitions, job.output_format)
        make_dirs(spill_dir)
        make_dirs(parts_dir)
        summary.plan_seconds += time.perf_counter() - t0

        t_map = time.perf_counter()
        mapped = _map_phase(job, str(spill_dir), key)
        summary.map_seconds = time.perf_counter() - t_map

        t_reduce = time.perf_counter()
        parts = _reduce_phase(job, mapped, str(parts_dir), key)
        summary.reduce_seconds = time.perf_counter() - t_reduce

        summary.keys = sum(p.pairs for p in parts)
        if job.output is not None:
            remove_stale_parts(job.output, [p.path for p in parts])
            type_empty_parquet_parts(parts)
            write_success(job.output, parts)
        shutil.rmtree(spill_dir, ignore_errors=True)
        keep_temporary = job.output is None
        summary.wall_seconds = time.perf_counter() - job.started
        return MapReduceResult(
            parts,
            summary,
            output=job.output is not None,
            cleanup_dir=temporary if keep_temporary else None,
        )
    except TaskFailed as failed:
        _remove_cut_short(job, spill_dir)
        raise failed.reraise()  # noqa: B904  (its __cause__ is the user's exception)
    except BaseException:
        _remove_cut_short(job, spill_dir)
        raise
    finally:
        if temporary is not None and not keep_temporary:
            shutil.rmtree(temporary, ignore_errors=True)


def _remove_cut_short(job: LocalJob, spill_dir: Path | None) -> None:
    """Remove the temporary files of spills and parts whose writing a stopped task cut
    short (a worker killed mid-write when another task failed, a full disk, Ctrl-C)."""
    if job.output is not None and job.output.is_dir():
        remove_own_temporaries(job.output)  # never a temp-like file of someone else's
    if spill_dir is not None and spill_dir.is_dir():
        remove_temporaries(spill_dir)


def _imap_options(job: LocalJob, run_dir: Path | None, key: str | None) -> dict[str, Any]:
    return {
        "backend": job.backend,
        "chunksize": 1,
        "ordered": False,
        "retries": job.retries,
        "run_dir": run_dir,
        "fingerprint": key,
        "progress": job.progress,
    }


def _map_phase(job: LocalJob, spill_dir: str, key: str | None) -> list[MapTaskResult]:
    summary = job.summary
    task = _named(
        functools.partial(
            run_map_task,
            MapJob(
                job.mapper,
                job.combiner,
                job.partitions,
                spill_dir,
                job.memory_limit,
                job.batched,
            ),
        ),
        "map tasks",
    )
    store = None if job.run_dir is None else job.run_dir / "map"
    iterator = imap(task, job.tasks, **_imap_options(job, store, key))
    results: list[MapTaskResult] = []
    try:
        for result in iterator:
            results.append(result)
            summary.splits += result.splits
            summary.records += result.records
            summary.pairs_emitted += result.pairs_in
            summary.pairs_after_combining += result.pairs_out
            summary.spills += result.spills
            summary.bytes_shuffled += result.bytes_spilled
            summary.peak_buffer_bytes = max(summary.peak_buffer_bytes, result.peak_buffer_bytes)
    except WorkerDiedError as died:
        _name_tasks(died, "map task", "split")
        raise
    finally:
        summary.map_tasks = iterator.summary.items
        summary.map_tasks_reused = iterator.summary.resumed_items
        summary.retries += iterator.summary.retries
    results.sort(key=lambda r: r.split)
    return results


def _reduce_phase(
    job: LocalJob, mapped: Iterable[MapTaskResult], parts_dir: str, key: str | None
) -> list[Part]:
    summary = job.summary
    by_partition: list[list[tuple[str, int, int]]] = [[] for _ in range(job.partitions)]
    for result in mapped:
        for partition, segments in result.segments.items():
            by_partition[partition].extend(segments)
    tasks = [ReduceTask(p, tuple(segs)) for p, segs in enumerate(by_partition)]
    fmt = job.output_format if job.output is not None else "pickle"
    task = _named(
        functools.partial(run_reduce_task, ReduceJob(job.reducer, job.combiner, parts_dir, fmt)),
        "reduce tasks",
    )
    store = None if job.run_dir is None else job.run_dir / "reduce"
    iterator = imap(task, tasks, **_imap_options(job, store, key))
    parts: list[Part] = []
    try:
        for result in iterator:
            parts.append(_checked(result))
    except WorkerDiedError as died:
        _name_tasks(died, "reduce task", "partition")
        raise
    finally:
        summary.reduce_tasks = len(tasks)
        summary.reduce_tasks_reused = iterator.summary.resumed_items
        summary.retries += iterator.summary.retries
    parts.sort(key=lambda p: p.partition)  # they arrive as they finish
    return parts


def _name_tasks(died: WorkerDiedError, task: str, what: str) -> None:
    """Say what the items of a :class:`WorkerDiedError` are: map or reduce tasks."""
    if died.indices:
        add_note(
            died,
            f"paralela: an item here is a {task} (item N: {what} N); its worker died each "
            "time it ran. Look for a record or key that needs more memory than a worker "
            "has, or lower memory_limit.",
        )


def _checked(result: ReduceTaskResult) -> Part:
    """A reduce task's part, which must still be there (a resumed task's file too)."""
    if not os.path.exists(result.part.path):
        raise MapReduceError(
            f"The result file {result.part.path} of partition {result.part.partition} is "
            "gone, though the run directory records it as written. Delete the run "
            "directory and run again to compute the job anew."
        )
    return result.part


def require_shared_run_dir(backend: Backend, run_dir: Path | None) -> None:
    """On a backend whose tasks run on other hosts (Slurm), spill files must be on a
    filesystem every node sees: the run directory.

    Raises:
        ConfigError: no ``run_dir`` was given for such a backend.
    """
    if backend.capabilities.packs_tasks and run_dir is None:
        raise ConfigError(
            f"MapReduce on the {backend.capabilities.name} backend needs run_dir= on a "
            "filesystem every node of the cluster sees (your home or project directory): "
            "map tasks write their spill files there and reduce tasks on other nodes read "
            "them. Pass run_dir='runs/wordcount', for example."
        )
