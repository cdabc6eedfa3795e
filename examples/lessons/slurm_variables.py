"""Lesson 12: Slurm's variables, and what paralela derives from them, without a cluster.

Inside a Slurm job every task is told who it is by environment variables:
``SLURM_PROCID`` (its rank), ``SLURM_NTASKS`` (how many tasks), ``SLURM_LOCALID`` and
``SLURM_NODEID`` (its place on and among the nodes), ``SLURM_JOB_NODELIST`` (the nodes,
compressed as ``gpu[01-04]``), ``SLURM_CPUS_PER_TASK``... A distributed program turns
them into a rank, a world size, the host of rank 0 and a port everyone agrees on.

This script sets those variables by hand, as ``srun`` would, for a few job shapes, and
asks paralela what it makes of them: ``paralela info --json`` (the command line, in a
child process with that environment) for what it reads, and
``paralela.distributed.slurm_spec`` for what ``paralela launch`` derives for each rank.
A malformed variable shows the error a job would get. Run::

    python examples/lessons/slurm_variables.py [--quick]

No cluster is needed; nothing is submitted. ``--quick`` runs fewer job shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import paralela
import paralela.distributed as pd


@dataclass
class Shape:
    """One job shape: the variables srun sets for one of its tasks."""

    title: str
    env: dict[str, str]
    nproc: int | None = None  # ranks per task (one task per node); None: a task is a rank
    local_rank: int = 0
    notes: list[str] = field(default_factory=list)


def shapes(quick: bool) -> list[Shape]:
    """``sbatch -N4 --ntasks-per-node 2``, ``-N2 --ntasks-per-node 1`` + ``--nproc 4``, ..."""
    common = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "4"}
    one_task_per_rank = Shape(
        "srun -N4 --ntasks-per-node 2 paralela launch train.py  (task 5 of 8)",
        {
            **common,
            "SLURM_JOB_NODELIST": "gpu[01-04]",
            "SLURM_STEP_NODELIST": "gpu[01-04]",
            "SLURM_NNODES": "4",
            "SLURM_NTASKS": "8",
            "SLURM_TASKS_PER_NODE": "2(x4)",
            "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "2",
        },
    )
    one_task_per_node = Shape(
        "srun -N2 --ntasks-per-node 1 paralela launch --nproc 4 train.py  (node 1, rank 3 of it)",
        {
            **common,
            "SLURM_CPUS_PER_TASK": "16",
            "SLURM_JOB_NODELIST": "cn[7,9]",
            "SLURM_STEP_NODELIST": "cn[7,9]",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS": "2",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_PROCID": "1",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
        },
        nproc=4,
        local_rank=3,
    )
    single = Shape(
        "srun -n1 paralela launch train.py  (one task)",
        {
            **common,
            "SLURM_JOB_NODELIST": "node001",
            "SLURM_STEP_NODELIST": "node001",
            "SLURM_NNODES": "1",
            "SLURM_NTASKS": "1",
            "SLURM_TASKS_PER_NODE": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
        },
    )
    return (
        [one_task_per_rank, one_task_per_node]
        if quick
        else [
            one_task_per_rank,
            one_task_per_node,
            single,
        ]
    )


def paralela_info(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``paralela info --json`` in a child process whose only SLURM_* variables are ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [sys.executable, "-m", "paralela", "info", "--json"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def show(shape: Shape) -> pd.RankSpec:
    """Print what ``paralela info`` reads and what ``paralela launch`` derives."""
    print(f"\n## {shape.title}")
    width = max(len(k) for k in shape.env)
    for key in sorted(shape.env):
        print(f"  {key:<{width}} = {shape.env[key]}")
    info = paralela_info(shape.env)
    if info.returncode != 0:
        raise SystemExit(f"paralela info failed ({info.returncode}): {info.stderr}")
    slurm = json.loads(info.stdout)["slurm"]
    spec = pd.slurm_spec(shape.env, nproc=shape.nproc, local_rank=shape.local_rank)
    rows = [
        ("paralela info: job", slurm["job_id"]),
        ("paralela info: nodes (expanded)", ", ".join(slurm["nodes"])),
        (
            "paralela info: task procid/localid/nodeid",
            f"{slurm['procid']} / {slurm['localid']} / {slurm['nodeid']}",
        ),
        ("paralela info: cpus per task", str(slurm["cpus_per_task"])),
        ("launch: RANK / WORLD_SIZE", f"{spec.rank} / {spec.world_size}"),
        ("launch: LOCAL_RANK / LOCAL_WORLD_SIZE", f"{spec.local_rank} / {spec.local_world_size}"),
        ("launch: node rank / nodes", f"{spec.node_rank} / {spec.nnodes}"),
        ("launch: MASTER_ADDR:MASTER_PORT", f"{spec.master_addr}:{spec.master_port}"),
        ("launch: host of every rank", " ".join(spec.rank_hosts)),
    ]
    label = max(len(r[0]) for r in rows)
    print(f"  {'what paralela derives':<{label}} | value")
    print(f"  {'-' * label}-|------")
    for name, value in rows:
        print(f"  {name:<{label}} | {value}")
    return spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer job shapes (CI)")
    args = parser.parse_args()

    specs = [show(shape) for shape in shapes(args.quick)]

    print("\n## A malformed variable: SLURM_NTASKS=eight")
    bad = paralela_info({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "eight", "SLURM_PROCID": "1"})
    print(f"  paralela info exits {bad.returncode}: {bad.stderr.strip()}")
    print("\n## A compressed node list, expanded (paralela.expand_nodelist)")
    for nodelist in ["gpu[01-04]", "cn[7,9]", "a[1-2],b[08-10]"]:
        print(f"  {nodelist:<16} -> {' '.join(paralela.expand_nodelist(nodelist))}")

    first = specs[0]
    print(
        f"\nRESULT: SLURM_PROCID=5 of SLURM_NTASKS=8 on gpu[01-04] -> RANK {first.rank} of "
        f"WORLD_SIZE {first.world_size} on {first.rank_hosts[first.rank]}, "
        f"MASTER_ADDR {first.master_addr}:{first.master_port} (port from SLURM_JOB_ID)"
    )
    print(
        "Conclusion: every rank computes the same world size, hosts and master port from "
        "its own variables, so the ranks find each other without exchanging a message."
    )
    return 0 if bad.returncode == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
