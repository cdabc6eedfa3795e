"""``n_trials`` is the budget over all runs: two drivers started at once on one run
directory together run exactly ``n_trials`` trials. Real drivers (``paralela sweep``
processes), real trial processes, one real SQLite database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sweep_helpers import command, write_script

pytestmark = pytest.mark.timeout(120)

TRIAL = """\
import time
time.sleep(0.4)
paralela.report(paralela.current_params()["x"])
"""


def test_two_drivers_on_one_run_directory_share_the_trial_budget(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    script = write_script(tmp_path, "train.py", TRIAL)
    argv = [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml"]
    argv += ["--trials", "7", "--workers", "2", "--run-dir", "run", "--json"]
    argv += ["--", *command(script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    drivers = [
        subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [d.communicate(timeout=100) for d in drivers]
    for driver, (_, err) in zip(drivers, outputs, strict=True):
        assert driver.returncode == 0, err
    (name,) = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    ran = [t for t in study.trials if "paralela:unused" not in t.system_attrs]
    assert len(ran) == 7, [(t.number, t.state) for t in study.trials]
    assert {t.state for t in ran} == {TrialState.COMPLETE}
    drivers_seen = {t.system_attrs.get("paralela:driver") for t in ran}
    assert len(drivers_seen) == 2  # both drivers ran trials: they did run at once
    last = json.loads(outputs[-1][0])
    assert len([t for t in last["trials"] if t["state"] == "COMPLETE"]) <= 7


class _LockWatchingSampler(optuna.samplers.RandomSampler):
    """Records, each time it samples, whether the run directory's lock is free then."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(seed=0)
        self.run_dir = run_dir
        self.lock_free: list[bool] = []

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        import fcntl

        fd = os.open(self.run_dir / ".paralela.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:  # flock locks belong to an open file: this one conflicts with the driver's
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.lock_free.append(True)
        except BlockingIOError:
            self.lock_free.append(False)
        finally:
            os.close(fd)
        return super().sample_independent(study, trial, name, distribution)


def _objective(params: dict[str, float]) -> float:
    return params["x"]


def test_a_driver_samples_outside_the_run_directorys_lock(tmp_path: Path) -> None:
    """The lock is held only to count the claimed trials and reserve one: the sampler
    (which reads every trial of the study) runs after it is let go, so drivers sharing a
    run directory do not queue for the lock while one samples (64 drivers did)."""
    import paralela

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sampler = _LockWatchingSampler(run_dir)
    result = paralela.sweep(
        _objective,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=4,
        workers=1,
        sampler=sampler,
        run_dir=run_dir,
        progress=False,
        plots=False,
    )
    assert len(result.completed) == 4, result.trials
    assert len(sampler.lock_free) >= 4
    assert all(sampler.lock_free), sampler.lock_free


def test_a_driver_reads_the_study_back_outside_the_run_directorys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reserving a trial under the lock does not read the other drivers' trials back
    from the database (the driver's storage does that every few seconds, and with 64
    drivers each read of every unfinished trial under the lock made the others queue):
    it asks the database only whether the study has a queued trial to take."""
    import fcntl

    import paralela
    from paralela.sweeping._cache import DriverStorage

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock_free: list[bool] = []
    read = DriverStorage._read_trials_from_remote_storage

    def watched(self: DriverStorage, study_id: int) -> None:
        fd = os.open(run_dir / ".paralela.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock_free.append(True)
        except BlockingIOError:
            lock_free.append(False)
        finally:
            os.close(fd)
        read(self, study_id)

    monkeypatch.setattr(DriverStorage, "_read_trials_from_remote_storage", watched)
    # Read the study back on every read (5 s apart by default): each chance to do it
    # under the lock is taken.
    defaults = {**(DriverStorage.__init__.__kwdefaults__ or {}), "sync_seconds": 0.0}
    monkeypatch.setattr(DriverStorage.__init__, "__kwdefaults__", defaults)
    result = paralela.sweep(
        _objective,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=4,
        workers=1,
        sampler="random",
        run_dir=run_dir,
        progress=False,
        plots=False,
    )
    assert len(result.completed) == 4, result.trials
    assert lock_free, "the driver never read the study back"
    assert all(lock_free), lock_free


def test_trials_queued_in_the_study_are_still_taken_under_the_shared_budget(
    tmp_path: Path,
) -> None:
    """A driver that no longer reads the study back under the lock still takes the
    trials queued in it (a CSV's rows, a re-run) before making new ones, in order."""
    import paralela

    space = tmp_path / "configs.csv"
    space.write_text("x\n0.75\n0.25\n0.5\n")
    result = paralela.sweep(
        _objective, space, workers=1, run_dir=tmp_path / "run", progress=False, plots=False
    )
    assert [t.params["x"] for t in result.trials] == [0.75, 0.25, 0.5]
    assert [t.state for t in result.trials] == ["COMPLETE"] * 3


def test_a_driver_reserves_a_trial_per_slot_under_one_hold_of_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each hold of the run directory's lock reserves one trial per slot (in one
    transaction) while more than a wave of trials is left, then one at a time: with 64
    drivers one hold per ask was near the lock's capacity. The budget stays exact: every
    trial reserved and never asked is given back (FAIL, marked unused), not counted."""
    import contextlib
    from collections.abc import Iterator

    import paralela
    import paralela.sweeping._budget as budget

    holds: list[int] = []  # trials reserved at each hold
    real = budget.SharedBudget.claim

    @contextlib.contextmanager
    def watched(self: Any, want: int = 1) -> Iterator[int]:
        with real(self, want) as allowed:
            holds.append(allowed)
            yield allowed

    monkeypatch.setattr(budget.SharedBudget, "claim", watched)
    result = paralela.sweep(
        _objective,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=12,
        workers=2,
        sampler="random",
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    assert len(result.completed) == 12, result.trials
    assert holds[0] == 2, holds  # a trial per slot at once
    assert sum(holds) >= 12
    assert len(holds) < 12, holds  # fewer holds than trials
    study = optuna.load_study(
        study_name=result.study_name, storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}"
    )
    ran = [t for t in study.trials if "paralela:unused" not in t.system_attrs]
    assert len(ran) == 12
    assert {t.state for t in ran} == {TrialState.COMPLETE}
    given_back = [t for t in study.trials if "paralela:unused" in t.system_attrs]
    assert all(t.state == TrialState.FAIL for t in given_back)


@pytest.mark.parametrize(
    ("n_trials", "allowed"),
    [(20, 4), (9, 4), (8, 1), (6, 1), (5, 0)],  # 5 claimed (3 running), 4 wanted
)
def test_the_last_wave_of_trials_is_reserved_one_at_a_time(n_trials: int, allowed: int) -> None:
    """A batch while more trials are left than the study runs now; then one at a time, so
    the last trials go to the slots that free first; none once the budget is spent."""
    from paralela.sweeping._budget import SharedBudget

    study = optuna.create_study()
    for x in (0.1, 0.2):
        study.tell(study.ask(), x)
    for _ in range(3):
        study.ask()  # running (or asked ahead, or reserved)
    budget = SharedBudget(study, n_trials, run_dir=None)
    assert budget.counts() == (5, 3)
    with budget.claim(4) as n:
        assert n == allowed


def test_the_budget_counts_only_the_trials_since_the_first_unfinished_one(
    tmp_path: Path,
) -> None:
    """On SQLite a count reads the trials from the first one not finished on (a finished
    trial never changes again), and still agrees with counting every trial, whatever
    happened to them: finished, given back, interrupted, queued, taken from the queue."""
    from paralela.studies import INTERRUPTED_ATTR, UNUSED_ATTR
    from paralela.sweeping._budget import SharedBudget
    from paralela.sweeping._cache import DriverStorage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = DriverStorage(optuna.storages.RDBStorage(url))
    study = optuna.create_study(storage=storage, study_name="s")
    budget = SharedBudget(study, 1000, run_dir=None)

    def every_trial() -> tuple[int, int]:
        trials = optuna.load_study(study_name="s", storage=url).get_trials(deepcopy=False)
        counted = [
            t
            for t in trials
            if t.state != TrialState.WAITING
            and UNUSED_ATTR not in t.system_attrs
            and INTERRUPTED_ATTR not in t.system_attrs
        ]
        return len(counted), sum(t.state == TrialState.RUNNING for t in counted)

    def give_back(trial: Any, attr: str) -> None:
        storage.set_trial_system_attr(trial._trial_id, attr, True)
        storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)

    running = [study.ask() for _ in range(3)]
    assert budget.counts() == every_trial() == (3, 3)
    study.tell(running[1], 1.0)  # not the first: the count still starts at the first
    assert budget.counts() == every_trial() == (3, 2)
    study.tell(running[0], 0.5)
    give_back(running[2], UNUSED_ATTR)
    more = [study.ask() for _ in range(4)]
    assert budget.counts() == every_trial() == (6, 4)
    assert budget._from_id == more[0]._trial_id  # the finished ones are not read again
    give_back(more[0], INTERRUPTED_ATTR)
    study.tell(more[1], state=TrialState.PRUNED)
    study.tell(more[2], state=TrialState.FAIL)
    study.enqueue_trial({})
    with budget.claim(1):
        assert budget.waiting()
    assert budget.counts() == every_trial() == (5, 1)
    queued = study.ask()  # taken from the queue
    study.tell(more[3], 2.0)
    with budget.claim(1):
        assert not budget.waiting()
    assert budget.counts() == every_trial() == (6, 1)
    study.tell(queued, 3.0)
    assert budget.counts() == every_trial() == (6, 0)
    assert budget._from_id > queued._trial_id  # every trial finished: none read again
