"""Build a token vocabulary for a training run with MapReduce.

A language model's embedding table needs a vocabulary: every token seen at least
``--min-count`` times gets an id, the rest map to ``<unk>``. Counting tokens over a
large corpus is a MapReduce job; giving ids is a small serial step over the counts.

As a script (writes a small JSONL corpus into CORPUS_DIR when it holds none)::

    python examples/vocabulary.py [CORPUS_DIR] [--min-count 3] [--out vocab.json]

As a job file (counts only)::

    paralela mapreduce examples/vocabulary.py --input 'corpus/*.jsonl' --output counts/

The corpus is JSON Lines, ``{"text": "..."}`` per line, as most text datasets are
shipped: the mapper receives each line parsed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

TOKEN = re.compile(r"\w+|[^\w\s]")
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]


def tokenize(text: str) -> list[str]:
    """Lower-cased, NFKC-normalised words and punctuation marks."""
    return TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def mapper(record: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """``(token, 1)`` for each token of a record's text."""
    for token in tokenize(record.get("text", "")):
        yield token, 1


def reducer(token: str, counts: Iterable[int]) -> int:
    """How often a token occurs."""
    return sum(counts)


combiner = reducer


def build_vocabulary(counts: Iterable[tuple[str, int]], min_count: int) -> dict[str, int]:
    """Ids for the special tokens, then for every token seen ``min_count`` times or
    more, the most frequent first (ties by token, so the ids are reproducible)."""
    kept = sorted(((t, n) for t, n in counts if n >= min_count), key=lambda tn: (-tn[1], tn[0]))
    vocabulary = {token: i for i, token in enumerate(SPECIALS)}
    for token, _ in kept:
        vocabulary.setdefault(token, len(vocabulary))
    return vocabulary


def make_corpus(directory: Path, files: int = 4, records: int = 1500, seed: int = 1) -> None:
    rng = random.Random(seed)
    words = [f"tok{i}" for i in range(800)] + ["Ünïcode", "ﬁle", "naïve", "日本語"]
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(words))]
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        with open(directory / f"shard{n}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(records):
                text = " ".join(rng.choices(words, weights, k=rng.randint(3, 20))) + "."
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def main() -> None:
    import paralela

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path)
    parser.add_argument("--min-count", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="vocabulary-"))
    if not list(corpus.glob("*.jsonl")):
        make_corpus(corpus)
        print(f"wrote a corpus to {corpus}")
    counts = paralela.mapreduce(
        mapper, reducer, str(corpus / "*.jsonl"), combiner=combiner, workers=2
    )
    vocabulary = build_vocabulary(counts, args.min_count)
    out = args.out or corpus / "vocab.json"
    out.write_text(json.dumps(vocabulary, ensure_ascii=False, indent=0), encoding="utf-8")
    rare = sum(1 for _, n in counts if n < args.min_count)
    print(
        f"{len(counts)} distinct tokens; {len(vocabulary)} in the vocabulary "
        f"({len(SPECIALS)} special, {rare} below min count {args.min_count} -> <unk>)"
    )
    print(f"wrote {out}")
    print(counts.summary)


if __name__ == "__main__":
    main()
