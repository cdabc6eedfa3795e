"""A deterministic synthetic word corpus for ``bench_mapreduce.py``, cached on disk.

The anchors' corpus: 200.0 MB in 16 files, 27,023,456 tokens, 50,000 distinct words;
Zipf (s = 1.0) over a vocabulary of 50,000 random lowercase words, ~12 words a line,
seed 20240611. Their generator is not available; this one uses the same parameters
(numpy), so the sizes and the distribution match but the bytes, and the checksums, do not.

    seed ─► vocabulary (50,000 distinct words, 3-10 letters)
      └──► file i: SeedSequence(seed).spawn(files)[i] ─► Zipf ranks, line lengths 1-23
           ─► bytes gathered from the vocabulary with numpy, cut at the last line end
              before the file's share of the bytes (12,500,000 for 200 MB in 16 files)

``ensure_corpus(directory, files, megabytes)`` writes the files once and a
``manifest.json`` with the parameters and each file's sha256; a later call that finds
the same parameters and checksums reuses them (the checksums are checked, ~1 s per GB).
The directory gets a ``.gitignore`` of ``*``, so a cache under ``bench/`` is never
committed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

SEED = 20240611
VOCABULARY = 50_000
ZIPF_S = 1.0
MIN_LEN, MAX_LEN = 3, 10  # word lengths: uniform, mean 6.5 letters (~7.4 bytes a token)
WORDS_PER_LINE = (1, 23)  # uniform, mean 12
VERSION = 1


def vocabulary(seed: int = SEED, size: int = VOCABULARY) -> list[bytes]:
    """``size`` distinct random lowercase words, the same for the same seed."""
    rng = np.random.default_rng(seed)
    words: list[bytes] = []
    seen: set[bytes] = set()
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    while len(words) < size:
        lengths = rng.integers(MIN_LEN, MAX_LEN + 1, size=size)
        chars = letters[rng.integers(0, 26, size=int(lengths.sum()))].tobytes()
        pos = 0
        for n in lengths.tolist():
            word = chars[pos : pos + n]
            pos += n
            if word not in seen:
                seen.add(word)
                words.append(word)
                if len(words) == size:
                    break
    return words


def _file_bytes(index: int, files: int, target: int, words: list[bytes]) -> bytes:
    """One file of about ``target`` bytes (whole lines), from its own random stream."""
    rng = np.random.default_rng(np.random.SeedSequence(SEED).spawn(files)[index])
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ZIPF_S)
    cdf /= cdf[-1]
    # The vocabulary as one buffer of "word " entries, with offsets and lengths.
    flat = np.frombuffer(b"".join(w + b" " for w in words), dtype=np.uint8)
    lens = np.array([len(w) + 1 for w in words], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    tokens = int(target / 7.0) + 1000  # more than enough: a token takes ~7.4 bytes
    ids = np.searchsorted(cdf, rng.random(tokens), side="right")
    ids = np.minimum(ids, len(words) - 1)
    tok_len = lens[ids]
    ends = np.cumsum(tok_len)
    # Gather: output byte k of token t is flat[starts[ids[t]] + (k - first byte of t)].
    first = ends - tok_len
    gather = np.repeat(starts[ids] - first, tok_len) + np.arange(int(ends[-1]), dtype=np.int64)
    out = flat[gather]
    # Line ends: the separator after the last token of each line becomes "\n".
    per_line = rng.integers(WORDS_PER_LINE[0], WORDS_PER_LINE[1] + 1, size=tokens)
    last_tok = np.cumsum(per_line) - 1
    last_tok = last_tok[last_tok < tokens]
    out[ends[last_tok] - 1] = ord("\n")
    line_ends = ends[last_tok]  # bytes up to and including each newline
    cut = int(line_ends[np.searchsorted(line_ends, target, side="right") - 1])
    return out[:cut].tobytes()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def ensure_corpus(directory: Path, files: int, megabytes: float, log: Any = None) -> dict[str, Any]:
    """The corpus of ``files`` files, ``megabytes`` MB (10^6 B) in all, in ``directory``.

    Reused when ``manifest.json`` has the same parameters and every file's sha256
    matches; written again otherwise. Returns the manifest (``files``: names, sizes,
    sha256; ``bytes``, ``tokens``, ``lines``, ``distinct``).
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    params = {
        "version": VERSION,
        "seed": SEED,
        "vocabulary": VOCABULARY,
        "zipf_s": ZIPF_S,
        "word_lengths": [MIN_LEN, MAX_LEN],
        "words_per_line": list(WORDS_PER_LINE),
        "files": files,
        "megabytes": megabytes,
    }
    directory.mkdir(parents=True, exist_ok=True)
    ignore = directory.parent / ".gitignore"
    if directory.parent.name == ".cache" and not ignore.exists():
        ignore.write_text("*\n")
    manifest_path = directory / "manifest.json"
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            manifest = {}
        if manifest.get("params") == params and all(
            (directory / f["name"]).exists()
            and (directory / f["name"]).stat().st_size == f["bytes"]
            and _sha256(directory / f["name"]) == f["sha256"]
            for f in manifest.get("files", [])
        ):
            say(f"corpus: reusing {directory} ({manifest['bytes'] / 1e6:.1f} MB, checksums match)")
            return dict(manifest)
        say(f"corpus: {directory} does not match its manifest: writing it again")
    words = vocabulary()
    target = int(megabytes * 1e6 / files)
    entries = []
    tokens = lines = 0
    for i in range(files):
        data = _file_bytes(i, files, target, words)
        name = f"part-{i:04d}.txt"
        (directory / name).write_bytes(data)
        entries.append(
            {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
        lines += data.count(b"\n")
        tokens += data.count(b" ") + data.count(b"\n")
        say(f"corpus: wrote {name} ({len(data) / 1e6:.1f} MB) [{i + 1}/{files}]")
    manifest = {
        "params": params,
        "files": entries,
        "bytes": sum(e["bytes"] for e in entries),
        "tokens": tokens,
        "lines": lines,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def corpus_files(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """The corpus's file paths, in order."""
    return [str(directory / f["name"]) for f in manifest["files"]]


if __name__ == "__main__":
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/corpus-test")
    m = ensure_corpus(d, int(sys.argv[2]) if len(sys.argv) > 2 else 16, 200.0)
    print(json.dumps({k: v for k, v in m.items() if k != "files"}))
