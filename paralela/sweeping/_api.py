"""``paralela.sweep``: a hyperparameter search that fills every slot it may use."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela._files import make_dirs
from paralela.backends import sigterm_as_interrupt
from paralela.errors import ConfigError, add_note
from paralela.resources import Slot
from paralela.space import Space, as_space
from paralela.studies import (
    DRIVER_ATTR,
    INTERRUPTED_ATTR,
    UNUSED_ATTR,
    choose_storage,
    driver_identity,
    import_optuna,
    make_pruner,
    make_sampler,
    open_storage,
    recover_interrupted,
    storage_errors,
)
from paralela.sweeping._budget import Budget, check_budget
from paralela.sweeping._driver import run_trials
from paralela.sweeping._identity import check_identity, check_run_dir, identify
from paralela.sweeping._objective import takes_trial
from paralela.sweeping._outputs import records_from_study, write_outputs
from paralela.sweeping._results import SweepResult, TrialRecord
from paralela.sweeping._slots import check_local_only, job_command, machine_slots
from paralela.sweeping._trials import check_command

if TYPE_CHECKING:
    from paralela.sweeping._slurm_trials import SlurmTrials

__all__ = ["sweep"]

CONFIGS_ATTR = "paralela:configurations_enqueued"
DIRECTIONS = ("minimize", "maximize")


def _with_time_limit(options: Mapping[str, Any] | None, seconds: float) -> dict[str, Any]:
    """The trials' job options with ``trial_timeout`` as their time limit (whole minutes)."""
    minutes = max(1, math.ceil(seconds / 60))
    given = dict(options or {})
    if given.get("timeout_min") not in (None, minutes):
        raise ConfigError(
            f"trial_timeout={seconds:g} s sets each trial's job's time limit ({minutes} min), "
            f"but backend_options also give timeout_min={given['timeout_min']}; give one."
        )
    return {**given, "timeout_min": minutes}


