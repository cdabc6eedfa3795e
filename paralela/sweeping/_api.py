"""``paralela.sweep``: a hyperparameter search that fills every slot it may use."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
from paralela.sweeping._results import SweepResult
from paralela.sweeping._trials import check_command

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


def _slots(
    workers: int | None,
    gpus: str | Sequence[int | str] | None,
    gpus_per_trial: int,
    trials_per_gpu: int,
    min_free_gpu_memory: float | None,
    notes: list[str],
) -> list[Slot]:
    from paralela.resources import detect, make_slots

    resources = detect()
    cpu_only = gpus in ("", "none", "cpu") or gpus_per_trial == 0
    if not cpu_only and (gpus is not None or resources.gpus):
        chosen = gpus
        if min_free_gpu_memory is not None:
            usable = [
                g
                for g in resources.gpus
                if g.memory_free is None or g.memory_free >= min_free_gpu_memory * 2**30
            ]
            skipped = [g for g in resources.gpus if g not in usable]
            if skipped:
                notes.append(
                    "skipped GPUs in use by others (less than "
                    f"{min_free_gpu_memory} GiB free): {', '.join(str(g.index) for g in skipped)}"
                )
            if not usable:
                raise ConfigError(
                    f"No GPU has {min_free_gpu_memory} GiB free; lower min_free_gpu_memory "
                    "or wait for the GPUs to free up."
                )
            wanted = (
                None
                if gpus is None
                else {str(g) for g in (gpus.split(",") if isinstance(gpus, str) else gpus)}
            )
            chosen = [g.index for g in usable if wanted is None or str(g.index) in wanted]
        slots = make_slots(
            resources, gpus_per_slot=gpus_per_trial, slots_per_gpu=trials_per_gpu, gpus=chosen
        )
        return slots[:workers] if workers else slots
    return make_slots(resources, n_slots=workers)


def _as_job_command(function: Any, command: list[str] | None) -> list[str]:
    """The command a trial's Slurm job runs: ``command``, or one that imports ``function``."""
    from paralela.sweeping._slurm_trials import function_command, importable_name

    return command if command is not None else function_command(importable_name(function))


