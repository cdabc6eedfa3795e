"""The sweep driver's storage (``DriverStorage``, ``TrialWriter``) on real SQLite files:
it must leave in the database exactly what Optuna's own storage leaves, sample exactly
as Optuna does, see what others write, and do it with few SQL statements per trial."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
from sweep_helpers import reporting

import paralela
from paralela.studies import _study, alembic_head, open_storage
from paralela.sweeping._cache import DriverStorage

pytestmark = pytest.mark.timeout(60)

SPACE = {
    "x": FloatDistribution(-10.0, 10.0),
    "lr": FloatDistribution(1e-5, 1.0, log=True),
    "layers": IntDistribution(1, 4),
    "act": CategoricalDistribution(["relu", "tanh"]),
}
DRIVER = {"paralela:driver": "host:1"}
COMPARED = (
    "number",
    "state",
    "values",
    "params",
    "distributions",
    "user_attrs",
    "system_attrs",
    "intermediate_values",
)


@pytest.fixture(autouse=True)
def _quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN included (a NaN report must come back as NaN)."""
    return bool(a == b) or repr(a) == repr(b)


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def driver_study(path: Path, name: str = "s", **kwargs: Any) -> optuna.Study:
    database = open_storage(url(path), wal=True)  # as the sweep opens its own database
    storage = DriverStorage(database, new_trial_attrs=DRIVER, **kwargs)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=7),
        load_if_exists=True,
    )


def plain_study(path: Path, name: str = "s") -> optuna.Study:
    return optuna.create_study(
        study_name=name, storage=url(path), sampler=optuna.samplers.TPESampler(seed=7)
    )


def play(study: optuna.Study, n: int = 40) -> None:
    """Every kind of write a sweep makes: asked and enqueued trials, reports (with
    infinities and NaN), complete, failed and pruned trials, with two trials always
    asked ahead as the driver does."""
    study.enqueue_trial({"x": 1.0, "lr": 0.1, "layers": 3, "act": "tanh"})
    pending = []
    for i in range(n):
        trial = study.ask(SPACE)
        if "paralela:driver" not in study._storage.get_trial(trial._trial_id).system_attrs:
            study._storage.set_trial_system_attr(trial._trial_id, "paralela:driver", "host:1")
        if i % 5 == 1:
            trial.report(math.nan, 0)
            trial.report(math.inf, 1)
            trial.report(1.5, 2)
        if i % 9 == 2:
            study._storage.set_trial_system_attr(trial._trial_id, "paralela:error", "boom")
        pending.append((i, trial))
        if len(pending) > 2:
            j, done = pending.pop(0)
            if j % 7 == 3:
                study.tell(done, state=TrialState.FAIL)
            elif j % 7 == 4:
                study.tell(done, state=TrialState.PRUNED)
            elif j == 6:
                study.tell(done, -math.inf)
            else:
                study.tell(done, done.params["x"] ** 2 + done.params["layers"])
    for _, done in pending:
        study.tell(done, 1.0)


