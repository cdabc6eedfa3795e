"""What runs in a ``predict`` worker: one shard through the model, into one part file.

::

    predict_shard(job, split)                      (a map item: one shard per call)
      model ── cached per process: built and set up once per worker and call of predict
      read_split_batches(split) ──> batches of job.batch_size records (never across shards)
        ──> LoadedModel.predict(batch) ──> ShardWriter rows ──> temp file
      rename ──> part-NNNNN.<ext>                  (a killed worker leaves a temp file only)
      ──> ShardResult (records, file, device)      (map's run store keeps it: resume)

Failures travel as :class:`paralela.tasks.TaskFailed` (the model's or the input's error,
with the record range and its file and lines) and are raised again as that error in the
driver.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from paralela.errors import InputError
from paralela.files import Split, locate, read_split_batches
from paralela.serving._model import LoadedModel, ModelError
from paralela.serving._predict_output import ShardWriter, part_path
from paralela.tasks import carry as _failed

__all__ = ["PredictJob", "ShardResult", "predict_shard", "worker_device"]

_lock = threading.Lock()
# (the call's token, the model built for it): one model per process at a time.
_loaded: tuple[str, LoadedModel] | None = None


@dataclass(frozen=True)
class PredictJob:
    """What every shard of one ``predict`` call shares (sent once per worker).

    ``token`` is unique to the call: a worker pool reused by a later call builds that
    call's model instead of keeping the former one. ``device`` is set where the driver
    runs the shards itself (the sequential backend); else each worker finds its own.
    """

    model: type
    token: str
    batch_size: int
    output: str
    fmt: str
    keep_input: bool
    device: str | None = None


@dataclass(frozen=True)
class ShardResult:
    """One finished shard: its part file, records, and where and how fast it ran."""

    shard: int
    path: str
    records: int
    source: str
    seconds: float
    device: str
    host: str
    pid: int
    token: str  # the call that computed it (a shard read back from run_dir has an older one)


def worker_device(env: dict[str, str] | None = None) -> str:
    """The device this process's model runs on, as torch names it.

    ``CUDA_VISIBLE_DEVICES`` decides (a local worker's slot sets it; Slurm sets it for a
    task given GPUs): empty (or ``-1``) is ``"cpu"``, a GPU is ``"cuda:0"``, the first
    (in a slot, the only) GPU this process sees. Unset inside a Slurm job: ``"cpu"``
    (the job was given no GPU; others may be visible but are not ours). Unset elsewhere:
    ``"cuda:0"`` when a GPU is visible, else ``"cpu"``.
    """
    env = dict(os.environ) if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        return "cpu" if first in ("", "-1", "NoDevFiles") else "cuda:0"
    if "SLURM_JOB_ID" in env:
        return "cpu"
    from paralela.resources import detect_gpus

    return "cuda:0" if detect_gpus(env).gpus else "cpu"


def _model(job: PredictJob) -> LoadedModel:
    global _loaded
    with _lock:
        if _loaded is None or _loaded[0] != job.token:
            _loaded = None  # let the former call's model go before building this one
            device = job.device if job.device is not None else worker_device()
            _loaded = (job.token, LoadedModel(job.model, device))
        return _loaded[1]


def release_model() -> None:
    """Drop this process's model (the driver calls it after a sequential run)."""
    global _loaded
    with _lock:
        _loaded = None


def batches(blocks: Iterable[list[Any]], size: int) -> Iterator[list[Any]]:
    """The records of ``blocks`` regrouped into lists of ``size`` (the last may be shorter)."""
    carry: list[Any] = []
    for block in blocks:
        start = 0
        if carry:
            start = size - len(carry)
            carry.extend(block[:start])
            if len(carry) < size:
                continue
            yield carry
            carry = []
        stop = len(block) - (len(block) - start) % size
        for i in range(start, stop, size):
            yield block[i : i + size]
        carry = block[stop:]
    if carry:
        yield carry


def describe_records(split: Split, first: int, last: int) -> str:
    """``"records 8-15 of shard 3 (data/a.jsonl lines 12-19)"``: where records
    ``first..last`` of a shard come from (re-reads the shard: for error messages only)."""
    start, end = locate(split, first), locate(split, last)
    head, sep, line = start.rpartition(" line ")
    head_end, sep_end, line_end = end.rpartition(" line ")
    if sep and sep_end and head == head_end:
        where = f"{head} line {line}" if line == line_end else f"{head} lines {line}-{line_end}"
    else:
        where = start if start == end else f"{start} to {end}"
    records = f"record {first}" if first == last else f"records {first}-{last}"
    return f"{records} of shard {split.index} ({where})"


def _validated(
    schema: Any, batch: list[Any], first: int, where: Callable[[int, int], str]
) -> list[Any]:
    """The batch's records as instances of the model's ``input_model`` (a pydantic model),
    as ``paralela serve`` hands them to ``predict``.

    Raises:
        InputError: a record does not fit the model (names the record, file and line).
    """
    from pydantic import ValidationError

    out = []
    for offset, record in enumerate(batch):
        try:
            out.append(schema.model_validate(record))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'the record'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            raise InputError(
                f"{where(first + offset, first + offset)}: the record does not fit the "
                f"model's input_model {schema.__name__} ({problems}); fix the record, or "
                "the input_model",
            ) from exc
    return out


def predict_shard(job: PredictJob, split: Split) -> ShardResult:
    """Predict every record of ``split`` in batches of ``job.batch_size``, in order, and
    write the rows to the shard's part file atomically.

    Raises:
        TaskFailed: the model failed to set up, its ``predict`` raised or returned the
            wrong number of outputs or outputs the format cannot hold (a
            :class:`ModelError` naming the model, the shard, its file and lines), or the
            shard cannot be read (an :class:`InputError` naming the file and line).
    """
    from paralela._files import replacing
    from paralela.files import temp_prefix

    started = time.perf_counter()
    try:
        model = _model(job)
    except ModelError as exc:
        raise _failed(
            ModelError(f"{exc} (while starting on shard {split.index}: {split.describe()})"),
            exc.__cause__,
        ) from None
    path = part_path(job.output, split.index, job.fmt)
    records = 0

    def where(first: int, last: int) -> str:
        return describe_records(split, first, last)

    try:
        with replacing(path, temp_prefix(job.output)) as f:
            writer = ShardWriter(f, job.fmt, split.index, job.keep_input, model.name, where)
            schema = getattr(job.model, "input_model", None)
            for batch in batches(read_split_batches(split), job.batch_size):
                given = batch if schema is None else _validated(schema, batch, records, where)
                try:
                    outputs = model.predict(given)
                except ModelError as exc:
                    at = where(records, records + len(batch) - 1)
                    message = f"{str(exc).rstrip('.')}; the batch was {at}."
                    raise _failed(ModelError(message), exc.__cause__) from None
                writer.add(batch, outputs)
                records += len(batch)
            writer.close()
    except ModelError as exc:  # an output the format cannot hold
        raise _failed(exc, exc.__cause__) from None
    except InputError as exc:
        raise _failed(exc, None) from None
    return ShardResult(
        split.index,
        str(path),
        records,
        split.describe(),
        time.perf_counter() - started,
        model.device,
        socket.gethostname(),
        os.getpid(),
        job.token,
    )
