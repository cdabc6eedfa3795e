"""The predict step of ``paralela demo``: classify the digits with ``paralela.predict``.

The digits MLP (:class:`~paralela.demos._digits_model.DigitsClassifier`) is trained once
in this process and saved as a checkpoint in the step's directory (about 1 s; the serial
loop's ``setup``), then:

- serially: one model, every image in batches of ``BATCH_SIZE``, in a plain loop;
- in parallel: ``paralela.predict`` on the machine's workers, each loading the
  checkpoint once and writing its shards' part files,

and the outputs of both are compared image by image.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PredictDemoResult", "run_predict_demo"]

BATCH_SIZE = 64  # images per predict call, in both runs
RECORDS_PER_SHARD = 128  # 15 shards of the 1,797 images: several per worker


@dataclass(frozen=True)
class PredictDemoResult:
    """What the predict step measured.

    ``serial_seconds`` is the loop over the images with a model already loaded;
    ``parallel_seconds`` is the whole ``paralela.predict`` call: starting the workers,
    loading the model in each, predicting and writing the part files.
    """

    images: int
    workers: int
    shards: int
    serial_seconds: float
    parallel_seconds: float
    agree: int
    accuracy: float
    output: Path

    @property
    def serial_rate(self) -> float:
        return self.images / self.serial_seconds if self.serial_seconds > 0 else 0.0

    @property
    def parallel_rate(self) -> float:
        return self.images / self.parallel_seconds if self.parallel_seconds > 0 else 0.0


def run_predict_demo(
    images: int | None = None, workers: int | None = None, run_dir: Path | None = None
) -> PredictDemoResult:
    """Classify the first ``images`` digits (default all 1,797) serially and with
    ``paralela.predict``; ``run_dir`` (default a fresh temporary directory) gets the
    checkpoint and the output directory.

    Raises:
        ConfigError: ``images`` is not a positive integer.
        MissingExtraError: torch or scikit-learn is not installed.
    """
    import paralela
    from paralela.demos._digits_model import CHECKPOINT_ENV, DigitsClassifier, digits_set
    from paralela.errors import ConfigError

    if images is not None and (isinstance(images, bool) or not isinstance(images, int)
                               or images < 1):  # fmt: skip
        raise ConfigError(f"images must be a positive integer, got {images!r}.")
    pixels, labels = digits_set()
    pixels, labels = pixels[:images], labels[:images]
    directory = run_dir or Path(tempfile.mkdtemp(prefix="paralela-demo-predict-"))
    directory.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(CHECKPOINT_ENV)
    os.environ[CHECKPOINT_ENV] = str(directory / "digits-mlp.pt")  # the workers inherit it
    try:
        model = DigitsClassifier()
        model.setup("cpu")  # trains and saves the checkpoint the workers load
        started = time.perf_counter()
        serial = []
        for first in range(0, len(pixels), BATCH_SIZE):
            serial += model.predict(pixels[first : first + BATCH_SIZE])
        serial_seconds = time.perf_counter() - started
        result = paralela.predict(
            DigitsClassifier,
            pixels,
            output=directory / "output",
            workers=workers,
            batch_size=BATCH_SIZE,
            records_per_split=RECORDS_PER_SHARD,
            progress=False,
        )
    finally:
        if previous is None:
            os.environ.pop(CHECKPOINT_ENV, None)
        else:
            os.environ[CHECKPOINT_ENV] = previous
    parallel = _outputs(result.files)
    agree = sum(_same(a, b) for a, b in zip(parallel, serial, strict=True))
    correct = sum(out["label"] == label for out, label in zip(parallel, labels, strict=True))
    return PredictDemoResult(
        images=len(pixels),
        workers=result.workers,
        shards=result.shards,
        serial_seconds=serial_seconds,
        parallel_seconds=result.seconds,
        agree=agree,
        accuracy=correct / len(pixels),
        output=result.output,
    )


def _outputs(files: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in files:
        rows += [json.loads(line)["output"] for line in Path(name).read_text().splitlines()]
    return rows


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same label and probabilities to float32 rounding (a worker's one thread sums
    in another order than the serial loop's threads)."""
    return a["label"] == b["label"] and all(
        math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6)
        for x, y in zip(a["probabilities"], b["probabilities"], strict=True)
    )