def test_the_database_holds_what_optuna_would_have_written(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.db", tmp_path / "theirs.db"
    play(driver_study(ours))
    play(plain_study(theirs))

    read_ours = optuna.load_study(study_name="s", storage=url(ours)).get_trials()
    read_theirs = optuna.load_study(study_name="s", storage=url(theirs)).get_trials()
    assert len(read_ours) == len(read_theirs) == 40
    for a, b in zip(read_ours, read_theirs, strict=True):
        for field in COMPARED:  # same seed, same sampler: the same trials, bit for bit
            assert same(getattr(a, field), getattr(b, field)), (a.number, field)
        assert a.datetime_start is not None
        assert a.datetime_complete is not None
        assert a.datetime_start <= a.datetime_complete
        assert abs((a.datetime_start - b.datetime_start).total_seconds()) < 30
    states = {t.state for t in read_ours}
    assert states == {TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED}
    pruned_with_reports = [t for t in read_ours if t.state == TrialState.PRUNED and t.values]
    assert pruned_with_reports  # a pruned trial's value is its last report, as in Optuna


def test_the_cached_view_is_what_the_database_holds(tmp_path: Path) -> None:
    study = driver_study(tmp_path / "s.db")
    play(study)
    storage = study._storage
    assert isinstance(storage, DriverStorage)
    cached = storage.get_all_trials(study._study_id)  # from memory
    storage.sync(study._study_id)
    fresh = storage.backend.get_all_trials(study._study_id)
    for a, b in zip(cached, fresh, strict=True):
        for field in COMPARED:
            assert same(getattr(a, field), getattr(b, field)), (a.number, field)


def test_it_reads_what_others_write_within_its_sync_interval(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ours = driver_study(path, sync_seconds=3600.0)
    first = ours.ask(SPACE)
    ours.tell(first, 1.0)
    other = optuna.load_study(study_name="s", storage=url(path))
    elsewhere = other.ask(SPACE)
    other.tell(elsewhere, 0.5)

    assert len(ours.get_trials()) == 1  # not read yet: an hour between reads
    assert isinstance(ours._storage, DriverStorage)
    ours._storage.sync(ours._study_id)
    assert [t.value for t in ours.get_trials()] == [1.0, 0.5]
    assert ours.best_value == 0.5

    eager = driver_study(path, sync_seconds=0.0)
    late = other.ask(SPACE)
    other.tell(late, 0.25)
    assert eager.best_value == 0.25  # read back on every look


def test_a_pruned_trial_is_read_back_before_it_is_told(tmp_path: Path) -> None:
    # Function trials report from their worker: the driver's cache never saw the values.
    path = tmp_path / "s.db"
    ours = driver_study(path, sync_seconds=3600.0)
    trial = ours.ask(SPACE)
    worker = optuna.load_study(study_name="s", storage=url(path))
    optuna.trial.Trial(worker, trial._trial_id).report(3.5, 4)
    assert isinstance(ours._storage, DriverStorage)
    ours._storage.refresh(trial._trial_id)
    ours.tell(trial, state=TrialState.PRUNED)

    (told,) = optuna.load_study(study_name="s", storage=url(path)).get_trials()
    assert told.state == TrialState.PRUNED
    assert told.values == [3.5]
    assert told.intermediate_values == {4: 3.5}


def test_a_trial_another_driver_ended_is_not_told_again(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ours = driver_study(path)
    trial = ours.ask(SPACE)
    other = optuna.load_study(study_name="s", storage=url(path))
    other._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)

    with pytest.raises(UpdateFinishedTrialError):
        ours.tell(trial, 1.0)
    (stored,) = optuna.load_study(study_name="s", storage=url(path)).get_trials()
    assert stored.state == TrialState.FAIL
    assert stored.values is None


def test_a_waiting_trial_taken_by_another_driver_is_left_to_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ours = driver_study(path, sync_seconds=3600.0)
    ours.enqueue_trial({"x": 2.0, "lr": 0.5, "layers": 1, "act": "relu"})
    other = optuna.load_study(study_name="s", storage=url(path))
    taken = other.ask(SPACE)  # takes the queued trial first
    assert taken.params["x"] == 2.0

    mine = ours.ask(SPACE)  # tries the queued trial, finds it taken, asks a new one
    assert mine.number == 1
    assert isinstance(ours._storage, DriverStorage)
    assert ours._storage.get_trial(taken._trial_id).state == TrialState.RUNNING


def test_an_ask_and_a_tell_take_few_sql_statements(tmp_path: Path) -> None:
    # Optuna's storage reads every unfinished trial back several times per ask, and
    # each of its writes is four or more statements: ~100 statements per trial here.
    study = driver_study(tmp_path / "s.db", sync_seconds=3600.0)
    for _ in range(12):  # past TPE's random start-up trials
        t = study.ask(SPACE)
        study.tell(t, t.params["x"] ** 2)
    assert isinstance(study._storage, DriverStorage)
    engine = study._storage.backend.engine
    statements: list[str] = []

    def trace(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # Every statement SQLite runs on this connection (SQLAlchemy's or not).
        dbapi_connection.set_trace_callback(lambda sql: statements.append(sql.split()[0]))

    sqlalchemy.event.listen(engine, "checkout", trace)
    try:
        for _ in range(10):
            t = study.ask(SPACE)
            study.tell(t, t.params["x"] ** 2)
    finally:
        sqlalchemy.event.remove(engine, "checkout", trace)
        engine.dispose()  # no connection keeps the trace
    kinds = {kind.upper() for kind in statements} - {"BEGIN", "COMMIT", "ROLLBACK"}
    assert kinds <= {"INSERT", "UPDATE", "SELECT"}, statements
    # Per trial: the trial (insert, its number: a count and an update), its 4 parameters
    # and 2 system attributes (the driver's name, TPE's note), its state and value.
    # Nothing is read back but the count.
    writes = [s for s in statements if s.upper() in ("INSERT", "UPDATE")]
    assert len(writes) == 10 * 10, statements
    assert [s.upper() for s in statements].count("SELECT") == 10, statements


def journal_mode(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
    finally:
        connection.close()
    return str(mode)


def test_sweep_databases_use_wal_and_leave_no_side_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    # reporting: its workers write its reports to the database
    result = paralela.sweep(reporting, space, n_trials=3, workers=2, run_dir=run_dir, plots=False)
    leftovers = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("study.db-"))
    assert leftovers == []  # the sweep closed its database: the WAL is folded in
    assert journal_mode(run_dir / "study.db") == "wal"
    study = optuna.load_study(study_name=result.study_name, storage=url(run_dir / "study.db"))
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 3
    assert all(len(t.intermediate_values) == 3 for t in complete)


def test_a_database_the_user_names_keeps_its_journal_mode(tmp_path: Path) -> None:
    database = tmp_path / "mine.db"
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    result = paralela.sweep(
        reporting, space, n_trials=2, workers=2, storage=url(database), run_dir=tmp_path / "r"
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 2
    assert journal_mode(database) == "delete"  # SQLite's default, as Optuna leaves it


def schema_and_versions(database: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """A database's tables and indexes (as SQLite stores their SQL), alembic's revision
    and Optuna's version row."""
    with sqlite3.connect(database) as connection:
        schema = connection.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
        revision = connection.execute("SELECT * FROM alembic_version").fetchall()
        version = connection.execute("SELECT * FROM version_info").fetchall()
    connection.close()
    return schema, revision, version


def test_the_newest_schema_revision_is_alembics_own(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(url(tmp_path / "optuna.db"))
    assert alembic_head() == storage._version_manager.get_head_version()
    storage.engine.dispose()


@pytest.mark.parametrize("wal", [True, False])
def test_a_new_database_is_the_one_optuna_would_have_created(tmp_path: Path, wal: bool) -> None:
    theirs = optuna.storages.RDBStorage(url(tmp_path / "optuna.db"))
    theirs.engine.dispose()
    ours = open_storage(url(tmp_path / "ours.db"), wal=wal)
    ours.engine.dispose()

    assert schema_and_versions(tmp_path / "ours.db") == schema_and_versions(tmp_path / "optuna.db")
    assert journal_mode(tmp_path / "ours.db") == ("wal" if wal else "delete")
    # Optuna's own check of a database it opens finds it up to date, and uses it.
    again = optuna.storages.RDBStorage(url(tmp_path / "ours.db"))
    again._version_manager.check_table_schema_compatibility()
    study = optuna.create_study(storage=again, study_name="s")
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2
    again.engine.dispose()


def test_without_a_readable_revision_optuna_creates_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = optuna.storages.RDBStorage(url(tmp_path / "optuna.db"))
    theirs.engine.dispose()
    monkeypatch.setattr(_study, "alembic_head", lambda: None)
    ours = open_storage(url(tmp_path / "ours.db"), wal=True)
    ours.engine.dispose()
    assert schema_and_versions(tmp_path / "ours.db") == schema_and_versions(tmp_path / "optuna.db")


@pytest.mark.parametrize(
    ("scripts", "head"),
    [
        ({"a": ('"r1"', "None"), "b": ('"r2"', '"r1"'), "c": ("'r3'", '"r2"')}, "r3"),
        ({"a": ('"r1"', "None"), "b": ('"r2"', '"r1"'), "c": ('"r3"', '"r1"')}, None),  # branch
        ({"a": ('"r1"', "None"), "b": ('"r3"', '"r2"')}, None),  # a gap
        ({"a": ('"r1"', "None"), "b": ('"r1"', '"r1"')}, None),  # twice the same
        ({"a": ('"r1"', "None"), "b": ('"r2"', None)}, None),  # no down_revision line
        ({}, None),
    ],
)
def test_the_newest_revision_is_read_only_from_a_plain_chain(
    tmp_path: Path, scripts: dict[str, tuple[str, str | None]], head: str | None
) -> None:
    for name, (revision, parent) in scripts.items():
        lines = ['"""Revision ID: x"""', "import alembic", f"revision = {revision}"]
        if parent is not None:
            lines.append(f"down_revision = {parent}")
        (tmp_path / f"{name}.py").write_text("\n".join([*lines, "branch_labels = None", ""]))
    assert alembic_head(tmp_path) == head


def test_a_parameter_is_checked_against_the_studys_earlier_value_as_optuna_does(
    tmp_path: Path,
) -> None:
    """The driver writes a parameter's first value itself (one statement), after the
    check Optuna makes: the study's earlier value of that name, written by another
    process, has a compatible distribution; else nothing is written."""
    path = tmp_path / "s.db"
    driver_study(path)  # the database, as the sweep creates it
    theirs = optuna.load_study(study_name="s", storage=url(path))
    t = theirs.ask({"x": FloatDistribution(0.0, 1.0)})
    theirs.tell(t, 1.0)
    ours = driver_study(path)
    with pytest.raises(ValueError, match="Cannot set different distribution kind"):
        ours.ask({"x": CategoricalDistribution(["a", "b"])})
    fresh = optuna.load_study(study_name="s", storage=url(path))
    assert [t.params for t in fresh.trials] == [t.params, {}]  # the refused value is not there
    compatible = ours.ask({"x": FloatDistribution(0.0, 1.0), "y": IntDistribution(1, 3)})
    fresh = optuna.load_study(study_name="s", storage=url(path))
    assert fresh.trials[-1].params == compatible.params


def test_a_new_database_appears_whole_under_its_name(tmp_path: Path) -> None:
    """It is made under a temporary name and renamed into place: nothing else is left."""
    storage = open_storage(url(tmp_path / "study.db"), wal=True)
    storage.engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["study.db"]
    assert journal_mode(tmp_path / "study.db") == "wal"


def test_a_new_database_s_storage_is_built_outside_the_directory_s_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run directory's lock is held only while the file is made: drivers started
    together do not queue behind each other's storage set-up (64 drivers waited 52 s)."""
    import fcntl
    import os

    seen: list[bool] = []

    class Watching(optuna.storages.RDBStorage):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            fd = os.open(tmp_path / ".paralela.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:  # a lock of another open file: refused while the driver's is held
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append(True)
            except BlockingIOError:
                seen.append(False)
            finally:
                os.close(fd)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Watching)
    storage = open_storage(url(tmp_path / "study.db"), wal=True)
    assert seen == [True]
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(study.trials) == 2


def _reads(storage: DriverStorage) -> list[tuple[set[int], int]]:
    """Record what each read of the database asks for: (unfinished ids, newer than id)."""
    calls: list[tuple[set[int], int]] = []
    backend = storage.backend
    real = backend._get_trials

    def get_trials(
        study_id: int, states: Any, included_trial_ids: Any, trial_id_greater_than: int
    ) -> Any:
        calls.append((set(included_trial_ids), trial_id_greater_than))
        return real(study_id, states, included_trial_ids, trial_id_greater_than)

    backend._get_trials = get_trials  # type: ignore[method-assign]
    return calls


def test_a_read_skips_the_trials_this_driver_ended(tmp_path: Path) -> None:
    """The trials the driver ended itself are complete in its cache: a read asks the
    database only for the newer ones and the unfinished ones, not for every trial since
    the last read (all of a short sweep's trials at its end)."""
    study = driver_study(tmp_path / "s.db", sync_seconds=3600.0)
    storage = study._storage
    assert isinstance(storage, DriverStorage)
    done = [study.ask(SPACE) for _ in range(6)]
    for trial in done:
        study.tell(trial, 1.0)
    running = study.ask(SPACE)
    calls = _reads(storage)
    storage.sync(study._study_id)
    assert calls == [(set(), done[-1]._trial_id)]  # the running trial: newer
    study.tell(running, 2.0)
    storage.sync(study._study_id)
    assert calls[-1] == (set(), running._trial_id)


def test_a_trial_another_driver_made_between_this_ones_is_still_read(tmp_path: Path) -> None:
    """A trial id missing from the cache (another driver's, not read yet) stops the skip
    there: that trial, and every one after it, is read as before."""
    path = tmp_path / "s.db"
    ours = driver_study(path, sync_seconds=3600.0)
    other = optuna.load_study(study_name="s", storage=url(path))
    first = ours.ask(SPACE)
    theirs = other.ask(SPACE)
    second = ours.ask(SPACE)
    ours.tell(first, 1.0)
    ours.tell(second, 2.0)
    other.tell(theirs, 0.5)
    assert isinstance(ours._storage, DriverStorage)
    calls = _reads(ours._storage)
    ours._storage.sync(ours._study_id)
    assert calls == [(set(), first._trial_id)]
    assert [t.value for t in ours.get_trials()] == [1.0, 0.5, 2.0]
    assert ours.best_value == 0.5


def test_what_a_worker_wrote_is_read_back_before_the_trial_is_told(tmp_path: Path) -> None:
    """A function trial's reports (written by its worker) are in the cache once the
    driver ends the trial (the oracle refreshes a trial that wrote): reads may skip it."""
    from paralela.sweeping._oracle import Oracle
    from paralela.sweeping._worker_trial import TrialOutcome

    path = tmp_path / "s.db"
    ours = driver_study(path, sync_seconds=3600.0)
    oracle = Oracle(ours, {}, ahead=1, limit=1)
    oracle.resume()
    trial = oracle.take()
    assert trial is not None
    worker = optuna.load_study(study_name="s", storage=url(path))
    optuna.trial.Trial(worker, trial._trial_id).report(3.5, 4)
    oracle.tell(trial, TrialOutcome(trial.number, "COMPLETE", [1.0], 0.0, 1.0, wrote=True))
    oracle.close()
    (told,) = ours.get_trials()  # from the cache: no read in an hour
    assert told.intermediate_values == {4: 3.5}
    assert told.state == TrialState.COMPLETE
