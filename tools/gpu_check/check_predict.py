"""Check: ``paralela predict`` of the embedder on CUDA over 20,000 sentences, against a
serial CUDA loop in one process.

Proves: the predict worker ran on the GPU (``setup`` got ``cuda:0``, the worker saw the
GPU's UUID), every sentence has its row, in input order, holding what the serial loop
computes for it; and how the two compare in sentences/s (predict's time includes its
start: the worker's interpreter, CUDA's context, the model's build).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import embedder
from common import HERE, Mode, Outcome, gpu_uuid, run

BATCH = 256
TOLERANCE = 1e-3  # the same GPU kernels, but batches may be cut differently


def check(mode: Mode, work: Path) -> Outcome:
    outcome = Outcome()
    uuid = gpu_uuid(mode)
    count = mode.size(20_000, 300)
    texts = embedder.sentences(count)
    source = work / "sentences.txt"
    source.write_text("\n".join(texts) + "\n")
    output = work / "embeddings"
    started = time.perf_counter()
    run(
        [sys.executable, "-m", "paralela", "predict", f"{HERE / 'embedder.py'}:Embedder16",
         "--input", str(source), "--output", str(output), "--batch-size", str(BATCH),
         "--no-input", "--no-progress"],
        mode, timeout=300,
    )  # fmt: skip
    predict_s = time.perf_counter() - started
    rows = [
        json.loads(line)
        for part in sorted(output.glob("part-*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    serial_s, expected = _serial(mode.device, texts)
    outcome.expect(len(rows) == count, f"{len(rows)} rows for {count} sentences")
    wrong = sum(
        1
        for row, want in zip(rows, expected, strict=False)
        if max(abs(a - b) for a, b in zip(row["output"]["embedding"], want, strict=True))
        > TOLERANCE
    )
    outcome.expect(wrong == 0, f"{wrong} rows differ from the serial loop's embedding")
    places = {(row["output"]["device"], row["output"]["visible"]) for row in rows}
    outcome.expect(places == {("cuda:0", uuid)}, f"predicted on {places}, not cuda:0 {uuid}")
    outcome.figures.update(
        {
            "sentences": count,
            "paralela predict s (with its start)": round(predict_s, 2),
            "paralela predict sentences/s": round(count / predict_s),
            "serial loop s (model built)": round(serial_s, 2),
            "serial loop sentences/s": round(count / serial_s),
        }
    )
    return outcome


def _serial(device: str, texts: list[str]) -> tuple[float, list[list[float]]]:
    """One process, one model, the batches one after the other: seconds, embeddings."""
    import torch

    model = embedder.Embedder16()
    model.setup("cuda:0" if device == "cuda" else "cpu")
    model.predict(texts[:BATCH])  # warm: CUDA's kernels load on first use
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    out: list[list[float]] = []
    for i in range(0, len(texts), BATCH):
        out.extend(o["embedding"] for o in model.predict(texts[i : i + BATCH]))
    return time.perf_counter() - started, out
