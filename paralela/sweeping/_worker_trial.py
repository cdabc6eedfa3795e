"""A function trial's worker side: what a worker process imports to run one.

The driver sends :class:`FunctionJob` once per worker and :func:`run_function_trial` with
a :class:`TrialSpec` for each trial (``sweeping._trials`` has the driver's side and the
command trials). Kept apart, with light imports, so that a worker's first trial does not
import json, pathlib, subprocess and the command trials' code: ~17-21 ms of CPU per
worker on the benchmark's 2-core VM (``bench/bench_sweep.py``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback  # loaded already in a worker (its error handling)
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from paralela.sweeping._context import (
    FunctionTrialContext,
    NonFiniteReport,
    TrialPruned,
    set_function_context,
)

__all__ = ["FunctionJob", "TrialOutcome", "TrialSpec", "run_function_trial"]


@dataclass(frozen=True)
class TrialSpec:
    trial_id: int
    number: int
    params: dict[str, Any]
    log_path: str


@dataclass
class TrialOutcome:
    """How a trial ended, as the runner saw it."""

    number: int
    state: str  # "COMPLETE", "PRUNED" or "FAIL"
    values: list[float] | None
    started: float
    finished: float
    error: str | None = None
    exit_code: int | None = None
    devices: str | None = None
    pid: int | None = None
    slot: int | None = None
    params: dict[str, Any] | None = None  # a define-by-run trial's, as it sampled them
    # Whether the trial wrote to the study itself (a function trial's reports, a
    # define-by-run trial's parameters): the driver then reads it back before telling its
    # end (see DriverStorage). None: not known (the driver made this outcome).
    wrote: bool | None = None


@dataclass
class FunctionJob:
    """What every function trial shares; sent once per worker.

    The pruner travels pickled, and the worker opens the study on the first report: a
    worker whose trials report nothing never imports Optuna (0.3-0.5 s of CPU each,
    spent while the first trials should start).
    """

    objective: Callable[..., Any]
    storage_spec: str
    study_name: str
    pruner: bytes  # the sweep's Optuna pruner, pickled (see paralela.backends.dumps)
    # A define-by-run objective (``objective(trial)``) samples its parameters in the
    # worker, with the sweep's sampler (pickled; ``None`` for ``objective(params)``).
    sampler: bytes | None = None
    seed: int | None = None
    # The sweep's own database, in WAL mode: the worker commits as the driver does
    # (``synchronous=NORMAL``, see paralela.studies.open_storage).
    wal: bool = False
    _study: Any = field(default=None, repr=False)

    @property
    def define_by_run(self) -> bool:
        return self.sampler is not None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_study": None}

    def study(self) -> Any:
        """The study, opened once per worker, with the sweep's pruner."""
        if self._study is None:
            import optuna

            from paralela.backends import loads
            from paralela.studies import open_storage
            from paralela.sweeping._worker_storage import worker_storage

            sampler = None if self.sampler is None else loads(self.sampler)
            if sampler is not None and self.seed is None:
                # Every worker unpickles the same random state: without this, two workers
                # sampling on the same history would draw the same parameters.
                sampler.reseed_rng()
            self._study = optuna.load_study(
                study_name=self.study_name,
                storage=worker_storage(
                    open_storage(self.storage_spec, checked=True, wal=self.wal), wal=self.wal
                ),
                pruner=loads(self.pruner),
                sampler=sampler,
            )
        return self._study

    def trial(self, trial_id: int, number: int) -> Any:
        """The Optuna trial a define-by-run objective is given (the trial the driver
        asked): its ``suggest_*`` calls sample in this worker and write to the study."""
        import optuna

        study = self.study()
        if self.seed is not None:  # the same seed and history draw the same parameters
            _seed_sampler(study.sampler, (self.seed * 1_000_003 + number) % 2**32)
        # Optuna's cached storage writes only to trials it has read: read the new ones
        # (the driver asked this one after the worker last looked).
        study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return optuna.trial.Trial(study, trial_id)


def _seed_sampler(sampler: Any, seed: int) -> None:
    """Seed an Optuna sampler's random state and its inner samplers' (TPE's startup
    sampler, a GP's or CMA-ES's independent one) for one trial."""
    rng = getattr(sampler, "_rng", None)
    inner_rng = getattr(rng, "rng", None)
    if inner_rng is not None:
        inner_rng.seed(seed)
    for name in ("_random_sampler", "_independent_sampler"):
        inner = getattr(sampler, name, None)
        if inner is not None and inner is not sampler:
            _seed_sampler(inner, seed)


def _values(result: Any) -> list[float]:
    if isinstance(result, (list, tuple)):
        return [float(v) for v in result]
    return [float(result)]


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def run_function_trial(job: FunctionJob, spec: TrialSpec) -> TrialOutcome:
    """Run one function trial in this (worker) process. Never raises for the trial's sake."""
    context = FunctionTrialContext(job.study, spec.trial_id, spec.number, spec.params)
    started = time.time()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    set_function_context(context)
    state, values, error = "COMPLETE", None, None
    trial = None
    try:
        with _output_to(spec.log_path):
            try:
                if job.define_by_run:
                    trial = job.trial(spec.trial_id, spec.number)
                    result = job.objective(trial)
                else:
                    result = job.objective(dict(spec.params))
                if result is None and context.last_value is None:
                    state = "FAIL"
                    error = (
                        "the objective returned None and reported nothing; return the "
                        "value to optimise or call paralela.report(value)"
                    )
                else:
                    values = _values(result if result is not None else context.last_value)
            except TrialPruned:
                state = "PRUNED"
            except NonFiniteReport as exc:
                state, error = "FAIL", str(exc)
                print(f"paralela: {error}", file=sys.stderr)
            except BaseException as exc:  # KeyboardInterrupt too: workers ignore SIGINT, so
                # the objective raised it itself; a failed trial, not Ctrl-C
                if _optuna_pruned(exc):  # ``raise optuna.TrialPruned()``
                    state = "PRUNED"
                else:
                    state = "FAIL"
                    error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                    print(error, file=sys.stderr)
    finally:
        set_function_context(None)
    params = None
    if trial is not None:
        with contextlib.suppress(Exception):  # the driver reads them from the study anyway
            params = dict(trial.params)
    slot = os.environ.get("PARALELA_SLOT")  # set by the processes backend for its slot
    return TrialOutcome(
        spec.number,
        state,
        values,
        started,
        time.time(),
        error,
        None,
        devices,
        os.getpid(),
        None if slot is None else int(slot),
        params,
        wrote=trial is not None or context.wrote,
    )


def _optuna_pruned(exc: BaseException) -> bool:
    """``exc`` is Optuna's ``TrialPruned`` (``raise optuna.TrialPruned()`` in an
    objective written for Optuna); Optuna is imported already if so."""
    optuna = sys.modules.get("optuna")
    return optuna is not None and isinstance(exc, optuna.TrialPruned)
