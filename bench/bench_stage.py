"""`paralela stage` next to `cp -r` and `rsync -a`: many small files, and a few large ones.

    python bench/bench_stage.py                 # ~1 minute on 2 cores
    python bench/bench_stage.py --reps 5 --small 20000

Each row copies a source tree in a temporary directory to a fresh destination on the
same local disk, in rounds over all rows (both trees in the page cache after the warm-up:
this measures the per-file cost and the copy + hash path, not a disk or a network). `cp`
and `rsync` run as processes; the `paralela` rows call `paralela.staging.stage` in this
process, and one row runs the `paralela stage` command (a fresh Python, for the start-up
cost). Every copy is checked against the source (untimed). The "up to date" rows run
again onto a complete copy.
Results go to bench/results/stage.md.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Timing, machine_lines, md_table, sig  # bench/ is on sys.path

from paralela.staging import default_workers, stage

RESULTS = Path(__file__).resolve().parent / "results" / "stage.md"


def make_small(root: Path, n: int, size: int) -> int:
    data = os.urandom(size)
    for i in range(n):
        d = root / f"class{i % 50:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:06d}.jpg").write_bytes(data[i % 97 :] + data[: i % 97])
    return n * size


def make_large(root: Path, n: int, size: int) -> int:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"shard{i:02d}.tar").write_bytes(os.urandom(size))
    return n * size


def same_tree(a: Path, b: Path) -> None:
    for dirpath, _dirs, files in os.walk(a):
        for name in files:
            src = Path(dirpath) / name
            dst = b / src.relative_to(a)
            if not filecmp.cmp(src, dst, shallow=False):
                raise AssertionError(f"{dst} differs from {src}")


def rows_for(src: Path, work: Path, reps: int) -> list[tuple[str, Timing, str]]:
    """Every row, timed in rounds: one warm-up each, then ``reps`` rounds over all rows
    (so that a burst of load from elsewhere falls on every row alike)."""
    dest = work / "dest"

    def fresh() -> None:
        shutil.rmtree(dest, ignore_errors=True)

    def sh(*cmd: str) -> Callable[[], Any]:
        return lambda: subprocess.run(cmd, check=True)

    # (name, run, what, start from an empty destination?)
    rows: list[tuple[str, Callable[[], Any], str, bool]] = [
        ("cp -r", sh("cp", "-r", f"{src}/.", str(dest)), "GNU cp, no verification", True),
    ]
    if shutil.which("rsync"):
        rows.append(("rsync -a", sh("rsync", "-a", f"{src}/", f"{dest}/"), "rsync", True))
    for workers in (1, 4, 8, 16):
        rows.append(
            (
                f"paralela, {workers} threads",
                lambda w=workers: stage(src, dest, workers=w),
                "stage(): copy + blake2b, read back + compare, rename",
                True,
            )
        )
    rows += [
        (
            "paralela, no verify",
            lambda: stage(src, dest, verify=False),
            f"stage(verify=False), {default_workers()} threads: copy + blake2b, rename",
            True,
        ),
        (
            "paralela stage (command)",
            sh(sys.executable, "-m", "paralela", "stage", "-q", str(src), str(dest)),
            "the command, a fresh Python (start-up included)",
            True,
        ),
    ]
    if shutil.which("rsync"):
        rows.append(
            (
                "rsync -a, up to date",
                sh("rsync", "-a", f"{src}/", f"{dest}/"),
                "again onto a complete copy",
                False,
            )
        )
    rows.append(
        (
            "paralela, up to date",
            lambda: stage(src, dest),
            "again onto a complete copy: size + time check",
            False,
        )
    )
    timings = {name: Timing(cold=0.0) for name, *_ in rows}
    for rep in range(-1, reps):
        print(f"  round {rep + 1} of {reps} (0: warm-up)", file=sys.stderr, flush=True)
        for name, run, _what, empty in rows:
            if empty:
                fresh()
            elif not dest.exists():
                stage(src, dest)
            t0 = time.perf_counter()
            run()
            elapsed = time.perf_counter() - t0
            same_tree(src, dest)
            if rep < 0:
                timings[name].cold = elapsed
            else:
                timings[name].times.append(elapsed)
    fresh()
    return [(name, timings[name], what) for name, _run, what, _empty in rows]


def table(rows: list[tuple[str, Timing, str]], files: int, nbytes: int) -> str:
    body = []
    for name, t, what in rows:
        body.append(
            [
                name,
                sig(t.median),
                sig(t.best),
                sig(files / t.median),
                sig(nbytes / 2**20 / t.median),
                what,
            ]
        )
    return md_table(["run", "median s", "best s", "files/s", "MiB/s", "what"], body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--small", type=int, default=5000, help="small files")
    parser.add_argument("--small-size", type=int, default=4096)
    parser.add_argument("--large", type=int, default=4, help="large files")
    parser.add_argument("--large-size", type=int, default=64 << 20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sections = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp:
        work = Path(tmp)
        for label, maker, n, size in (
            ("many small files", make_small, args.small, args.small_size),
            ("a few large files", make_large, args.large, args.large_size),
        ):
            print(f"{label}: {n} x {size} B", file=sys.stderr, flush=True)
            src = work / "src"
            nbytes = maker(src, n, size)
            rows = rows_for(src, work, args.reps)
            sections.append(
                f"## {label}: {n:,} files of {size:,} B ({nbytes / 2**20:,.0f} MiB)\n\n"
                + table(rows, n, nbytes)
                + "\n"
            )
            shutil.rmtree(work / "src")
            shutil.rmtree(work / "dest", ignore_errors=True)
    text = "\n".join(
        [
            "# `paralela stage` next to `cp -r` and `rsync -a`",
            "",
            "Generated by `python bench/bench_stage.py` "
            f"(`--reps {args.reps} --small {args.small} --large {args.large}`).",
            "",
            "## Machine and versions",
            "",
            *machine_lines(["paralela"]),
            "",
            "## Method",
            "",
            "Source and destination on the same local disk, both in the page cache after "
            "the warm-up run: the figures are the per-file cost of each tool and its "
            "copy (+ hash) path, not a disk or a network. On a network filesystem each "
            "open and stat of the source is a round trip to the server, which cp and rsync "
            "pay one file at a time and paralela's threads overlap; this machine has no "
            "network filesystem to measure that on. Each row runs once to warm up; then "
            f"{args.reps} rounds run every row in turn (so that load from elsewhere falls "
            "on all rows alike), onto a fresh destination (deleted untimed) except for the "
            "up-to-date rows, each checked file by file against the source (untimed). "
            "A noisy 2-core VM: "
            "compare rows within one table. Load average (1 min) of the machine: "
            f"{load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after it (other "
            "people's work; anything near 2 or above means the rows shared the cores).",
            "",
            *sections,
            "",
        ]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
