"""Lesson 9: input pipelines: interleave, parallel map, prefetch and autotune vs a plain loop.

A training step waits for its batch. When reading and decoding run in the training
loop, the accelerator idles while the CPU reads files and decodes them. An input
pipeline (``paralela.data.Pipeline``) moves that work beside the loop:

* ``interleave`` reads several files at once (each by a thread of its own), which
  hides storage latency;
* ``map(decode, kind="process")`` decodes on several cores (pure-Python work holds the
  GIL, so it needs processes); with ``workers="auto"`` the pipeline tunes how many as it
  runs, within the CPUs this process may use;
* ``prefetch`` keeps the next batches ready while the step runs.

This script writes 16 shard files of 1 KiB records to a temporary directory. Reading a
record waits 3 ms (``time.sleep``, standing for a network filesystem's latency);
decoding it is about 3 ms of pure-Python CPU; the "training step" waits 20 ms per batch
of 16 (``time.sleep``, standing for the GPU's work, during which the CPU is free). It
runs one epoch with a plain loop, then with a pipeline that adds one stage at a time,
and prints the epoch's wall time, the elements per second and the share of the time
the training step was busy; then the last pipeline's own ``stats()``. Run::

    python examples/lessons/input_pipelines.py [--quick]

Each row is the best of 2 epochs (1 with ``--quick``, which also reads fewer records).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from paralela.data import Pipeline

RECORD_BYTES = 1024
READ_LATENCY_S = 0.003  # per record: the storage's latency (the CPU is free meanwhile)
STEP_S = 0.020  # per batch: the accelerator's step (the CPU is free meanwhile)
BATCH = 16
DECODE_S = 0.003  # per record: pure-Python CPU, calibrated below


def write_shards(directory: Path, shards: int, records: int) -> None:
    """``shards`` files of ``records`` records of RECORD_BYTES bytes each."""
    for n in range(shards):
        data = bytes((n * 7 + i) % 251 for i in range(RECORD_BYTES * records))
        (directory / f"shard-{n:03d}.rec").write_bytes(data)


def read_records(path: str) -> Iterator[bytes]:
    """The records of one shard, each after the storage's latency."""
    with open(path, "rb") as f:
        while record := f.read(RECORD_BYTES):
            time.sleep(READ_LATENCY_S)
            yield record


def fnv(record: bytes, passes: int) -> int:
    """FNV-1a over the record, ``passes`` times: pure-Python CPU work."""
    h = 2166136261
    for _ in range(passes):
        for byte in record:
            h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def make_decode(passes: int) -> Callable[[bytes], int]:
    """A decode function of about DECODE_S of CPU (a closure: pickled with its count)."""

    def decode(record: bytes) -> int:
        return fnv(record, passes)

    return decode


