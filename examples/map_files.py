"""Preprocess many files in parallel, with a run directory that resumes after a crash.

A typical first step of an ML project: clean every raw CSV file of a data set (drop
broken rows, standardise the columns) and write the cleaned file next to a summary.
``paralela.map`` spreads the files over every core; ``run_dir=`` keeps every finished
chunk on disk, so a run that is killed half-way resumes where it stopped.

The example interrupts a first run on purpose (as Ctrl-C or a lost node would), then
runs again with the same run directory: only the missing files are processed.

    python examples/map_files.py [WORK_DIR]
"""

from __future__ import annotations

import contextlib
import csv
import math
import random
import sys
import tempfile
from pathlib import Path

import paralela

N_FILES = 48
ROWS = 400


def make_raw_data(directory: Path) -> list[str]:
    """Write N_FILES synthetic sensor CSV files (a few rows broken on purpose)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(N_FILES):
        rng = random.Random(i)
        with open(directory / f"sensor_{i:03d}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["time", "temperature", "vibration"])
            for t in range(ROWS):
                temp = 20 + 5 * math.sin(t / 30) + rng.gauss(0, 0.5)
                vib = abs(rng.gauss(0, 1 + i / N_FILES))
                broken = rng.random() < 0.02
                writer.writerow([t, "n/a" if broken else f"{temp:.3f}", f"{vib:.4f}"])
    return sorted(str(p) for p in directory.glob("sensor_???.csv"))


def clean_file(path: str) -> dict[str, float | int | str]:
    """Drop broken rows, standardise each column, write ``*.clean.csv``; return stats."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                rows.append((float(row["temperature"]), float(row["vibration"])))
            except ValueError:
                continue
    columns = list(zip(*rows, strict=True))
    stats = []
    for values in columns:
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) or 1.0
        stats.append((mean, std))
    out = path.replace(".csv", ".clean.csv")
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["temperature_z", "vibration_z"])
        for row in rows:
            writer.writerow([f"{(v - m) / s:.5f}" for v, (m, s) in zip(row, stats, strict=True)])
    return {
        "file": Path(path).name,
        "rows_kept": len(rows),
        "rows_dropped": ROWS - len(rows),
        "temperature_mean": round(stats[0][0], 3),
        "vibration_std": round(stats[1][1], 3),
    }


def main(work: Path) -> None:
    files = make_raw_data(work / "raw")
    run_dir = work / "run"
    print(f"{len(files)} raw files in {work / 'raw'}; run directory {run_dir}")

    # 1. A run that stops early: leave the loop after 20 results, as a crash would.
    #    Every chunk that finished is already on disk in run_dir.
    done = 0
    with contextlib.closing(
        paralela.imap(clean_file, files, run_dir=run_dir, chunksize=4, progress=False)
    ) as results:
        for _ in results:
            done += 1
            if done == 20:
                break
    print(f"first run: interrupted after {done} files")

    # 2. The same call again: finished chunks are read back, the rest is computed.
    cleaned = paralela.map(clean_file, files, run_dir=run_dir, chunksize=4, progress=False)
    s = cleaned.summary
    print(
        f"second run: {s.resumed_items} files resumed from the run directory, "
        f"{s.computed_items} computed"
    )

    # 3. Once more: everything is already there, nothing is computed.
    again = paralela.map(clean_file, files, run_dir=run_dir, chunksize=4, progress=False)
    print(
        f"third run: resumed {again.summary.resumed_items} of {len(files)} files, "
        f"computed {again.summary.computed_items}"
    )
    assert again == cleaned

    print()
    print(f"{'file':<18}{'kept':>6}{'dropped':>9}{'temp mean':>11}{'vib std':>9}")
    for r in cleaned[:5]:
        print(
            f"{r['file']:<18}{r['rows_kept']:>6}{r['rows_dropped']:>9}"
            f"{r['temperature_mean']:>11}{r['vibration_std']:>9}"
        )
    print(
        f"... {len(cleaned)} files; total rows dropped: {sum(r['rows_dropped'] for r in cleaned)}"
    )
    print(f"summary of the second run: {s}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
