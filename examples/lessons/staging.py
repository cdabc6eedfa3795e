"""Lesson 6: staging data to local scratch (docs/lessons/staging.md).

On a cluster, your dataset lives on a shared filesystem (NFS, Lustre, GPFS...) that
every node sees. Each file opened there costs a round trip to its server, so a training
job that reads thousands of small files every epoch spends its time waiting for the
network, and slows the filesystem for everyone. Staging copies the dataset once, at the
start of the job, to the node's own disk (``paralela stage``: in parallel, every file
verified), and every epoch then reads the local copy.

This script makes a dataset of many small files in a "shared" directory, stages it with
``paralela.stage``, and times an epoch (reading every file) from both, plus the stage
itself and a second stage (nothing to copy: it only compares sizes and times).

The honest caveat: on one machine the "shared" directory is on the same local disk as
the scratch copy, so the two epochs cost about the same here. What a network filesystem
adds is a round trip per file; the last table adds an assumed round trip (``--latency``,
default 1 ms, a loaded NFS or Lustre server's order of magnitude) to the measured
figures to show where staging pays. Those rows are a model, not a measurement, and say
so.

Run it:  python examples/lessons/staging.py           (about a minute)
         python examples/lessons/staging.py --quick   (a few seconds; CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import paralela


def make_dataset(root: Path, n_files: int, size: int) -> None:
    """``n_files`` files of ``size`` bytes in 100 sub-directories, like small images."""
    payload = os.urandom(size)
    for i in range(n_files):
        folder = root / f"class-{i % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"sample-{i:06d}.bin").write_bytes(payload)


def epoch(root: Path) -> tuple[float, int]:
    """Read every file once, as a data loader's epoch does: seconds and bytes."""
    start = time.perf_counter()
    total = 0
    for folder in sorted(root.iterdir()):
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                total += len(path.read_bytes())
    return time.perf_counter() - start, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer files (CI)")
    parser.add_argument(
        "--latency", type=float, default=1.0, help="assumed round trip per file, ms (model)"
    )
    args = parser.parse_args()
    n_files = 2_000 if args.quick else 20_000
    size = 4096
    epochs = 10
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"dataset: {n_files:,} files of {size // 1024} KiB in 100 directories\n")

    root = Path(tempfile.mkdtemp(prefix="paralela-lesson-staging-"))
    try:
        shared, scratch = root / "shared" / "images", root / "scratch" / "images"
        make_dataset(shared, n_files, size)
        epoch(shared)  # once untimed: both directories are then in the page cache
        shared_s, total = epoch(shared)

        staged = paralela.stage(shared, scratch)
        assert staged.files_copied == staged.files_verified == n_files
        epoch(Path(staged.path))
        scratch_s, scratch_total = epoch(Path(staged.path))
        assert scratch_total == total
        again = paralela.stage(shared, scratch)
        assert again.files_skipped == n_files
        assert again.files_copied == 0

        print("measured (both directories on this machine's local disk):")
        print(f"  {'step':<44} {'seconds':>8} {'files/s':>10}")
        for label, seconds in (
            ("one epoch from the 'shared' directory", shared_s),
            (f"paralela.stage, {staged.workers} threads, verified", staged.seconds),
            ("one epoch from the staged copy", scratch_s),
            ("paralela.stage again (all up to date)", again.seconds),
        ):
            print(f"  {label:<44} {seconds:>8.3f} {n_files / seconds:>10,.0f}")
        print()

        latency = args.latency / 1000
        wait_per_epoch = n_files * latency  # one round trip per file opened
        stage_wait = wait_per_epoch / staged.workers  # the stage's threads overlap them
        from_shared = epochs * (shared_s + wait_per_epoch)
        with_stage = staged.seconds + stage_wait + epochs * scratch_s
        print(
            f"model: {epochs} epochs if the shared directory were a network filesystem "
            f"adding {args.latency:g} ms per file (assumed, not measured):"
        )
        print(f"  {'plan':<44} {'seconds':>8}")
        print(f"  {'read the shared filesystem every epoch':<44} {from_shared:>8.2f}")
        print(f"  {'stage once, then read the local copy':<44} {with_stage:>8.2f}")
        print()
        print(
            f"RESULT: {n_files:,} files of 4 KiB: staged in {staged.seconds:.2f} s "
            f"({n_files / staged.seconds:,.0f} files/s, all verified), re-stage "
            f"{again.seconds:.2f} s; epoch {shared_s:.2f} s shared vs {scratch_s:.2f} s staged "
            f"(same local disk here); model at {args.latency:g} ms per file, {epochs} epochs: "
            f"{from_shared:.1f} s vs {with_stage:.1f} s"
        )
        print(
            "Conclusion: staging pays once what a network filesystem charges every epoch; "
            "on one machine there is nothing to gain, which is why the model row is there."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
