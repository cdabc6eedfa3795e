"""A MiniLM-sized sentence embedder with random weights, for ``paralela serve`` and
``paralela predict`` (no weights to download: the GPU machine has no network).

all-MiniLM-L6-v2's shape (a 30522-word vocabulary, 6 layers of width 384, 12 heads,
feed-forward 1536), built from a seed, so every process holds the same weights. Words
are hashed into the vocabulary (crc32) instead of a WordPiece tokenizer; the embedding
is the mean of the last layer over the words, normalised. Tiny in the dry run.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

REAL = {"vocab": 30522, "dim": 384, "layers": 6, "heads": 12, "ff": 1536, "max_len": 128}
DRY = {"vocab": 1000, "dim": 32, "layers": 2, "heads": 4, "ff": 64, "max_len": 32}


def shape() -> dict[str, int]:
    return DRY if os.environ.get("GPU_CHECK_DRY") == "1" else REAL


def build() -> Any:
    """The encoder, with the same random weights in every process (on the CPU)."""
    import torch
    from torch import nn

    s = shape()

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(s["vocab"], s["dim"], padding_idx=0)
            self.positions = nn.Embedding(s["max_len"], s["dim"])
            layer = nn.TransformerEncoderLayer(
                s["dim"], s["heads"], s["ff"], dropout=0.0, activation="gelu", batch_first=True
            )
            self.layers = nn.TransformerEncoder(layer, s["layers"], enable_nested_tensor=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            mask = ids != 0
            positions = torch.arange(ids.shape[1], device=ids.device)
            hidden = self.layers(
                self.words(ids) + self.positions(positions), src_key_padding_mask=~mask
            )
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            return nn.functional.normalize(pooled, dim=-1)

    torch.manual_seed(0)
    return Encoder().eval()


def token_ids(texts: list[str]) -> Any:
    """Words hashed into the vocabulary (0 pads), at most ``max_len`` per text."""
    import torch

    s = shape()
    rows = [
        [zlib.crc32(w.encode()) % (s["vocab"] - 1) + 1 for w in t.lower().split()][: s["max_len"]]
        or [1]
        for t in texts
    ]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


class Embedder:
    """The model class: ``setup(device)`` once per worker, ``predict(batch)`` per batch.

    Each output is ``{"embedding": [...], "device": ..., "visible": ...}``: the device
    paralela handed to ``setup`` and the worker's ``CUDA_VISIBLE_DEVICES``, so that the
    checks see where it ran. In the dry run a ``cuda`` device is replaced by the CPU.
    """

    dims: int | None = None  # only the first dims of each embedding (None: all)

    def setup(self, device: str) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        self.handed = str(device)
        dry = os.environ.get("GPU_CHECK_DRY") == "1"
        self.device = torch.device("cpu" if dry else device)
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.model = build().to(self.device)

    def predict(self, batch: list[str]) -> list[dict[str, Any]]:
        import torch

        with torch.inference_mode():
            vectors = self.model(token_ids(batch).to(self.device))[:, : self.dims].cpu()
        return [
            {"embedding": v, "device": self.handed, "visible": self.visible}
            for v in vectors.tolist()
        ]


class Embedder16(Embedder):
    """The first 16 numbers of each embedding: ``predict``'s output files stay small."""

    dims = 16


def sentences(count: int) -> list[str]:
    """``count`` different sentences of 4 to 27 words, the same every time."""
    words = (
        "gpu", "trial", "sweep", "rank", "batch", "model", "serve", "predict", "pipeline",
        "stage", "tensor", "memory", "kernel", "worker", "queue", "slot", "device", "launch",
        "gradient", "weight", "loss", "data", "epoch", "shard",
    )  # fmt: skip
    return [
        " ".join(
            [f"s{i}", *(words[(i * 7 + j * 3 + j * j) % len(words)] for j in range(3 + i % 24))]
        )
        for i in range(count)
    ]
