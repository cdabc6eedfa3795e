"""The function trials' view of the study in their worker (sweeping/_worker_storage.py):
one SQL statement per report, and a read of the database only when it changed. What it
writes is what Optuna writes; what it reads is what Optuna reads, changes by other
processes included."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from paralela.studies import open_storage  # noqa: E402
from paralela.sweeping._worker_storage import WorkerStorage, worker_storage  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _driver_study(path: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="s", storage=open_storage(f"sqlite:///{path}", wal=True))


def _worker_study(path: Path) -> optuna.Study:
    storage = worker_storage(open_storage(f"sqlite:///{path}", checked=True, wal=True), wal=True)
    assert isinstance(storage, WorkerStorage)
    return optuna.load_study(
        study_name="s", storage=storage, pruner=optuna.pruners.MedianPruner(n_startup_trials=1)
    )


def _in_another_process(path: Path, code: str) -> None:
    """Run ``code`` with ``study`` (Optuna's own storage on the database) in a new process."""
    script = textwrap.dedent(
        f"""
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name="s", storage="sqlite:///{path}")
        """
    ) + textwrap.dedent(code)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_reports_are_stored_as_optuna_stores_them(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    driver = _driver_study(path)
    asked = driver.ask()
    worker = _worker_study(path)
    worker.get_trials(states=(TrialState.RUNNING,))  # as FunctionJob.trial does
    trial = optuna.trial.Trial(worker, asked._trial_id)
    values = {0: 1.5, 1: float("inf"), 2: -0.25, 7: 3.0}
    for step, value in values.items():
        trial.report(value, step)
    # Read back by Optuna's own storage, in a fresh process's view: the same values.
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{path}")
    assert fresh.trials[0].intermediate_values == values
    # And the worker's own view has them without reading the database again.
    (mine,) = worker.get_trials(states=(TrialState.RUNNING,))
    assert mine.intermediate_values == values


def test_a_report_to_a_finished_trial_is_refused_as_optuna_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    driver = _driver_study(path)
    asked = driver.ask()
    worker = _worker_study(path)
    worker.get_trials(states=(TrialState.RUNNING,))
    trial = optuna.trial.Trial(worker, asked._trial_id)
    trial.report(1.0, 0)
    driver.tell(asked, state=TrialState.FAIL)  # the driver gave up on it (Ctrl-C, time)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        trial.report(2.0, 1)
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{path}")
    assert fresh.trials[0].intermediate_values == {0: 1.0}


def test_the_cache_sees_what_another_process_changed(tmp_path: Path) -> None:
    """A trial another process finished, and a report another process made to a running
    trial, are in the worker's next reads: for the finished trials a pruner reads, and
    for all trials."""
    path = tmp_path / "study.db"
    _driver_study(path)
    worker = _worker_study(path)
    assert worker.get_trials(states=(TrialState.COMPLETE,)) == []
    assert worker.get_trials() == []
    _in_another_process(
        path,
        """
        t = study.ask()
        t.report(0.5, 0)
        study.tell(t, 0.5)
        running = study.ask()
        running.report(9.0, 0)
        """,
    )
    (complete,) = worker.get_trials(states=(TrialState.COMPLETE,))
    assert (complete.value, complete.intermediate_values) == (0.5, {0: 0.5})
    trials = worker.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.RUNNING]
    assert trials[1].intermediate_values == {0: 9.0}
    # Nothing changed since: the same answer (from the cache).
    assert [t.intermediate_values for t in worker.get_trials()] == [{0: 0.5}, {0: 9.0}]
    # Another report to the running trial, by the other process: read again.
    _in_another_process(
        path,
        """
        (running,) = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        study._storage.set_trial_intermediate_value(running._trial_id, 1, 8.0)
        """,
    )
    assert worker.get_trials()[1].intermediate_values == {0: 9.0, 1: 8.0}


def test_the_pruner_sees_a_trial_that_another_process_finished(tmp_path: Path) -> None:
    """The median pruner's reads skip the database while no trial finished; once another
    process finishes a better trial, the next should_prune sees it and prunes."""
    path = tmp_path / "study.db"
    driver = _driver_study(path)
    asked = driver.ask()
    worker = _worker_study(path)
    worker.get_trials(states=(TrialState.RUNNING,))
    trial = optuna.trial.Trial(worker, asked._trial_id)
    trial.report(10.0, 0)
    assert not trial.should_prune()  # no finished trial to compare with
    _in_another_process(
        path,
        """
        t = study.ask()
        t.report(1.0, 0)
        t.report(1.0, 1)
        study.tell(t, 1.0)
        """,
    )
    trial.report(10.0, 1)
    assert trial.should_prune()  # worse than the median of the finished trials


def test_other_databases_keep_optunas_storage(tmp_path: Path) -> None:
    journal = open_storage(f"journal:{tmp_path / 'study.journal'}")
    assert worker_storage(journal, wal=False) is journal
    memory = optuna.storages.RDBStorage("sqlite:///:memory:")
    assert worker_storage(memory, wal=False) is memory
