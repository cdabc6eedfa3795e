"""``paralela.predict``: a model class over files, in a swarm of workers that each build
the model once, stream their shards through it and stop when the input is done.

::

    predict(Model, inputs, output=DIR)
      check_model(Model)                         before any worker starts
      plan_splits(inputs) ──> shards             paralela.files' readers: JSONL, text, CSV,
                                                 Parquet; byte ranges / row groups
      backend: processes ── make_backend(slots=make_slots(...)): one worker per slot,
               │            pinned (CUDA_VISIBLE_DEVICES = its GPU, or "" on CPU slots)
               ├ sequential  the driver itself (pdb works)
               └ slurm       array tasks, each a local pool over the CPUs/GPUs it got
      imap(predict_shard, shards, chunksize=1)   retries, Ctrl-C, progress, run store
        run_dir/shards/                          one record per finished shard: resume
      ──> output/part-NNNNN.<ext> per shard, _SUCCESS last ──> PredictResult
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paralela._config import UNSET, resolve
from paralela.backends import Backend
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    RunStoreError,
    WorkerDiedError,
    add_note,
)
from paralela.serving._model import check_model, model_name
from paralela.serving._predict_output import FORMATS, part_path
from paralela.serving._predict_task import PredictJob, ShardResult, predict_shard
from paralela.tasks import TaskFailed

__all__ = ["BACKENDS", "PredictResult", "predict"]

#: Backends ``predict`` runs on: one model per worker process (threads would share one).
BACKENDS = ("processes", "sequential", "slurm")
#: Shards per worker at least, where the input allows (files are cut finer than
#: ``split_bytes`` for it, down to ``MIN_SHARD_BYTES``): a worker done early takes another
#: shard while a slow one finishes, and a resumed run loses at most a shard per worker.
SHARDS_PER_WORKER = 4
#: The smallest shard cut from a file (mapreduce's floor, 256 KiB, is for records that
#: cost microseconds). A model spends milliseconds per record: 16 KiB of sentences is
#: ~300 records, about a second of a small model. With mapreduce's floor, 20,000
#: sentences (1.6 MB) made 7 shards for 2 workers and one idled for a shard's time at the
#: end (bench_predict.py).
MIN_SHARD_BYTES = 16 * 1024


@dataclass
class PredictResult:
    """What a ``predict`` call did.

    Attributes:
        output: the output directory.
        files: the part files, one per shard, in shard (input) order.
        records: records predicted, in all shards (reused ones included).
        records_computed: records predicted by this call.
        shards: shards of the input.
        shards_reused: shards finished by an earlier call with the same ``run_dir``.
        seconds: wall time of the call.
        retries: shards run again after their worker died.
        workers: workers the backend ran.
        devices: the devices this call's shards ran on (``"cpu"``, ``"cuda:0"`` in a
            worker pinned to one GPU), with how many shards each.
    """

    output: Path
    files: list[str]
    records: int
    records_computed: int
    shards: int
    shards_reused: int
    seconds: float
    retries: int
    workers: int
    devices: dict[str, int] = field(default_factory=dict)

    @property
    def records_per_second(self) -> float:
        """Records this call predicted per second of its wall time."""
        return self.records_computed / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        reused = f" ({self.shards_reused} reused)" if self.shards_reused else ""
        on = ", ".join(f"{d} x{n}" for d, n in sorted(self.devices.items()))
        return (
            f"{self.records} records in {self.shards} shards{reused}, {self.seconds:.2f} s, "
            f"{self.records_per_second:,.0f} records/s; {self.workers} workers"
            + (f"; shards on {on}" if on else "")
            + f"; {self.retries} retried"
        )


def predict(
    model: type,
    inputs: Any,
    *,
    output: str | os.PathLike[str],
    batch_size: int = 32,
    workers: int | Any | None = UNSET,
    backend: str | Any = UNSET,
    backend_options: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    output_format: str = "jsonl",
    mode: str = "errorifexists",
    input_format: str | None = None,
    progress: bool | Any | None = UNSET,
    keep_input: bool = True,
    gpus: str | Sequence[str | int] | None = None,
    workers_per_gpu: int = 1,
    split_bytes: int | str = 16 << 20,
    records_per_split: int = 10_000,
    encoding: str = "utf-8",
    retries: int | Any = UNSET,
) -> PredictResult:
    """Run ``model`` over every record of ``inputs``; write the outputs to ``output``.

    Each worker builds the model once (``Model()`` then ``setup(device)``) and keeps it
    for every shard it runs; a shard's records go through ``predict`` in batches of
    ``batch_size``, in order, and its rows are written to one part file, atomically.

    Args:
        model: a class with ``predict(self, batch) -> list`` and optionally
            ``setup(self, device)`` (see :func:`paralela.serving.check_model`).
        inputs: a path, glob, directory or a list of them (text lines, ``.jsonl``,
            ``.csv``, ``.parquet``; gzip too), or an iterable of records. Each split
            of a file (a byte range or a range of row groups) is a shard.
        output: directory for ``part-NNNNN.jsonl`` (or ``.parquet``), one per shard,
            and ``_SUCCESS``. Each row holds ``shard``, ``row`` (position in the shard),
            ``input`` (the record, unless ``keep_input=False``) and ``output``.
        batch_size: records per ``predict`` call (a shard's last batch may be smaller).
        workers: worker processes (default: one per GPU times ``workers_per_gpu``, or
            one per CPU without GPUs); for ``backend="slurm"`` the most array tasks.
        backend: ``"processes"`` (default; each worker pinned to a slot of this
            machine), ``"sequential"`` (the calling process: pdb works) or ``"slurm"``.
        backend_options: Slurm options (``slurm_partition``, ``gpus_per_task``, ...).
        run_dir: keeps each finished shard; running again with it predicts only the
            shards not finished (after a crash, a kill or Ctrl-C).
        output_format: ``"jsonl"`` or ``"parquet"``.
        mode: what to do when ``output`` holds files paralela did not write:
            ``"errorifexists"`` refuses them (a :class:`ConfigError` naming a few, as
            Spark's default save mode); ``"overwrite"`` deletes them first. A run into
            paralela's own earlier output replaces only the files paralela recorded
            there as its own (a ``run_dir`` rerun keeps its finished shards' parts).
        input_format: ``"text"``, ``"jsonl"``, ``"csv"`` or ``"parquet"`` for every
            file; default from each file's extension.
        progress: a progress bar of shards (default: on a terminal).
        keep_input: write each record next to its output.
        gpus: the GPUs to use (``"0,2"``), or ``"none"`` for CPUs only; default all
            visible. Processes backend only.
        workers_per_gpu: workers sharing each GPU (small models).
        split_bytes: the most bytes of a file per shard (int or ``"16MB"``); ``0``:
            one shard per file.
        records_per_split: records of an iterable input per shard.
        encoding: of text, JSONL and CSV inputs.
        retries: times a shard is run again when its worker dies (default 2).

    Returns:
        A :class:`PredictResult`: records, shards, shards reused, seconds, records/s,
        and the part files.

    Raises:
        ConfigError: a bad class or option, or ``output`` holds files paralela did not
            write (``mode="errorifexists"``), before any worker starts.
        InputError: an input is missing, unreadable or malformed (names file and line).
        ModelError: the model's ``setup`` or ``predict`` raised (its exception is the
            cause), or ``predict`` returned the wrong number of outputs or outputs the
            format cannot hold; names the model, the shard, its file and lines.
        WorkerDiedError: a shard's worker died more often than ``retries`` allows.
        FingerprintMismatchError: ``run_dir`` was made for another model, input or output.

    On Ctrl-C or an error, the shards in flight are stopped (their workers killed) and
    their temporary files removed; finished shards stay in ``run_dir`` for the next call.
    """
    from paralela.files import check_mode, parse_split_bytes

    started = time.perf_counter()
    check_model(model)
    name = model_name(model)
    _check_options(batch_size, output_format, keep_input, workers_per_gpu)
    check_mode(mode)
    split_size = parse_split_bytes(split_bytes)  # 0: one shard per file
    backend_name, n_workers = _resolve_backend(backend, workers, gpus, workers_per_gpu)
    out = Path(output)
    backend_obj, owns, device = _backend(backend_name, n_workers, backend_options, gpus,
                                         workers_per_gpu)  # fmt: skip
    try:
        effective = backend_obj.effective_workers()
        splits = _plan(inputs, input_format, split_size, effective, records_per_split, encoding)
        _claim_output(out, mode, output_format, splits)
        job = PredictJob(model, uuid.uuid4().hex, batch_size, str(out.resolve()),
                         output_format, keep_input, device)  # fmt: skip
        store, key = _open_run_dir(run_dir, name, model, splits, job)
        iterator = _shards(job, splits, backend_obj, retries, store, key, progress)
        results = _collect(iterator, out)
        return _finish(out, job, name, results, iterator.summary, effective, started)
    finally:
        _release(backend_obj, owns, device)


def _resolve_backend(backend: Any, workers: Any, gpus: Any, per_gpu: int) -> tuple[str, Any]:
    """The backend's name and the workers asked for (argument, config, environment),
    checked: predict runs on processes, sequential or Slurm; GPUs are this machine's."""
    backend_name = resolve("backend", backend, "processes")
    if backend_name not in BACKENDS:
        raise ConfigError(
            f"predict runs on backend 'processes', 'sequential' or 'slurm', not "
            f"{backend_name!r}: each worker process holds its own model (threads would "
            "share one)."
        )
    n_workers = resolve("workers", workers, None)
    if backend_name != "processes" and (gpus is not None or per_gpu != 1):
        raise ConfigError(
            "gpus= and workers_per_gpu= choose this machine's GPUs (backend='processes'); "
            "on Slurm ask for GPUs with backend_options={'gpus_per_task': N}."
        )
    return backend_name, n_workers


def _plan(
    inputs: Any,
    input_format: str | None,
    split_size: int,
    workers: int,
    records_per_split: int,
    encoding: str,
) -> list[Any]:
    """The shards: at least ``SHARDS_PER_WORKER`` per worker where the input allows."""
    from paralela.files import plan_splits

    return list(
        plan_splits(
            inputs,
            format=input_format,
            split_bytes=split_size,
            min_splits=SHARDS_PER_WORKER * workers,
            records_per_split=records_per_split,
            encoding=encoding,
            min_split_bytes=min(MIN_SHARD_BYTES, split_size),
        )
    )


def _claim_output(out: Path, mode: str, fmt: str, splits: list[Any]) -> None:
    """Before any shard runs: refuse (or empty) an ``out`` holding others' files, and
    list the parts as paralela's before the first is written (a rerun after a crash
    knows them); a former _SUCCESS, which must not vouch for them, is removed."""
    from paralela.files import check_output_dir, claim_output_dir

    check_output_dir(out, mode)
    claim_output_dir(out, [part_path(out, s.index, fmt).name for s in splits])


def _shards(
    job: PredictJob,
    splits: list[Any],
    backend: Backend,
    retries: Any,
    store: Any,
    key: Any,
    progress: Any,
) -> Any:
    """The map over the shards, unordered, one shard a chunk, resumable through ``store``."""
    from paralela.mapping import imap

    task = functools.partial(predict_shard, job)
    task.__name__ = "shards"  # type: ignore[attr-defined]  # the progress bar's label
    return imap(
        task,
        splits,
        backend=backend,
        chunksize=1,
        ordered=False,
        retries=retries,
        run_dir=store,
        fingerprint=key,
        progress=progress,
    )


def _collect(iterator: Any, out: Path) -> list[ShardResult]:
    """Every shard's result. On the way out of an error (the shards in flight were
    stopped) the parts whose writing was cut short are removed; a failed shard raises
    the user's own exception, a worker that died is a WorkerDiedError with a hint."""
    from paralela.files import remove_own_temporaries

    results: list[ShardResult] = []
    try:
        try:
            for shard in iterator:
                results.append(shard)
        except BaseException:  # the shards in flight were stopped on the way out
            remove_own_temporaries(out)  # parts whose writing was cut short
            raise
    except TaskFailed as failed:
        raise failed.reraise()  # noqa: B904  (its cause is the user's exception)
    except WorkerDiedError as died:
        add_note(
            died,
            "paralela: an item here is a shard (item N: part-N); its worker died each "
            "time it ran it. Look for a record that needs more memory than a worker has, "
            "or lower batch_size.",
        )
        raise
    return results


def _release(backend: Backend, owns: bool, device: str | None) -> None:
    """Stop a backend made for this call; free the model a sequential run built here."""
    if owns:
        backend.shutdown(wait=False, cancel_futures=True)
    if device is not None:
        from paralela.serving._predict_task import release_model

        release_model()


def _check_options(batch_size: Any, fmt: Any, keep_input: Any, per_gpu: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if fmt not in FORMATS:
        raise ConfigError(f"output_format must be 'jsonl' or 'parquet', got {fmt!r}.")
    if not isinstance(keep_input, bool):
        raise ConfigError(f"keep_input must be True or False, got {keep_input!r}.")
    if isinstance(per_gpu, bool) or not isinstance(per_gpu, int) or per_gpu < 1:
        raise ConfigError(f"workers_per_gpu must be a positive integer, got {per_gpu!r}.")


def _backend(
    name: str,
    workers: Any,
    options: Mapping[str, Any] | None,
    gpus: str | Sequence[str | int] | None,
    per_gpu: int,
) -> tuple[Backend, bool, str | None]:
    """The backend, whether this call owns it, and the device of a sequential run.

    Processes: a pool of its own, worker ``i`` pinned to slot ``i`` (``make_slots``):
    its ``CUDA_VISIBLE_DEVICES`` names the slot's GPU (``""`` on a CPU slot) and its
    thread limits are the slot's CPUs, set before the worker starts.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):  # fmt: skip
        raise ConfigError(f"workers must be a positive integer, got {workers!r}.")
    if name == "slurm":
        from paralela.backends import get_backend

        return get_backend("slurm", workers, options), False, None
    if options:
        raise ConfigError(
            f"backend_options are options of backend='slurm'; backend={name!r} takes none."
        )
    from paralela.backends import make_backend

    if name == "sequential":
        from paralela.serving._predict_task import worker_device

        if workers not in (None, 1):
            raise ConfigError("backend='sequential' runs one worker: leave workers unset.")
        return make_backend("sequential", 1), True, worker_device()
    from paralela.serving._slots import worker_slots

    return make_backend("processes", slots=worker_slots(workers, gpus, per_gpu)), True, None


def _open_run_dir(
    run_dir: str | os.PathLike[str] | None,
    name: str,
    model: type,
    splits: list[Any],
    job: PredictJob,
) -> tuple[Path | None, str | None]:
    """The map store under ``run_dir`` and its key, after checking that ``run_dir`` was
    made for this model, input and output (or is new).

    Raises:
        FingerprintMismatchError: it was made for another model (names the code that
            changed), other inputs, another batch size or another output.
    """
    if run_dir is None:
        return None, None
    from paralela.files import input_identity
    from paralela.runs import RunStore, describe_changes, digest_bytes, fingerprint_function

    path = Path(run_dir)
    identity = {
        "model": fingerprint_function(model),
        "inputs": input_identity(splits),
        "batch_size": str(job.batch_size),
        "output": f"{job.fmt}:{job.output}:{'input' if job.keep_input else 'no input'}",
    }
    try:
        RunStore(path, identity, {"kind": "predict", "model": name, "shards": len(splits)})
    except FingerprintMismatchError:
        manifest = json.loads((path / "manifest.json").read_text())
        theirs = manifest.get("identity", {})
        changes = []
        for key, ours in identity.items():
            if theirs.get(key) == ours:
                continue
            detail = ""
            deps = manifest.get("dependencies", {}).get(key)
            if isinstance(deps, dict) and hasattr(ours, "dependencies"):
                found = describe_changes(deps, ours.dependencies)
                detail = f" ({found})" if found else ""
            what = {
                "model": f"the model {name}",
                "inputs": "the inputs (files, their sizes or times, or the splitting)",
                "batch_size": f"batch_size (was {theirs.get(key)}, now {ours})",
                "output": "the output directory or format",
            }[key]
            changes.append(what + detail)
        raise FingerprintMismatchError(
            f"The run directory {path} belongs to another prediction: "
            f"{'; '.join(changes) or 'its manifest'} changed since it was made. Resuming "
            "would mix outputs. Pass a new run_dir= to start afresh, or delete the "
            "directory if its results are no longer wanted."
        ) from None
    key = digest_bytes(json.dumps(identity, sort_keys=True).encode())
    return path / "shards", key


def _finish(
    out: Path,
    job: PredictJob,
    name: str,
    results: list[ShardResult],
    summary: Any,
    workers: int,
    started: float,
) -> PredictResult:
    from paralela.files import remove_own_temporaries, remove_stale
    from paralela.serving._predict_output import type_empty_parts, write_success

    fmt = job.fmt

    results.sort(key=lambda r: r.shard)
    for r in results:
        if not os.path.exists(r.path):
            raise RunStoreError(
                f"The part file {r.path} of shard {r.shard} is gone, though the run "
                "directory records it as written. Delete the run directory and run again."
            )
    files = [r.path for r in results]
    remove_own_temporaries(out)
    remove_stale(out, [Path(f).name for f in files])
    if fmt == "parquet":
        type_empty_parts(files, [r.records for r in results])
    parts = [
        {"shard": r.shard, "file": Path(r.path).name, "records": r.records, "source": r.source}
        for r in results
    ]
    write_success(out, fmt, name, parts)
    computed = [r for r in results if r.token == job.token]
    devices: dict[str, int] = {}
    for r in computed:
        devices[r.device] = devices.get(r.device, 0) + 1
    return PredictResult(
        output=out,
        files=files,
        records=sum(r.records for r in results),
        records_computed=sum(r.records for r in computed),
        shards=len(results),
        shards_reused=summary.resumed_items,
        seconds=time.perf_counter() - started,
        retries=summary.retries,
        workers=workers,
        devices=devices,
    )
