"""One node's driver of ``bench_scale.py``'s packed sweep: run under ``srun -N N``, every
node runs ``paralela.sweep`` on the same run directory (on the shared filesystem), so N
drivers fill one SQLite study together, one trial per fake GPU of their node::

    srun -N 8 --ntasks-per-node=1 --gres=gpu:2 python bench/_scale_sweep.py RUN_DIR 1000

Each trial sleeps its parameter ``t`` (0.1 to 1 s). The drivers start their sweep together,
once every node's interpreter has imported what it needs (``_barrier``). The driver writes
``driver-<node>.json`` beside the stamps (srun would interleave long stdout lines), and
``<node>.prof``, a cProfile of what it did while it held the budget's lock. The JSON
holds its node, wall time, slots, busy fraction, the study's trial states, its errors,
and how long it waited for (and held) the run directory's lock that the shared budget
takes before each ask, each wait with its start (so the report can tell the start-up,
when the drivers also take that lock to open the study, from the steady state), the
time of the budget's count query inside it, and how long this driver held the same lock
to open (or create) the SQLite study.
"""

from __future__ import annotations

import cProfile
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


LOCK_WAITS: list[float] = []
LOCK_HOLDS: list[float] = []
LOCK_STARTS: list[float] = []  # time.time() at each ask's wait's start
COUNT_S: list[float] = []  # SharedBudget._counts(): the count query, under the lock
OPEN_HOLDS: list[float] = []  # the lock held by open_storage (creating the database)
PROFILE = cProfile.Profile()  # the budget lock's holds, saved beside the stamps


def _time_the_budget_lock() -> None:
    """Wrap the run directory's lock as the shared budget takes it before each ask, to
    time how long this driver waits for the others and how long it holds it."""
    import contextlib
    from collections.abc import Iterator

    import paralela.sweeping._budget as budget

    real = budget.locked

    @contextlib.contextmanager
    def timed(directory: Any) -> Iterator[None]:
        LOCK_STARTS.append(time.time())
        t0 = time.perf_counter()
        with real(directory):
            t1 = time.perf_counter()
            PROFILE.enable()  # what the driver does while it holds the lock
            try:
                yield
            finally:
                PROFILE.disable()
                LOCK_WAITS.append(t1 - t0)
                LOCK_HOLDS.append(time.perf_counter() - t1)

    budget.locked = timed

    real_counts = budget.SharedBudget._counts

    def counts(self: Any) -> tuple[int, int, bool | None]:
        t0 = time.perf_counter()
        try:
            return real_counts(self)
        finally:
            COUNT_S.append(time.perf_counter() - t0)

    budget.SharedBudget._counts = counts  # type: ignore[method-assign]

    import paralela.studies._study as study

    real_study_lock = study.locked

    @contextlib.contextmanager
    def timed_open(directory: Any) -> Iterator[None]:
        with real_study_lock(directory):
            t1 = time.perf_counter()
            try:
                yield
            finally:
                OPEN_HOLDS.append(time.perf_counter() - t1)

    study.locked = timed_open


def _barrier(out: str, node: int) -> float:
    """Wait until every node's driver has imported what it needs: the emulated nodes share
    2 cores, so 64 interpreters starting one after another would spread the drivers'
    first trials over ~20 s of start-up that a real cluster's nodes do side by side. The
    sweep call (opening the study, the first asks) starts after it. Seconds waited."""
    nodes = int(os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    with open(os.path.join(out, f"ready-{node}"), "w"):
        pass
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    while sum(name.startswith("ready-") for name in os.listdir(out)) < nodes:
        if time.monotonic() > deadline:
            raise SystemExit(f"node {node}: not every driver was ready within 600 s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def main() -> None:
    import optuna.storages  # noqa: F401  (what every driver imports before its sweep)
    import sqlalchemy.orm  # noqa: F401

    import paralela
    import paralela.sweeping._api

    _time_the_budget_lock()

    run_dir, trials = sys.argv[1], int(sys.argv[2])
    node = int(os.environ.get("SLURM_NODEID", "0"))
    out = os.path.dirname(os.environ["SCALE_STAMPS"])
    barrier_s = _barrier(out, node)
    released = time.time()
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
    PROFILE.dump_stats(os.path.join(out, f"{node}.prof"))
    # A file per driver: srun interleaves the tasks' long stdout lines.
    with open(os.path.join(out, f"driver-{node}.json"), "w") as fh:
        fh.write(
            json.dumps(
                {
                    "node": node,
                    "barrier_s": barrier_s,
                    "released": released,
                    "wall_s": time.perf_counter() - t0,
                    "error": error,
                    "lock_waits": len(LOCK_WAITS),
                    "lock_wait_s": sum(LOCK_WAITS),
                    "lock_wait_max_s": max(LOCK_WAITS, default=0.0),
                    "lock_hold_s": sum(LOCK_HOLDS),
                    "lock_hold_max_s": max(LOCK_HOLDS, default=0.0),
                    "count_s": sum(COUNT_S),
                    "open_hold_s": sum(OPEN_HOLDS),
                    "asks": [
                        [round(s, 4), round(w, 5), round(h, 5)]
                        for s, w, h in zip(LOCK_STARTS, LOCK_WAITS, LOCK_HOLDS, strict=False)
                    ],
                    **figures,
                }
            ),
        )


if __name__ == "__main__":
    main()
