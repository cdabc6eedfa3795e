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

from paralela.sweeping._context import (
    FunctionTrialContext,
    NonFiniteReport,
    TrialPruned,
    set_function_context,
)

# Neither typing nor dataclasses (with inspect, ~10 ms) is imported at run time: each
# worker imports this module as it starts, while the driver opens the database.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

__all__ = ["FunctionJob", "TrialOutcome", "TrialSpec", "run_function_trial"]


class _Fields:
    """``repr`` and ``==`` from the fields named in ``_fields``, as a dataclass has."""

    _fields: tuple[str, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({shown})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)


class TrialSpec(_Fields):
    """One trial to run: its id and number in the study, its parameters, its log."""

    _fields = ("trial_id", "number", "params", "log_path")

    def __init__(self, trial_id: int, number: int, params: dict[str, Any], log_path: str):
        self.trial_id = trial_id
        self.number = number
        self.params = params
        self.log_path = log_path


class TrialOutcome(_Fields):
    """How a trial ended, as the runner saw it.

    ``state``: "COMPLETE", "PRUNED" or "FAIL". ``params``: a define-by-run trial's, as
    it sampled them. ``wrote``: whether the trial wrote to the study itself (a function
    trial's reports, a define-by-run trial's parameters): the driver then reads it back
    before telling its end (see DriverStorage); ``None``: not known (the driver made
    this outcome).
    """

    _fields = (
        "number",
        "state",
        "values",
        "started",
        "finished",
        "error",
        "exit_code",
        "devices",
        "pid",
        "slot",
        "params",
        "wrote",
    )

    def __init__(
        self,
        number: int,
        state: str,
        values: list[float] | None,
        started: float,
        finished: float,
        error: str | None = None,
        exit_code: int | None = None,
        devices: str | None = None,
        pid: int | None = None,
        slot: int | None = None,
        params: dict[str, Any] | None = None,
        wrote: bool | None = None,
    ):
        self.number = number
        self.state = state
        self.values = values
        self.started = started
        self.finished = finished
        self.error = error
        self.exit_code = exit_code
        self.devices = devices
        self.pid = pid
        self.slot = slot
        self.params = params
        self.wrote = wrote


class FunctionJob(_Fields):
    """What every function trial shares; sent once per worker.

    The pruner travels pickled (see paralela.backends.dumps), and the worker opens the
    study on the first report: a worker whose trials report nothing never imports Optuna
    (0.3-0.5 s of CPU each, spent while the first trials should start). A define-by-run
    objective (``objective(trial)``) samples its parameters in the worker, with the
    sweep's sampler (``sampler``, pickled; ``None`` for ``objective(params)``). ``wal``:
    the sweep's own database, in WAL mode: the worker commits as the driver does
    (``synchronous=NORMAL``, see paralela.studies.open_storage).
    """

    _fields = ("objective", "storage_spec", "study_name", "pruner", "sampler", "seed", "wal")

    def __init__(
        self,
        objective: Callable[..., Any],
        storage_spec: str,
        study_name: str,
        pruner: bytes,
        sampler: bytes | None = None,
        seed: int | None = None,
        wal: bool = False,
    ):
        self.objective = objective
        self.storage_spec = storage_spec
        self.study_name = study_name
        self.pruner = pruner
        self.sampler = sampler
        self.seed = seed
        self.wal = wal
        self._study: Any = None

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
                    import traceback  # (not at a worker's start: ~2 ms)

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