def _local_only(
    gpus: Any, gpus_per_trial: int, trials_per_gpu: int, min_free_gpu_memory: float | None
) -> None:
    given = [
        name
        for name, value, default in (
            ("gpus", gpus, None),
            ("gpus_per_trial", gpus_per_trial, 1),
            ("trials_per_gpu", trials_per_gpu, 1),
            ("min_free_gpu_memory", min_free_gpu_memory, None),
        )
        if value != default
    ]
    if given:
        raise ConfigError(
            f"{given[0]} chooses this machine's GPUs; with backend='slurm' each trial's job "
            "asks Slurm for its own: backend_options={'gpus_per_task': N}."
        )


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
        n_trials, timeout: the trial budget and the time budget in seconds (trials
            running at the timeout finish). Earlier runs' trials count.
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
        gpus_per_trial, trials_per_gpu: GPUs per trial; trials sharing one GPU.
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
    command: list[str] | None = None
    function: Callable[..., Any] | None = None
    if isinstance(objective, (list, tuple)):
        command = [str(a) for a in objective]
    elif callable(objective):
        function = objective
    else:
        raise ConfigError(
            f"objective must be a function or a command (a list of strings), got "
            f"{type(objective).__name__}."
        )
    by_run = _define_by_run(function, space, define_by_run)
    space_ = Space(()) if space is None else as_space(space)
    identity = identify(function, command, space_)
    name = study_name or identity.default_name
    if backend == "slurm":
        if by_run:
            raise ConfigError(
                "An Optuna objective (objective(trial)) samples its parameters in its "
                "worker, on this machine's slots: run it with backend='processes', or give "
                "a space and write it as objective(params) for one Slurm job per trial."
            )
        command, function = _as_job_command(function, command), None
        _local_only(gpus, gpus_per_trial, trials_per_gpu, min_free_gpu_memory)
    elif backend != "processes":
        raise ConfigError(f"Unknown backend {backend!r}; valid backends are: processes, slurm.")
    elif backend_options:
        raise ConfigError(
            "backend_options are the Slurm jobs' options: add backend='slurm' (one job per "
            "trial), or leave them out."
        )
    directions = [direction] if isinstance(direction, str) else list(direction)
    for d in directions:
        if d not in DIRECTIONS:
            raise ConfigError(f"direction must be 'minimize' or 'maximize', got {d!r}.")
    grid = None
    queued: Sequence[Mapping[str, Any]] | None = space_.configurations  # trials to enqueue
    sampler_name = sampler if isinstance(sampler, str) else None
    if sampler_name is not None and sampler_name.lower() == "grid":
        if by_run:
            raise ConfigError(
                "sampler 'grid' enumerates a space given beforehand; an Optuna objective "
                "defines its parameters as it runs. Give the space (space=..., and "
                "objective(params)), or use Optuna's GridSampler(search_space) as sampler."
            )
        if space_.configurations is not None:
            raise ConfigError(
                "sampler 'grid' searches a space; a CSV of configurations already lists the "
                "trials. Leave the sampler out to run exactly its rows."
            )
        if space_.conditional:  # GridSampler cannot search it: its points are queued
            queued = _grid_queue(space_, n_trials)
            n_trials, sampler = len(queued) if n_trials is None else n_trials, "random"
        else:
            grid = space_.grid_axes()
            if n_trials is None and timeout is None:
                n_trials = len(space_.grid())
    if space_.configurations is not None and n_trials is None and timeout is None:
        n_trials = len(space_.configurations)
    check_budget(n_trials, timeout)
    if command is not None:
        check_command(command, space_.names)
    if max_failures is not None and max_failures < 0:
        raise ConfigError(f"max_failures must be 0 or more, got {max_failures!r}.")
    if trial_timeout is not None:
        if isinstance(trial_timeout, bool) or not isinstance(trial_timeout, (int, float)):
            raise ConfigError(f"trial_timeout must be a number of seconds, got {trial_timeout!r}.")
        if not trial_timeout > 0:
            raise ConfigError(f"trial_timeout must be more than 0 seconds, got {trial_timeout!r}.")
        if backend == "slurm":
            backend_options = _with_time_limit(backend_options, trial_timeout)

    optuna = import_optuna()
    sampler_obj = make_sampler(sampler, seed=seed, grid=grid) if sampler_name else sampler
    if pruner is None and by_run:  # as optuna.create_study(): its examples prune as published
        pruner_obj = optuna.pruners.MedianPruner()
    elif pruner is None or isinstance(pruner, str):
        pruner_obj = make_pruner(pruner)
    else:
        pruner_obj = pruner
    root = Path(run_dir) if run_dir is not None else Path("paralela-runs") / name
    with storage_errors(root):  # a full disk, a read-only run directory: one paragraph
        make_dirs(root / "trials")
        notes: list[str] = []
        choice = choose_storage(root, storage)
        if choice.note:
            notes.append(choice.note)
            print(f"paralela sweep: {choice.note}", file=sys.stderr)
        jobs = None
        if backend == "slurm":
            from paralela.sweeping._slurm_trials import DEFAULT_JOBS, SlurmTrials

            jobs = SlurmTrials(backend_options, ledger=root / "slurm-trials.jsonl")
            slots = [Slot("", (), index=i) for i in range(workers or DEFAULT_JOBS)]
        else:
            slots = _slots(
                workers, gpus, gpus_per_trial, trials_per_gpu, min_free_gpu_memory, notes
            )
        pool = None
        database = None
        try:
            if function is not None:  # the workers boot while the database opens
                from paralela.backends import make_backend

                pool = make_backend("processes", slots=slots)  # the sweep's own, shut down below
            database = open_storage(choice.spec, wal=storage is None)
            if storage is None and study_name is None:
                check_run_dir(database, root, name, identity)
            study = _open_study(
                optuna, database, name, choice.spec, sampler_obj, pruner_obj, directions
            )
            changed = check_identity(study, identity, named=study_name is not None)
            if changed:
                notes.append(changed)
                print(f"paralela sweep: {changed}", file=sys.stderr)
            recovered = recover_interrupted(study)
            if recovered:
                notes.append(f"re-running trials interrupted when a driver died: {recovered}")
            if queued is not None and not study.user_attrs.get(CONFIGS_ATTR):
                for configuration in queued:
                    study.enqueue_trial(dict(configuration))
                study.set_user_attr(CONFIGS_ATTR, True)
            counted = _counted(study)

            from paralela.sweeping._live import make_view

            view = make_view(
                progress, f"sweep {name}", -1.0 if directions[0] == "maximize" else 1.0
            )
            t0 = time.time()
            try:
                with sigterm_as_interrupt():  # scancel, a supervisor: as Ctrl-C
                    records, wall, busy = run_trials(
                        study=study,
                        distributions=space_.distributions(),
                        fixed=space_.fixed(),
                        objective=function,
                        command=command,
                        storage_spec=choice.spec,
                        slots=slots,
                        backend=pool,
                        budget=Budget(n_trials, timeout, max_failures, trial_timeout),
                        already_counted=counted,
                        log_dir=root / "trials",
                        budget_dir=root,
                        grace_period=grace_period,
                        on_change=view.update,
                        jobs=jobs,
                        define_by_run=by_run,
                        seed=seed,
                        sample=space_.sample if space_.conditional else None,
                    )
            except KeyboardInterrupt as exc:  # Ctrl-C: keep what ran, say how to go on
                interrupted = SweepResult(
                    study_name=name,
                    storage=choice.spec,
                    run_dir=root,
                    directions=directions,
                    trials=records_from_study(study, [], root / "trials", space_.fixed()),
                    wall_seconds=time.time() - t0,
                    slots=len(slots),
                    busy_fraction=0.0,
                    notes=notes,
                )
                write_outputs(interrupted, study, plots=False)
                add_note(
                    exc,
                    f"The sweep was interrupted: its trials so far are in {root / 'trials.csv'}; "
                    f"run it again (run_dir {str(root)!r}, study {name!r}) to continue, re-running "
                    "the trials that were cut short.",
                )
                raise
            finally:
                view.close()
            sync = getattr(study._storage, "sync", None)
            if sync is not None:  # read what others wrote (function trials' reports)
                sync(study._study_id)
            result = SweepResult(
                study_name=name,
                storage=choice.spec,
                run_dir=root,
                directions=directions,
                trials=records_from_study(study, records, root / "trials", space_.fixed()),
                wall_seconds=wall,
                slots=len(slots),
                busy_fraction=busy,
                notes=notes,
            )
            write_outputs(result, study, plots=plots)
            return result
        finally:
            if pool is not None:  # run_trials has shut it down, unless it never ran
                pool.shutdown(wait=False, cancel_futures=True)
            engine = getattr(database, "engine", None)
            if engine is not None:  # closes the database (SQLite: folds in and removes -wal)
                engine.dispose()


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
