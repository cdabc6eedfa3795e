"""Model classes for the ``predict`` tests, in a module that workers (local processes and
Slurm tasks) import by name. They are configured by environment variables, which the
workers inherit:

- ``PREDICT_MARKS``: a directory where ``setup`` leaves ``setup-<pid>-<random>`` and each
  ``predict`` call leaves ``batch-<pid>-<random>.json`` (the ids it predicted);
- ``PREDICT_GATE``: a file; a record with ``"hold": true`` waits until it exists;
- ``PREDICT_DIED``: a file; a record with ``"die": true`` kills its worker with SIGKILL
  unless the file exists (it is created first, so the retry goes through).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Any

import pydantic


def _mark(name: str, data: Any) -> None:
    marks = os.environ.get("PREDICT_MARKS")
    if marks:
        path = os.path.join(marks, f"{name}-{os.getpid()}-{uuid.uuid4().hex}")
        with open(path, "w") as f:
            json.dump(data, f)


def _wait_for_gate() -> None:
    gate = os.environ["PREDICT_GATE"]
    deadline = time.monotonic() + 120
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} did not appear in 120 s")
        time.sleep(0.01)


def record_id(record: Any) -> Any:
    """A record's id: ``id`` of a dict, else the record (a text line)."""
    return record["id"] if isinstance(record, dict) else record


def _value(record: Any) -> int:
    """``x`` squared (JSON, Parquet), the length of ``x`` (CSV: a string) or of a line."""
    if not isinstance(record, dict):
        return len(record)
    x = record["x"]
    return x * x if isinstance(x, int) else len(x)


class Marked:
    """Squares ``x`` (or measures a line); each output says its batch's size and first id,
    so that outputs show how the records were batched."""

    def setup(self, device: str) -> None:
        self.device = device
        _mark(
            "setup",
            {
                "device": device,
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            },
        )

    def predict(self, batch: list[Any]) -> list[Any]:
        for record in batch:
            if isinstance(record, dict) and record.get("hold"):
                _wait_for_gate()
            if isinstance(record, dict) and record.get("die"):
                try:
                    fd = os.open(os.environ["PREDICT_DIED"], os.O_CREAT | os.O_EXCL)
                except FileExistsError:
                    pass
                else:
                    os.close(fd)
                    os.kill(os.getpid(), signal.SIGKILL)
        _mark("batch", [record_id(r) for r in batch])
        first = record_id(batch[0])
        return [
            {
                "y": _value(r),
                "n": len(batch),
                "first": first,
                "device": self.device,
            }
            for r in batch
        ]


class Raises:
    def predict(self, batch: list[Any]) -> list[Any]:
        for record in batch:
            if record.get("bad"):
                raise ValueError(f"cannot predict record {record['id']}")
        return [0] * len(batch)


class Short:
    def predict(self, batch: list[Any]) -> list[Any]:
        return batch[1:]


class Interrupting:
    """Sends SIGINT to its parent (the driver, as Ctrl-C would) on a record ``"ctrlc"``."""

    def predict(self, batch: list[Any]) -> list[Any]:
        for record in batch:
            if record.get("ctrlc"):
                os.kill(os.getppid(), signal.SIGINT)
                time.sleep(30)  # the driver stops this worker
        return [record["id"] for record in batch]


class NotAModel:
    def run(self, batch: list[Any]) -> list[Any]:
        return batch


def marks(directory: str | os.PathLike[str], kind: str) -> list[tuple[int, Any]]:
    """The ``(pid, data)`` of each ``kind`` marker ("setup" or "batch") in ``directory``."""
    found = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(kind + "-"):
            with open(os.path.join(directory, name)) as f:
                found.append((int(name.split("-")[1]), json.load(f)))
    return found


def rows(files: list[str]) -> list[dict[str, Any]]:
    """Every row of JSONL or Parquet part files, in file order."""
    out: list[dict[str, Any]] = []
    for path in files:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            out.extend(pq.read_table(path).to_pylist())
        else:
            with open(path, encoding="utf-8") as f:
                out.extend(json.loads(line) for line in f)
    return out


def serial(records_by_shard: list[list[Any]], batch_size: int, device: str) -> list[Any]:
    """The outputs of a serial loop: each shard's records in batches of ``batch_size``
    through one ``Marked`` model."""
    model = Marked.__new__(Marked)
    model.device = device
    outputs: list[Any] = []
    kept = os.environ.pop("PREDICT_MARKS", None)  # the workers' batches are counted, not these
    try:
        for records in records_by_shard:
            for i in range(0, len(records), batch_size):
                outputs.extend(Marked.predict(model, records[i : i + batch_size]))
    finally:
        if kept is not None:
            os.environ["PREDICT_MARKS"] = kept
    return outputs


class Unwritable:
    """Returns a set (which JSON cannot hold) for a record with ``"set": true``, and a
    string instead of a number for one with ``"text": true``."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return [
            {r["id"]} if r.get("set") else str(r["id"]) if r.get("text") else r["id"] for r in batch
        ]


class Item(pydantic.BaseModel):
    id: int
    x: int


class Square(pydantic.BaseModel):
    y: int


class Typed:
    """A model with pydantic input and output models, as ``paralela serve`` takes."""

    input_model = Item
    output_model = Square

    def predict(self, batch: list[Item]) -> list[Square]:
        return [Square(y=item.x * item.x) for item in batch]