def calibrate() -> int:
    """FNV passes over one record that take about DECODE_S on this machine (the fastest of
    3 timings: on a shared machine the others include waiting for a core)."""
    record = bytes(range(256)) * (RECORD_BYTES // 256)
    per_pass = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fnv(record, 10)
        per_pass = min(per_pass, (time.perf_counter() - start) / 10)
    return max(1, round(DECODE_S / per_pass))


def decode_cost(decode: Callable[[bytes], int]) -> float:
    """Seconds of one decode here (the fastest of 5)."""
    record = bytes(RECORD_BYTES)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        decode(record)
        best = min(best, time.perf_counter() - start)
    return best


def train(batches: Iterable[object]) -> tuple[int, float]:
    """The training loop: one step of STEP_S per batch; (batches, seconds busy)."""
    n, busy = 0, 0.0
    for _ in batches:
        start = time.perf_counter()
        time.sleep(STEP_S)
        busy += time.perf_counter() - start
        n += 1
    return n, busy


def plain_loop(paths: list[str], decode: Callable[[bytes], int]) -> Iterator[list[int]]:
    """Read, decode and batch in the training loop's own thread."""
    batch: list[int] = []
    for path in paths:
        for record in read_records(path):
            batch.append(decode(record))
            if len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def decoded_in_loop(pipeline: Pipeline, decode: Callable[[bytes], int]) -> Iterator[list[int]]:
    """Batches of raw records from ``pipeline``, decoded in the training loop's thread."""
    for batch in pipeline:
        yield [decode(record) for record in batch]


def pipelines(
    directory: Path, decode: Callable[[bytes], int]
) -> dict[str, Callable[[], Iterable[object]]]:
    """Each pipeline adds one stage to the one before."""
    files = Pipeline.from_files(str(directory / "*.rec"))
    interleaved = files.interleave(read_records, cycle_length=8)
    raw = interleaved.batch(BATCH)
    one_thread = interleaved.map(decode, workers=1, kind="thread").batch(BATCH)
    processes = interleaved.map(decode, workers=2, kind="process").batch(BATCH)
    prefetched = interleaved.map(decode, workers=2, kind="process").batch(BATCH).prefetch(2)
    tuned = interleaved.map(decode, kind="process").batch(BATCH).prefetch(2)
    return {
        "interleave (8 files at once), decode in the loop": lambda: decoded_in_loop(raw, decode),
        "+ map(decode, kind='thread', workers=1): decode beside the loop": lambda: one_thread,
        "+ map(decode, kind='process', workers=2): on both cores": lambda: processes,
        "+ prefetch(2)": lambda: prefetched,
        "autotuned: map(decode, kind='process') (workers='auto') + prefetch(2)": lambda: tuned,
    }


def epoch(
    source: Callable[[], Iterable[object]], elements: int, repeats: int
) -> tuple[float, float]:
    """The best of ``repeats`` epochs: (wall seconds, share of the wall time the step ran)."""
    best: tuple[float, float] | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        _, busy = train(source())
        wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, busy / wall)
    assert best is not None
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records, one epoch (CI)")
    args = parser.parse_args()
    shards, per_shard, repeats = (8, 12, 1) if args.quick else (16, 40, 2)
    elements = shards * per_shard
    decode = make_decode(calibrate())

    with tempfile.TemporaryDirectory(prefix="lesson-input-") as tmp:
        directory = Path(tmp)
        write_shards(directory, shards, per_shard)
        paths = sorted(str(p) for p in directory.glob("*.rec"))
        print(
            f"{elements} records in {shards} shards; read {READ_LATENCY_S * 1e3:.0f} ms, "
            f"decode {decode_cost(decode) * 1e3:.1f} ms CPU each; a step of {STEP_S * 1e3:.0f} ms "
            f"per batch of {BATCH}"
        )
        rows = [
            (
                "plain loop (read, decode, batch, step in turn)",
                *epoch(lambda: plain_loop(paths, decode), elements, repeats),
            )
        ]
        variants = pipelines(directory, decode)
        for name, source in variants.items():
            rows.append((name, *epoch(source, elements, repeats)))
        last = variants[name]()

    ideal = (elements / BATCH) * STEP_S
    print()
    print("| input | epoch s | elements/s | step busy | speed-up |")
    print("|---|---|---|---|---|")
    base = rows[0][1]
    for name, wall, busy in rows:
        print(f"| {name} | {wall:.2f} | {elements / wall:,.0f} | {busy:.0%} | {base / wall:.1f}x |")
    print(
        f"| (the steps alone: the floor) | {ideal:.2f} | {elements / ideal:,.0f} | 100% | "
        f"{base / ideal:.1f}x |"
    )
    assert isinstance(last, Pipeline)
    print("\nThe autotuned pipeline's own account of its last epoch (pipeline.stats()):")
    print(last.stats())

    best_name, best_wall, best_busy = min(rows[1:], key=lambda row: row[1])
    print(
        f"\nRESULT: plain loop {base:.2f} s an epoch, best pipeline {best_wall:.2f} s "
        f"({base / best_wall:.1f}x; the step busy {rows[0][2]:.0%} -> {best_busy:.0%}): "
        f"{best_name}"
    )
    print(
        "Conclusion: each stage moved beside the loop shortens the epoch, until the slowest "
        "stage (the bottleneck in pipeline.stats()) sets the pace."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
