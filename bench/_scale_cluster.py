"""A second local Slurm cluster of N emulated nodes for ``bench_scale.py``, and the
scheduler calls a driver makes, counted.

::

    ScaleCluster(nodes=16).start()   tools/local-slurm.sh start with its own dir, conf,
                                     port (7817) and node names scale1..16; no accounting
    cluster.env(calls_log)           SLURM_CONF=<its conf>, PATH=<wrappers>:$PATH
        wrappers/sbatch, squeue, sacct, scontrol, scancel:
            append "<start> <end> <ppid> <name> <args...>" to $SCALE_CALLS_LOG, exit as
            the real command did
    read_calls(log, pid)             the calls made by one process (the driver), with
                                     each call's latency
    cluster.stop()                   stop --purge: daemons, state, /etc/hosts line

The shared 2-node cluster (``/etc/slurm/slurm.conf``, port 6817, nodes node1..2) is
never touched: everything here names its own directory, config and port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "local-slurm.sh"
COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")

WRAPPER = """#!/bin/bash
# bench_scale.py: log this call (start, end, parent pid, command line), run the real one.
t0=$(date +%s.%N)
"{real}" "$@"
rc=$?
echo "$t0 $(date +%s.%N) $PPID {name} $*" >> "$SCALE_CALLS_LOG"
exit $rc
"""


@dataclass
class ScaleCluster:
    """A local Slurm cluster of ``nodes`` emulated nodes, beside the shared one."""

    nodes: int
    cpus: int = 2
    gpus: int = 2
    directory: Path = Path("/tmp/scale-slurm")
    port: int = 7817

    @property
    def conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    def knobs(self) -> dict[str, str]:
        return {
            "LOCAL_SLURM_NODES": str(self.nodes),
            "LOCAL_SLURM_NODE_PREFIX": "scale",
            "LOCAL_SLURM_DIR": str(self.directory),
            "LOCAL_SLURM_CONF": str(self.conf),
            "LOCAL_SLURM_CTLD_PORT": str(self.port),
            "LOCAL_SLURM_ACCOUNTING": "0",
            "LOCAL_SLURM_GPUS": str(self.gpus),
            "LOCAL_SLURM_CPUS": str(self.cpus),
            "LOCAL_SLURM_MEM_MB": "1000",
            "LOCAL_SLURM_FORCE": "1",
            "LOCAL_SLURM_TIMEOUT": "180",
        }

    def _script(self, *args: str) -> None:
        env = {**os.environ, **self.knobs()}
        env.pop("SLURM_CONF", None)
        subprocess.run(["bash", str(SCRIPT), *args], env=env, check=True, timeout=600)

    def start(self) -> None:
        """Start it (after removing any earlier one of another size: node names change)."""
        (self.directory / "etc").mkdir(parents=True, exist_ok=True)
        self._script("start")

    def stop(self) -> None:
        if self.conf.exists():
            self._script("stop", "--purge")

    def env(self, calls_log: Path) -> dict[str, str]:
        """The environment of a driver using this cluster, its Slurm calls logged."""
        wrappers = calls_log.parent / "wrappers"
        wrappers.mkdir(parents=True, exist_ok=True)
        for name in COMMANDS:
            real = shutil.which(name)
            if real is None:
                raise RuntimeError(f"{name} is not on PATH: is Slurm installed?")
            tool = wrappers / name
            tool.write_text(WRAPPER.format(real=real, name=name))
            tool.chmod(0o755)
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PATH": f"{wrappers}{os.pathsep}{os.environ['PATH']}",
            "SCALE_CALLS_LOG": str(calls_log),
        }


@dataclass(frozen=True)
class Call:
    start: float
    end: float
    ppid: int
    name: str
    args: str

    @property
    def latency(self) -> float:
        return self.end - self.start


def read_calls(log: Path, pid: int | None = None) -> list[Call]:
    """The logged calls (of the process ``pid`` only, when given), oldest first."""
    calls = []
    if not log.exists():
        return calls
    for line in log.read_text().splitlines():
        parts = line.split(" ", 4)
        if len(parts) < 4:
            continue
        args = parts[4] if len(parts) > 4 else ""
        call = Call(float(parts[0]), float(parts[1]), int(parts[2]), parts[3], args)
        if pid is None or call.ppid == pid:
            calls.append(call)
    return sorted(calls, key=lambda c: c.start)
