"""One node's driver of ``bench_scale.py``'s packed sweep: run under ``srun -N N``, every
node runs ``paralela.sweep`` on the same run directory (on the shared filesystem), so N
drivers fill one SQLite study together, one trial per fake GPU of their node::

    srun -N 8 --ntasks-per-node=1 --gres=gpu:2 python bench/_scale_sweep.py RUN_DIR 1000

Each trial sleeps its parameter ``t`` (0.1 to 1 s). The driver prints one JSON line:
its node, wall time, slots, busy fraction, the trials it ran, and its errors.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def objective(params: dict[str, Any]) -> float:
    t0 = time.time()
    time.sleep(params["t"])
    line = f"{os.environ.get('SLURM_NODEID', '0')} {t0} {time.time()}\n"
    with open(os.environ["SCALE_STAMPS"], "a") as fh:  # O_APPEND: lines never interleave
        fh.write(line)
    return float(params["t"])


def main() -> None:
    import paralela

    run_dir, trials = sys.argv[1], int(sys.argv[2])
    node = int(os.environ.get("SLURM_NODEID", "0"))
    t0 = time.perf_counter()
    error = ""
    try:
        result = paralela.sweep(
            objective,
            {"t": {"type": "float", "low": 0.1, "high": 1.0}},
            n_trials=trials,
            run_dir=run_dir,
            study_name="scale",
            sampler="random",
            seed=node,
            plots=False,
            progress=False,
        )
        states: dict[str, int] = {}
        for trial in result.trials:
            states[trial.state] = states.get(trial.state, 0) + 1
        figures = {"slots": result.slots, "busy": result.busy_fraction, "states": states}
    except Exception as exc:  # reported, not hidden: the benchmark counts errors
        error = f"{type(exc).__name__}: {exc}"
        figures = {}
    print(
        json.dumps({"node": node, "wall_s": time.perf_counter() - t0, "error": error, **figures}),
        flush=True,
    )


if __name__ == "__main__":
    main()