def sweep(
    objective: Callable[..., Any] | Sequence[str],
    space: Space | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    define_by_run: bool | None = None,
    n_trials: int | None = None,
    timeout: float | None = None,
    direction: str | Sequence[str] = "minimize",
    sampler: str | Any = "tpe",
    pruner: str | Any | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    study_name: str | None = None,
    storage: str | None = None,
    workers: int | None = None,
    gpus: str | Sequence[int | str] | None = None,
    gpus_per_trial: int = 1,
    trials_per_gpu: int = 1,
    min_free_gpu_memory: float | None = None,
    max_failures: int | None = None,
    trial_timeout: float | None = None,
    seed: int | None = None,
    progress: bool | None = None,
    grace_period: float = 5.0,
    plots: bool = True,
    backend: str = "processes",
    backend_options: Mapping[str, Any] | None = None,
) -> SweepResult:
    """Search hyperparameters with one trial per slot (GPU, or CPU share without GPUs).

    Args:
        objective: a function ``objective(params) -> value`` (run in a worker pinned to
            its slot; ``paralela.report(value, step)`` inside records intermediate
            values and raises ``TrialPruned`` when the pruner stops the trial); an
            Optuna objective ``objective(trial) -> value``, run unchanged
            (``trial.suggest_*``, ``trial.report``/``should_prune``, ``raise
            optuna.TrialPruned()``, ``set_user_attr``, sampled in its worker with the
            sweep's sampler); or a command as a list of strings with ``{name}``
            placeholders (any program; the parameters are also in
            ``$PARALELA_TRIAL_PARAMS`` as JSON; it calls ``paralela.report`` and its
            last report is its value).
        space: a :class:`Space`, a dict in the space-file format, or a YAML, TOML or
            CSV file (a CSV gives exactly its rows as trials). May be left out for an
            Optuna objective, which defines its space as it runs; given with one, its
            parameters are sampled first and ``trial.suggest_*`` returns them.
        define_by_run: whether the function takes an Optuna trial; by default, when
            its first parameter is named ``trial`` or annotated as an Optuna trial, or
            when no space is given.
        n_trials: the trial budget. Earlier runs' trials count.
        timeout: the time budget in seconds (trials running at the timeout finish).
        direction: ``"minimize"``, ``"maximize"``, or one per objective.
        sampler: ``"tpe"`` (default), ``"random"``, ``"grid"``, ``"cmaes"``, ``"gp"``,
            ``"nsga2"``, ``"nsga3"``, ``"qmc"``, or an Optuna sampler.
        pruner: ``"none"``, ``"median"``, ``"percentile"``, ``"halving"``,
            ``"hyperband"``, or an Optuna pruner. Default (``None``): no pruning; for an
            Optuna objective, Optuna's own default, ``MedianPruner()`` (as
            ``optuna.create_study()``; ``"none"`` turns it off). A pruned command's
            process group is stopped with SIGTERM, then SIGKILL after ``grace_period``
            seconds.
        run_dir: the sweep's directory (database, one log per trial, exports, plots);
            default ``paralela-runs/<study name>``. Running again continues the sweep;
            a run directory that holds another sweep (another objective or space) is
            refused, unless ``study_name`` is given.
        study_name: default ``<function or script name>-<8 hex digits>``, the digits
            hashing the objective and the space, so that two sweeps of functions both
            called ``objective`` never share a study. Continuing a study made for
            another objective or space is refused unless it is named here.
        storage: a database URL (``postgresql://...``) shared by several nodes, or
            ``journal:PATH``; default SQLite in ``run_dir`` (journal file on NFS & co).
        workers: at most this many trials at once (default: one per slot).
        gpus: restrict to these GPUs (``"0,2"``); ``"none"`` for CPU-only slots.
        gpus_per_trial: GPUs per trial.
        trials_per_gpu: trials sharing one GPU.
        min_free_gpu_memory: skip GPUs with less free memory (GiB) than this.
        max_failures: stop once more trials than this failed (:class:`SweepError`); the
            trials still running are stopped and queued again for the next run.
        trial_timeout: seconds one trial may run; a trial still running then is
            stopped (a command's process group: SIGTERM, then SIGKILL after
            ``grace_period``; a function trial: its worker is killed and replaced) and
            recorded as failed, "timed out after S s". Per-trial Slurm jobs get it as
            their time limit (``--time``, in whole minutes). ``timeout`` is the whole
            run's budget: the trials running when it ends finish.
        seed: the sampler's seed.
        progress: show the live table (default: on a terminal).
        plots: draw the PNG plots into ``run_dir/plots`` at the end (needs matplotlib;
            about a second for a few hundred trials).
        backend: ``"processes"`` (default): trials on this machine's slots.
            ``"slurm"``: one Slurm job per trial, at most ``workers`` (default 4)
            queued or running at once; this process stays the driver. A function
            objective must be importable on the compute nodes (a module on the shared
            filesystem); ``run_dir`` must be shared too (logs, reports).
        backend_options: the trial jobs' options with ``backend="slurm"``:
            ``cpus_per_task``, ``gpus_per_task``, ``mem_gb``, ``timeout_min``,
            ``slurm_partition``, ``slurm_account``, ``slurm_qos``,
            ``slurm_constraint``, ``slurm_additional``, ``slurm_job_name``,
            ``slurm_setup`` (shell lines before the command, e.g. ``module load``).

    Returns:
        A :class:`SweepResult`; its trials, leaderboard and plots are also written to
        ``run_dir`` (``trials.csv``, ``trials.json``, ``plots/*.png``).

    Raises:
        ConfigError: bad space, unknown sampler or pruner, command not found, no budget,
            impossible GPU request, unknown backend or backend option, no Slurm
            commands for ``backend="slurm"``; before any trial runs.
        SlurmCommandError: sbatch refused a trial's job (the message says why).
        SweepError: more than ``max_failures`` trials failed.
    """
    return _Sweep(_Args(**locals())).run()  # locals(): exactly the arguments, here


