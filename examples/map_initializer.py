"""Load a model once per worker with ``initializer=``, then score many items with it.

Loading a model (weights from disk, a tokenizer, a database connection) is often slower
than using it on one item, and the loaded object may not be picklable. An initializer
runs once in each worker before its first item and keeps the model in a global of the
worker; the function then uses it. Here the "model" is a small sentiment lexicon with
bigram weights, read from a JSON file, and each item is a sentence to score.

    python examples/map_initializer.py
"""

from __future__ import annotations

import itertools
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import paralela

# Set in each worker by load_model(); the main process never loads it.
MODEL: dict[str, Any] | None = None
LOADS = 0

POSITIVE = ["good", "great", "fast", "reliable", "clean", "accurate", "stable"]
NEGATIVE = ["bad", "slow", "broken", "noisy", "wrong", "flaky", "late"]
FILLER = ["the", "model", "run", "data", "batch", "was", "very", "not", "quite", "gpu"]


def write_model(path: Path) -> None:
    """The model file a training run would have produced."""
    weights = dict.fromkeys(POSITIVE, 1.0) | dict.fromkeys(NEGATIVE, -1.0)
    bigrams = {f"not {w}": -2.0 * v for w, v in weights.items()}
    path.write_text(json.dumps({"weights": weights, "bigrams": bigrams, "bias": 0.1}))


def load_model(path: str) -> None:
    """Initializer: runs once per worker, before that worker's first item."""
    global MODEL, LOADS
    time.sleep(0.2)  # stands for reading large weights from disk
    with open(path) as f:
        MODEL = json.load(f)
    LOADS += 1


def score(sentence: str) -> dict[str, Any]:
    """Sentiment of one sentence with the worker's model."""
    assert MODEL is not None, "load_model() runs before the first item"
    words = sentence.split()
    total = MODEL["bias"] + sum(MODEL["weights"].get(w, 0.0) for w in words)
    total += sum(MODEL["bigrams"].get(f"{a} {b}", 0.0) for a, b in itertools.pairwise(words))
    return {
        "label": "positive" if total > 0 else "negative",
        "score": round(total, 2),
        "worker": os.getpid(),
        "loads_in_worker": LOADS,
    }


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocabulary = POSITIVE + NEGATIVE + FILLER * 3
    return [" ".join(rng.choices(vocabulary, k=rng.randint(4, 12))) for _ in range(n)]


def main() -> None:
    sentences = make_sentences(2_000)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = Path(tmp) / "sentiment.json"
        write_model(model_path)
        results = paralela.map(
            score,
            sentences,
            initializer=load_model,
            initargs=(str(model_path),),
            progress=False,
        )

    loads = {r["worker"]: r["loads_in_worker"] for r in results}
    labels = Counter(r["label"] for r in results)
    print(f"scored {len(results)} sentences on {len(loads)} workers")
    once = all(n == 1 for n in loads.values())
    print(
        f"model loads: {sum(loads.values())} for {len(results)} sentences "
        f"({'once per worker' if once else 'MORE than once in a worker'})"
    )
    print(f"labels: {dict(sorted(labels.items()))}")
    for sentence, r in list(zip(sentences, results, strict=True))[:3]:
        print(f"  {r['label']:>8} {r['score']:+5.1f}  {sentence}")
    print(f"summary: {results.summary}")
    if any(n != 1 for n in loads.values()):
        raise SystemExit("a worker loaded the model more than once")


if __name__ == "__main__":
    main()
