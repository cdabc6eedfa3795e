"""What a sweep leaves in its run directory: trials.csv, trials.json and plots/*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paralela._files import batched_dir_syncs
from paralela.studies import INTERRUPTED_ATTR, UNUSED_ATTR
from paralela.sweeping._results import SweepResult, TrialRecord

__all__ = ["records_from_study", "save_plots", "write_outputs"]


def records_from_study(
    study: Any, this_run: list[TrialRecord], log_dir: Path, fixed: dict[str, Any]
) -> list[TrialRecord]:
    """Every trial of the study (earlier runs too), with this run's timings and slots,
    and the space's fixed values in every trial's parameters."""
    mine = {r.number: r for r in this_run}
    records = []
    for t in study.get_trials(deepcopy=False):
        if UNUSED_ATTR in t.system_attrs:
            continue
        record = mine.get(t.number)
        if record is None:
            error = t.system_attrs.get("paralela:error")
            if t.system_attrs.get(INTERRUPTED_ATTR):
                error = "interrupted: its driver died; queued again"
            log = log_dir / f"trial-{t.number:05d}.log"
            record = TrialRecord(
                t.number,
                t.state.name,
                None,
                dict(t.params),
                t.datetime_start.timestamp() if t.datetime_start else None,
                t.datetime_complete.timestamp() if t.datetime_complete else None,
                log_path=str(log) if log.exists() else None,
                error=error,
            )
        record.state = t.state.name
        record.values = list(t.values) if t.values is not None else None
        record.params = {**record.params, **t.params, **fixed}
        record.intermediate = dict(t.intermediate_values)
        records.append(record)
    return records


def save_plots(study: Any, directory: Path) -> tuple[list[Path], list[str]]:
    """Optimization history, parameter importances and intermediate values as PNG.

    Returns the files written and, for each plot that could not be drawn, why.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as ovm
    except ImportError:
        return [], ["plots need matplotlib: pip install 'paralela[sweep]'"]
    import warnings

    from optuna.exceptions import ExperimentalWarning
    from optuna.trial import TrialState

    directory.mkdir(parents=True, exist_ok=True)
    written, problems = [], []
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    plots: dict[str, Any] = {
        "optimization_history": ovm.plot_optimization_history,
        "param_importances": ovm.plot_param_importances,
        "intermediate_values": ovm.plot_intermediate_values,
    }
    if not complete:  # Optuna would draw empty axes and warn on the console
        return [], ["no trial completed"]
    for name, plot in plots.items():
        if name == "param_importances" and len(complete) < 2:
            problems.append(f"{name}: needs at least 2 completed trials")
            continue
        if name == "intermediate_values" and not any(t.intermediate_values for t in complete):
            problems.append(f"{name}: no trial reported intermediate values")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                if len(study.directions) > 1:
                    plot(study, target=lambda t: t.values[0], target_name="objective 0")
                else:
                    plot(study)
            path = directory / f"{name}.png"
            plt.gcf().savefig(path, dpi=100, bbox_inches="tight")
            written.append(path)
        except Exception as exc:  # a plot that cannot be drawn must not lose the sweep
            problems.append(f"{name}: {exc}")
        finally:
            plt.close("all")
    return written, problems


def write_outputs(result: SweepResult, study: Any, *, plots: bool = True) -> None:
    with batched_dir_syncs():  # each file synced and renamed whole; the directory once
        result.to_csv(result.run_dir / "trials.csv")
        result.to_json(result.run_dir / "trials.json")
    if not plots:
        return
    _, problems = save_plots(study, result.run_dir / "plots")
    result.notes.extend(f"plot not drawn: {p}" for p in problems)