@dataclass
class _Args:
    """One ``sweep`` call's arguments, as given (:func:`sweep` documents them)."""

    objective: Callable[..., Any] | Sequence[str]
    space: Space | Mapping[str, Any] | str | os.PathLike[str] | None
    define_by_run: bool | None
    n_trials: int | None
    timeout: float | None
    direction: str | Sequence[str]
    sampler: str | Any
    pruner: str | Any | None
    run_dir: str | os.PathLike[str] | None
    study_name: str | None
    storage: str | None
    workers: int | None
    gpus: str | Sequence[int | str] | None
    gpus_per_trial: int
    trials_per_gpu: int
    min_free_gpu_memory: float | None
    max_failures: int | None
    trial_timeout: float | None
    seed: int | None
    progress: bool | None
    grace_period: float
    plots: bool
    backend: str
    backend_options: Mapping[str, Any] | None


class _Sweep:
    """One ``sweep`` call in named steps.

    ``__init__`` checks the input before anything is written (the objective, the backend,
    the directions, the sampler's plan, the budgets); :meth:`run` opens the run directory
    and the study, gets the slots and the workers, runs the trials (``_driver``) and
    writes the result.
    """

    def __init__(self, args: _Args) -> None:
        self.args = a = args
        self.command, self.function = _split_objective(a.objective)
        self.by_run = _define_by_run(self.function, a.space, a.define_by_run)
        self.space = Space(()) if a.space is None else as_space(a.space)
        self.identity = identify(self.function, self.command, self.space)
        self.name = a.study_name or self.identity.default_name
        self.backend_options = a.backend_options
        self.check_backend()
        self.directions = _directions(a.direction)
        self.n_trials = a.n_trials
        self.sampler = a.sampler
        self.sampler_name = a.sampler if isinstance(a.sampler, str) else None
        self.grid: Any = None
        self.queued: Sequence[Mapping[str, Any]] | None = self.space.configurations  # enqueued
        self.plan_trials()
        self.check_budgets()
        self.notes: list[str] = []

    # -- input checks ------------------------------------------------------------------

    def check_backend(self) -> None:
        """``"slurm"``: a command per trial's job; ``"processes"``: no job options."""
        a = self.args
        if a.backend == "slurm":
            if self.by_run:
                raise ConfigError(
                    "An Optuna objective (objective(trial)) samples its parameters in its "
                    "worker, on this machine's slots: run it with backend='processes', or "
                    "give a space and write it as objective(params) for one Slurm job per "
                    "trial."
                )
            self.command, self.function = job_command(self.function, self.command), None
            check_local_only(a.gpus, a.gpus_per_trial, a.trials_per_gpu, a.min_free_gpu_memory)
        elif a.backend != "processes":
            raise ConfigError(
                f"Unknown backend {a.backend!r}; valid backends are: processes, slurm."
            )
        elif a.backend_options:
            raise ConfigError(
                "backend_options are the Slurm jobs' options: add backend='slurm' (one job "
                "per trial), or leave them out."
            )

    def plan_trials(self) -> None:
        """The grid sampler's plan (its axes, or a conditional space's points queued), and
        the trial budget a grid or a CSV of configurations implies."""
        a, space = self.args, self.space
        if self.sampler_name is not None and self.sampler_name.lower() == "grid":
            if self.by_run:
                raise ConfigError(
                    "sampler 'grid' enumerates a space given beforehand; an Optuna objective "
                    "defines its parameters as it runs. Give the space (space=..., and "
                    "objective(params)), or use Optuna's GridSampler(search_space) as "
                    "sampler."
                )
            if space.configurations is not None:
                raise ConfigError(
                    "sampler 'grid' searches a space; a CSV of configurations already lists "
                    "the trials. Leave the sampler out to run exactly its rows."
                )
            if space.conditional:  # GridSampler cannot search it: its points are queued
                self.queued = _grid_queue(space, self.n_trials)
                self.n_trials = len(self.queued) if self.n_trials is None else self.n_trials
                self.sampler = "random"
            else:
                self.grid = space.grid_axes()
                if self.n_trials is None and a.timeout is None:
                    self.n_trials = len(space.grid())
        if space.configurations is not None and self.n_trials is None and a.timeout is None:
            self.n_trials = len(space.configurations)

    def check_budgets(self) -> None:
        """The trial and time budgets, the command, ``max_failures``, ``trial_timeout``."""
        a = self.args
        check_budget(self.n_trials, a.timeout)
        if self.command is not None:
            check_command(self.command, self.space.names)
        if a.max_failures is not None and a.max_failures < 0:
            raise ConfigError(f"max_failures must be 0 or more, got {a.max_failures!r}.")
        limit = a.trial_timeout
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, float)):
                raise ConfigError(f"trial_timeout must be a number of seconds, got {limit!r}.")
            if not limit > 0:
                raise ConfigError(f"trial_timeout must be more than 0 seconds, got {limit!r}.")
            if a.backend == "slurm":
                self.backend_options = _with_time_limit(self.backend_options, limit)

    # -- the run -----------------------------------------------------------------------

    def run(self) -> SweepResult:
        """Open the run directory, the study and the workers; run the trials; write the
        result. The workers and the database are let go however it ends."""
        a = self.args
        optuna = import_optuna()
        sampler = self.sampler
        if self.sampler_name:
            sampler = make_sampler(self.sampler, seed=a.seed, grid=self.grid)
        pruner = self.make_pruner(optuna)
        root = Path(a.run_dir) if a.run_dir is not None else Path("paralela-runs") / self.name
        with storage_errors(root):  # a full disk, a read-only run directory: one paragraph
            make_dirs(root / "trials")
            choice = choose_storage(root, a.storage)
            if choice.note:
                self.say(choice.note)
            jobs, slots = self.trial_slots(root)
            pool = None
            database = None
            try:
                if self.function is not None:  # the workers boot while the database opens
                    from paralela.backends import make_backend

                    pool = make_backend(  # the sweep's own, shut down below
                        "processes", slots=slots, preload=_worker_modules(self.function)
                    )
                database = open_storage(choice.spec, wal=a.storage is None)
                study = self.open_study(optuna, database, root, choice.spec, sampler, pruner)
                records, wall, busy = self.run_loop(study, choice.spec, root, slots, pool, jobs)
                sync = getattr(study._storage, "sync", None)
                if sync is not None:  # read what others wrote (function trials' reports)
                    sync(study._study_id)
                result = self.result(study, choice.spec, root, slots, records, wall, busy)
                write_outputs(result, study, plots=a.plots)
                if pool is not None:  # the workers exited meanwhile: wait for the last
                    pool.shutdown(wait=True)
                return result
            finally:
                if pool is not None:  # run_trials has shut it down, unless it never ran
                    pool.shutdown(wait=False, cancel_futures=True)
                engine = getattr(database, "engine", None)
                if engine is not None:  # closes the database (SQLite: folds in, removes -wal)
                    engine.dispose()

    def say(self, note: str) -> None:
        self.notes.append(note)
        print(f"paralela sweep: {note}", file=sys.stderr)

    def make_pruner(self, optuna: Any) -> Any:
        pruner = self.args.pruner
        if pruner is None and self.by_run:  # as optuna.create_study(): examples prune as published
            return optuna.pruners.MedianPruner()
        if pruner is None or isinstance(pruner, str):
            return make_pruner(pruner)
        return pruner

    def trial_slots(self, root: Path) -> tuple[SlurmTrials | None, list[Slot]]:
        """The slots trials run on: this machine's (GPUs, CPU shares), or one per Slurm job
        allowed at once (and the jobs' submitter)."""
        a = self.args
        if a.backend == "slurm":
            from paralela.sweeping._slurm_trials import DEFAULT_JOBS, SlurmTrials

            jobs = SlurmTrials(self.backend_options, ledger=root / "slurm-trials.jsonl")
            return jobs, [Slot("", (), index=i) for i in range(a.workers or DEFAULT_JOBS)]
        slots = machine_slots(
            a.workers, a.gpus, a.gpus_per_trial, a.trials_per_gpu, a.min_free_gpu_memory, self.notes
        )
        return None, slots

    def open_study(
        self, optuna: Any, database: Any, root: Path, spec: str, sampler: Any, pruner: Any
    ) -> Any:
        """Create or continue the study (refused if it is another sweep's); queue again
        what a dead driver left, and a CSV's configurations once."""
        a = self.args
        if a.storage is None and a.study_name is None:
            check_run_dir(database, root, self.name, self.identity)
        study = _open_study(optuna, database, self.name, spec, sampler, pruner, self.directions)
        changed = check_identity(study, self.identity, named=a.study_name is not None)
        if changed:
            self.say(changed)
        recovered = recover_interrupted(study)
        if recovered:
            self.notes.append(f"re-running trials interrupted when a driver died: {recovered}")
        if self.queued is not None and not study.user_attrs.get(CONFIGS_ATTR):
            for configuration in self.queued:
                study.enqueue_trial(dict(configuration))
            study.set_user_attr(CONFIGS_ATTR, True)
        return study

    def run_loop(
        self,
        study: Any,
        spec: str,
        root: Path,
        slots: list[Slot],
        pool: Any,
        jobs: SlurmTrials | None,
    ) -> tuple[list[TrialRecord], float, float]:
        """Run the trials (``_driver``) with the live table. Ctrl-C or SIGTERM: write the
        trials so far, say how to go on, raise."""
        a, space = self.args, self.space
        counted = _counted(study)

        from paralela.sweeping._live import make_view

        sign = -1.0 if self.directions[0] == "maximize" else 1.0
        view = make_view(a.progress, f"sweep {self.name}", sign)
        t0 = time.time()
        try:
            with sigterm_as_interrupt():  # scancel, a supervisor: as Ctrl-C
                return run_trials(
                    study=study,
                    distributions=space.distributions(),
                    fixed=space.fixed(),
                    objective=self.function,
                    command=self.command,
                    storage_spec=spec,
                    slots=slots,
                    backend=pool,
                    budget=Budget(self.n_trials, a.timeout, a.max_failures, a.trial_timeout),
                    already_counted=counted,
                    log_dir=root / "trials",
                    budget_dir=root,
                    grace_period=a.grace_period,
                    on_change=view.update,
                    jobs=jobs,
                    define_by_run=self.by_run,
                    seed=a.seed,
                    sample=space.sample if space.conditional else None,
                )
        except KeyboardInterrupt as exc:  # Ctrl-C: keep what ran, say how to go on
            interrupted = self.result(study, spec, root, slots, [], time.time() - t0, 0.0)
            write_outputs(interrupted, study, plots=False)
            add_note(
                exc,
                f"The sweep was interrupted: its trials so far are in {root / 'trials.csv'}; "
                f"run it again (run_dir {str(root)!r}, study {self.name!r}) to continue, "
                "re-running the trials that were cut short.",
            )
            raise
        finally:
            view.close()

    def result(
        self,
        study: Any,
        spec: str,
        root: Path,
        slots: list[Slot],
        records: list[TrialRecord],
        wall: float,
        busy: float,
    ) -> SweepResult:
        return SweepResult(
            study_name=self.name,
            storage=spec,
            run_dir=root,
            directions=self.directions,
            trials=records_from_study(study, records, root / "trials", self.space.fixed()),
            wall_seconds=wall,
            slots=len(slots),
            busy_fraction=busy,
            notes=self.notes,
        )


