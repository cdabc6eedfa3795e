"""Count the words of a corpus with MapReduce: a job file and a script in one.

As a job file for the command line (it defines ``mapper``, ``reducer`` and
``combiner``)::

    paralela mapreduce examples/wordcount.py --input 'corpus/*.txt' --output counts/

As a script, calling ``paralela.mapreduce`` (it writes a small corpus of its own into
CORPUS_DIR first when that directory holds no ``.txt`` file)::

    python examples/wordcount.py [CORPUS_DIR]

The mapper yields ``(word, 1)`` for each word of a line; the combiner sums the ones
on the map side, so a map task sends one pair per distinct word instead of one per
word; the reducer sums what the map tasks sent.
"""

from __future__ import annotations

import random
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

WORD = re.compile(r"\w+")


def mapper(line: str) -> Iterator[tuple[str, int]]:
    """``(word, 1)`` for every word of a line, lower-cased."""
    for word in WORD.findall(line.lower()):
        yield word, 1


def reducer(word: str, counts: Iterable[int]) -> int:
    """The total count of a word."""
    return sum(counts)


combiner = reducer  # a sum gives the same total however the counts are grouped


def make_corpus(directory: Path, files: int = 6, lines: int = 3000, seed: int = 0) -> None:
    """Write ``files`` text files of Zipf-distributed words (Unicode, blank lines too)."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(2000)] + ["straße", "niño", "café", "данные", "数据"]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        rows = []
        for _ in range(lines):
            if rng.random() < 0.05:
                rows.append("")
                continue
            words = rng.choices(vocabulary, weights, k=rng.randint(1, 16))
            rows.append(" ".join(words).capitalize())
        (directory / f"part{n}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")


def main(argv: list[str]) -> None:
    import paralela

    corpus = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="wordcount-"))
    if not list(corpus.glob("*.txt")):
        make_corpus(corpus)
        print(f"wrote a corpus to {corpus}")
    counts = paralela.mapreduce(
        mapper, reducer, str(corpus / "*.txt"), combiner=combiner, workers=2
    )
    top = sorted(counts, key=lambda pair: (-pair[1], pair[0]))[:10]
    print("top words:", ", ".join(f"{word} {n}" for word, n in top))
    expected: Counter[str] = Counter()
    for path in sorted(corpus.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            expected.update(word for word, _ in mapper(line))
    same = counts.to_dict() == dict(expected)
    print(f"{len(counts)} distinct words; equal to a serial Counter: {same}")
    print(counts.summary)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
