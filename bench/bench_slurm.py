"""Benchmark: 10,000 items of 10 ms on the local Slurm cluster, three ways to submit them.

Rows (each in a fresh child process, one after another):

- ``paralela_packed``: ``paralela.map(backend="slurm")`` with its defaults: the items packed
  into at most ``max_jobs`` (128) array tasks of one ``sbatch``, each running its share.
- ``paralela_packed_2cpu``: the same with ``cpus_per_task=2``: each task runs its share on a
  local pool of 2 processes (two levels of parallelism).
- ``paralela_packed_8jobs``: ``max_jobs=8``: two tasks per slot, so each task's start-up
  (about a second here) is paid 8 times instead of 128.
- ``submitit_map_array``: submitit's ``map_array``, one array task per item. Arrays are
  capped by ``MaxArraySize`` (1001 here), and 10,000 one-item tasks would take most of an
  hour, so this row runs ``--submitit-items`` items and projects the wall time linearly.
- ``submitit_job_per_chunk``: the same 128 chunks as paralela, but one ordinary job each
  (``executor.submit`` per chunk, 128 ``sbatch`` calls), each chunk a plain loop.

Usage (the peers' venv has submitit; see bench/README.md)::

    .venv-bench/bin/pip install submitit==1.5.4
    bash tools/local-slurm.sh start
    .venv-bench/bin/python bench/bench_slurm.py                 # about 6 minutes
    .venv-bench/bin/python bench/bench_slurm.py --items 2000 --submitit-items 200  # quick

The items sleep (``time.sleep(0.01)``) rather than compute: the cluster's 4 emulated CPUs
are 2 real cores shared with other users, so sleeping items measure what the submission
method costs, not how busy the machine happens to be. Ideal wall time = items x 10 ms / 4
slots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_lines, md_table, sig

ITEM_S = 0.01
SLOTS = 4  # 2 emulated nodes x 2 CPUs
ROWS = [
    "paralela_packed",
    "paralela_packed_2cpu",
    "paralela_packed_8jobs",
    "submitit_map_array",
    "submitit_job_per_chunk",
]


def sleep_item(x: int) -> int:
    time.sleep(ITEM_S)
    return x


def run_chunk(chunk: list[int]) -> list[int]:
    return [sleep_item(x) for x in chunk]


def _chunks(n: int, count: int) -> list[list[int]]:
    size = math.ceil(n / count)
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def child(row: str, n: int, partition: str, workdir: Path) -> dict[str, Any]:
    """Run one row; return its figures (the parent checks them)."""
    if row.startswith("paralela"):
        import paralela
        from paralela.backends import get_backend

        options = {
            "slurm_partition": partition,
            "slurm_job_dir": str(workdir / "jobs"),
            "timeout_min": 10,
            "cpus_per_task": 2 if row.endswith("2cpu") else 1,
        }
        if row.endswith("8jobs"):
            options["max_jobs"] = 8
        t0 = time.perf_counter()
        results = paralela.map(sleep_item, range(n), backend="slurm", backend_options=options)
        wall = time.perf_counter() - t0
        backend: Any = get_backend("slurm", None, options)
        assert results == list(range(n))
        return {
            "wall": wall,
            "items": n,
            "jobs": backend.tasks_submitted,
            "sbatch": backend.arrays_submitted,
        }

    import submitit

    executor = submitit.AutoExecutor(folder=str(workdir / "submitit" / "%j"))
    executor.update_parameters(
        slurm_partition=partition,
        timeout_min=10,
        cpus_per_task=1,
        mem_gb=1,
        slurm_array_parallelism=1000,
    )
    t0 = time.perf_counter()
    if row == "submitit_map_array":
        jobs = executor.map_array(sleep_item, list(range(n)))
        values = [j.result() for j in jobs]
        sbatch = 1
    else:
        jobs = [executor.submit(run_chunk, c) for c in _chunks(n, 128)]
        values = [v for j in jobs for v in j.result()]
        sbatch = len(jobs)
    wall = time.perf_counter() - t0
    assert values == list(range(n))
    return {"wall": wall, "items": n, "jobs": len(jobs), "sbatch": sbatch}


def queue_others() -> int:
    """Jobs of other sessions in the queue right now (the cluster is shared)."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    return sum(1 for name in out if name not in {"paralela", "submitit"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--submitit-items", type=int, default=1_000)
    parser.add_argument("--partition", default="debug")
    parser.add_argument("--only", default=",".join(ROWS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "slurm.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="/tmp/paralela-bench-slurm")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    if args.child:
        n = args.submitit_items if args.child == "submitit_map_array" else args.items
        print(json.dumps(child(args.child, n, args.partition, workdir / args.child)))
        return

    shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for row in args.only.split(","):
        print(f"{row} ...", file=sys.stderr, flush=True)
        load_before, others = os.getloadavg()[0], queue_others()
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                row,
                "--items",
                str(args.items),
                "--submitit-items",
                str(args.submitit_items),
                "--partition",
                args.partition,
                "--workdir",
                str(workdir),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
            cwd=workdir.parent,
        )
        if proc.returncode != 0:
            sys.exit(f"{row} failed:\n{proc.stderr[-4000:]}")
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        figures.update(row=row, load=(load_before + os.getloadavg()[0]) / 2, others=others)
        print(f"  {figures}", file=sys.stderr, flush=True)
        rows.append(figures)

    table = []
    for f in rows:
        per_item = f["wall"] / f["items"]
        projected = per_item * args.items
        ideal = args.items * ITEM_S / SLOTS
        measured = f"{sig(f['wall'])} ({f['items']:,} items)"
        table.append(
            [
                f"`{f['row']}`",
                measured,
                sig(projected),
                f"{ideal / projected:.0%}",
                f"{f['jobs']:,}" + (" *" if f["items"] < args.items else ""),
                str(f["sbatch"]),
                f"{f['load']:.2f}",
                str(f["others"]),
            ]
        )
    text = "\n".join(
        [
            "# Slurm benchmark: 10,000 items of 10 ms on the local cluster",
            "",
            "Generated by `python bench/bench_slurm.py` (see its docstring for the rows).",
            "",
            "## Machine and versions",
            "",
            *machine_lines(["submitit", "paralela"]),
            "- Cluster: Slurm 22.05 from Debian, 2 emulated nodes x 2 CPUs (4 slots) on the 2 "
            "cores above (`tools/local-slurm.sh`), `MaxArraySize=1001`",
            "- **The machine was shared**: other sessions ran tests (and Slurm jobs) while these "
            "rows ran; `load` is the 1-minute load average around each row, `other jobs` the "
            "jobs of others in the queue when it started. Treat differences under ~20 % as noise.",
            "",
            "## Results",
            "",
            f"Items sleep {ITEM_S * 1000:g} ms each; ideal wall = {args.items:,} x "
            f"{ITEM_S * 1000:g} ms / {SLOTS} slots = {args.items * ITEM_S / SLOTS:g} s; "
            "efficiency = ideal / wall. `*` = run on fewer items (one task per item: an array "
            "holds at most MaxArraySize-1 tasks, and 10,000 single-item tasks take most of an "
            "hour here), wall projected linearly to "
            f"{args.items:,} items; jobs for {args.items:,} items would be {args.items:,}.",
            "",
            md_table(
                [
                    "run",
                    "wall s (measured)",
                    f"wall s for {args.items:,}",
                    "efficiency",
                    "Slurm jobs (array tasks)",
                    "sbatch calls",
                    "load",
                    "other jobs",
                ],
                table,
            ),
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