def _split_objective(objective: object) -> tuple[list[str] | None, Callable[..., Any] | None]:
    """(command, function): the objective is one or the other."""
    if isinstance(objective, (list, tuple)):
        return [str(a) for a in objective], None
    if callable(objective):
        return None, objective
    raise ConfigError(
        f"objective must be a function or a command (a list of strings), got "
        f"{type(objective).__name__}."
    )


def _directions(direction: str | Sequence[str]) -> list[str]:
    directions = [direction] if isinstance(direction, str) else list(direction)
    for d in directions:
        if d not in DIRECTIONS:
            raise ConfigError(f"direction must be 'minimize' or 'maximize', got {d!r}.")
    return directions


def _define_by_run(function: Callable[..., Any] | None, space: object, given: bool | None) -> bool:
    """Whether the objective samples its own parameters (an Optuna objective)."""
    if function is None:
        if given:
            raise ConfigError(
                "define_by_run=True is for a function objective(trial); a command gets its "
                "parameters from the space."
            )
        if space is None:
            raise ConfigError(
                "A command objective needs a space: give space= (a YAML, TOML or CSV file, "
                "or a mapping) with the parameters its {name} placeholders use."
            )
        return False
    if given is None:
        return takes_trial(function, space_given=space is not None)
    if not given and space is None:
        raise ConfigError(
            "objective(params) needs a space to sample the params from: give space=, or "
            "let the objective take an Optuna trial (define_by_run=True)."
        )
    return bool(given)


