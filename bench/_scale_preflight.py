"""The preflight's own time in ``srun paralela launch`` on the scale cluster (issue 30).

::

    .venv/bin/python bench/_scale_preflight.py 8,16,32      (as root; ~1 min per size)

For each size a second local cluster (``_scale_cluster.py``) runs ``srun -N N paralela
launch _launch_work.py startup`` (one rank per node) with a ``sitecustomize`` on
``PYTHONPATH`` that times ``paralela.distributed._rendezvous.preflight`` in each rank's
bootstrap (the rendezvous every rank passes before the program runs) and writes
``preflight-<rank>.json``. Prints one JSON line per size: seconds from ``srun`` to
every rank past its first all-reduce, and each rank's preflight (min, median, max), and
from ``srun`` to the last rank's preflight start (the ranks' start-up on the 2 cores).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scale_cluster import ScaleCluster

LAUNCH_WORK = Path(__file__).resolve().parent / "_launch_work.py"

SITECUSTOMIZE = """
import os
if os.environ.get("PARALELA_PREFLIGHT_PORT") and os.environ.get("SCALE_PREFLIGHT_DIR"):
    import json, time
    import paralela.distributed._rendezvous as _r
    _real = _r.preflight
    def preflight(**kw):
        t0 = time.time()
        try:
            return _real(**kw)
        finally:
            path = os.path.join(os.environ["SCALE_PREFLIGHT_DIR"], f"preflight-{kw['rank']}.json")
            with open(path, "w") as fh:
                json.dump({"rank": kw["rank"], "start": t0, "end": time.time()}, fh)
    _r.preflight = preflight
"""


def run(n: int, workdir: Path) -> dict[str, object]:
    cluster = ScaleCluster(n)
    cluster.start()
    try:
        work = workdir / f"preflight-{n}"
        subprocess.run(["rm", "-rf", str(work)], check=True)
        (work / "site").mkdir(parents=True)
        (work / "stamps").mkdir()
        (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = cluster.env(work / "calls.log")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        env["PYTHONPATH"] = str(work / "site")
        env["SCALE_PREFLIGHT_DIR"] = str(work / "stamps")
        command = [
            "srun", "-N", str(n), "--ntasks-per-node=1", "--kill-on-bad-exit=1", "-t", "10",
            sys.executable, "-m", "paralela", "launch", str(LAUNCH_WORK), "startup",
            "--stamps", str(work / "stamps"),
        ]  # fmt: skip
        load = os.getloadavg()[0]
        t0 = time.time()
        proc = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
        ready = [
            json.loads(line)["t"]
            for path in (work / "stamps").glob("rank-*.jsonl")
            for line in path.read_text().splitlines()
            if '"ready"' in line
        ]
        flights = [json.loads(p.read_text()) for p in (work / "stamps").glob("preflight-*.json")]
        if proc.returncode != 0 or len(ready) != n or len(flights) != n:
            raise SystemExit(f"{n} ranks: exit {proc.returncode}:\n{proc.stderr[-2000:]}")
        own = [f["end"] - f["start"] for f in flights]
        return {
            "ranks": n,
            "srun_to_all_ranks_s": max(ready) - t0,
            "preflight_s": {"min": min(own), "median": statistics.median(own), "max": max(own)},
            "srun_to_last_preflight_start_s": max(f["start"] for f in flights) - t0,
            "last_start_to_all_met_s": max(f["end"] for f in flights)
            - max(f["start"] for f in flights),
            "load": (load + os.getloadavg()[0]) / 2,
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    finally:
        cluster.stop()


def main() -> None:
    sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8,16,32").split(",")]
    for n in sizes:
        print(json.dumps(run(n, Path("/tmp/paralela-bench-scale"))), flush=True)


if __name__ == "__main__":
    main()
