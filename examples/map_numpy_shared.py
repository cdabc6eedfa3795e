"""numpy arrays as items, and a large read-only object shared with every worker.

Batch inference of a bag-of-embeddings text classifier: each item is a batch of token
ids (a numpy array); every batch needs the same embedding table and classifier weights
(the ``shared=`` object, about 10 MB here, often far more in practice).

- ``shared=`` sends the weights once to each worker, not once per item; the function is
  called as ``fn(item, shared)``.
- Large arrays travel to workers through shared memory without pickling their data.
- Each worker's numpy gets a fair share of the cores (OMP_NUM_THREADS and friends are
  set per worker), so workers do not oversubscribe the machine.

    python examples/map_numpy_shared.py
"""

from __future__ import annotations

import time

import numpy as np

import paralela

VOCABULARY = 30_000
DIM = 128
CLASSES = 10
BATCHES = 32
BATCH_SIZE = 256
TOKENS = 128  # tokens per document


def make_model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embeddings": rng.standard_normal((VOCABULARY, DIM), dtype=np.float32),
        "token_layer": rng.standard_normal((DIM, DIM), dtype=np.float32) / np.sqrt(DIM),
        "classifier": rng.standard_normal((DIM, CLASSES), dtype=np.float32),
    }


def make_batches(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, VOCABULARY, size=(BATCH_SIZE, TOKENS), dtype=np.int32)
        for _ in range(BATCHES)
    ]


def classify(token_ids: np.ndarray, model: dict[str, np.ndarray]) -> np.ndarray:
    """Embed the tokens, one dense layer per token, mean over the document, then a linear
    classifier: the class of each document."""
    tokens = model["embeddings"][token_ids]  # (batch, TOKENS, DIM)
    doc_vectors = np.tanh(tokens @ model["token_layer"]).mean(axis=1)  # (batch, DIM)
    logits = doc_vectors @ model["classifier"]  # (batch, CLASSES)
    return logits.argmax(axis=1).astype(np.int8)


def main() -> None:
    model = make_model()
    batches = make_batches()
    size_mb = sum(a.nbytes for a in model.values()) / 1e6
    print(
        f"{BATCHES} batches of {BATCH_SIZE} documents; shared model {size_mb:.1f} MB "
        f"({VOCABULARY} x {DIM} embeddings)"
    )

    t0 = time.perf_counter()
    expected = [classify(b, model) for b in batches]
    serial = time.perf_counter() - t0

    t0 = time.perf_counter()
    predicted = paralela.map(classify, batches, shared=model, progress=False)
    parallel = time.perf_counter() - t0

    # Workers run numpy with fewer BLAS threads than this process: float sums may round
    # differently, so a near-tie between two classes could, in principle, flip.
    agree = sum(int((a == b).sum()) for a, b in zip(expected, predicted, strict=True))
    total = BATCHES * BATCH_SIZE
    counts = np.bincount(np.concatenate(predicted), minlength=CLASSES)
    print(f"predictions agree with the serial computation: {agree} of {total} documents")
    print(f"documents per class: {counts.tolist()}")
    print(
        f"serial {serial:.2f} s, paralela.map {parallel:.2f} s "
        f"(worker start-up and sending the model included)"
    )
    print(f"summary: {predicted.summary}")
    if agree < 0.999 * total:
        raise SystemExit("the parallel predictions differ from the serial ones")


if __name__ == "__main__":
    main()