def _grid_queue(space: Space, n_trials: int | None) -> list[dict[str, Any]]:
    """A conditional space's grid as trials to enqueue (top-level fixed values left out,
    as trials never store them)."""
    fixed = space.fixed()
    points = [{k: v for k, v in p.items() if k not in fixed} for p in space.grid()]
    if n_trials is not None and n_trials > len(points):
        raise ConfigError(
            f"The grid of this conditional space has {len(points)} points; n_trials="
            f"{n_trials} would run trials past its end. Leave n_trials out to run each "
            "point once, or give at most that many."
        )
    return points


def _worker_modules(objective: Callable[..., Any]) -> list[str]:
    """What a function trial's worker imports: the trial runner, and the objective's
    module when the objective travels by name (not ``__main__``'s: those go by value).
    Imported as each worker starts, while the driver opens the database (a model's
    module that imports torch takes seconds), instead of on its first trial."""
    modules = ["paralela.sweeping._worker_trial"]
    module = getattr(objective, "__module__", None)
    if isinstance(module, str) and module != "__main__" and module in sys.modules:
        modules.append(module)
    return modules


def _open_study(
    optuna: Any,
    database: Any,
    name: str,
    spec: str,
    sampler: Any,
    pruner: Any,
    directions: list[str],
) -> Any:
    """Create or continue the study; the driver sees an RDB through a :class:`DriverStorage`."""
    from paralela.sweeping._cache import DriverStorage

    storage = database
    if isinstance(database, optuna.storages.RDBStorage):
        storage = DriverStorage(database, new_trial_attrs={DRIVER_ATTR: driver_identity()})
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            directions=directions,
            load_if_exists=True,
        )
    except ValueError as exc:
        raise ConfigError(
            f"The study {name!r} in {spec} cannot be continued as asked: {exc}. Use "
            "the same direction(s) as before, or another run_dir / study name."
        ) from exc
    # Optuna loads an existing study whatever direction is asked: refuse a mismatch here.
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise ConfigError(
            f"The study {name!r} in {spec} was started with direction(s) "
            f"{', '.join(stored)}, not {', '.join(directions)}. Use the same direction(s) as "
            "before, or another run_dir / study name."
        )
    return study


def _counted(study: Any) -> int:
    """Trials that count against the budget: ended, and not an interrupted or unused one."""
    from optuna.trial import TrialState

    ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=ended)
        if INTERRUPTED_ATTR not in t.system_attrs and UNUSED_ATTR not in t.system_attrs
    )
