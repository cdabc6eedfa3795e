"""The writes the sweep driver makes for every trial, as single SQL statements (SQLite).

Optuna's ``RDBStorage`` runs each write through the SQLAlchemy ORM, in a session of its
own: it loads the trial, checks that it may change, looks for an existing row, then
inserts or updates: 1.1-2.2 ms of CPU per write on the benchmark's VM, and a trial of
its 3-parameter space takes 7 of them (create, 3 parameters, TPE's note, the driver's
name, the result). The driver already knows what those lookups find for the trials it
asks itself: the trial is its own, just created and still running, with no such row
yet. For those, :class:`TrialWriter` writes the rows with one SQL statement each, on a
connection of the storage's own pool: in Optuna's own tables (the statements are built
from its models' ``Table`` objects) and encodings (values go through its models'
conversions, enums and datetimes through SQLAlchemy's own bind processors for the
column types), so the database holds exactly what Optuna would have written. Through
the DB-API directly, a statement costs ~20 us of CPU instead of ~150 us through
SQLAlchemy Core. Everything else goes through Optuna.

Only SQLite: there a transaction's first write locks the database, which makes the
trial's number (the count of the study's earlier trials) safe to compute as Optuna does;
on a server database Optuna locks the study's row instead, and the driver leaves those
writes to Optuna.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy
from optuna.storages._rdb import models
from optuna.trial import TrialState

__all__ = ["TrialWriter"]


def _column_attribute(column: str) -> str:
    """The ORM attribute that holds ``trials.<column>`` (Optuna 5 maps datetimes to
    ``_<column>_utc`` behind a property that converts local time to UTC)."""
    table = models.TrialModel.__table__
    return str(sqlalchemy.inspect(models.TrialModel).get_property_by_column(table.c[column]).key)


class _Insert:
    """``INSERT INTO table (columns) VALUES (?, ...)`` with the columns' bind processors."""

    def __init__(self, table: Any, columns: Sequence[str], dialect: Any) -> None:
        names = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        self.sql = f"INSERT INTO {table.name} ({names}) VALUES ({marks})"
        self._bind = [_processor(table.c[name], dialect) for name in columns]

    def row(self, *values: Any) -> tuple[Any, ...]:
        return tuple(bind(v) for bind, v in zip(self._bind, values, strict=True))


def _processor(column: Any, dialect: Any) -> Callable[[Any], Any]:
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    return process if process is not None else (lambda value: value)


class TrialWriter:
    """Single-statement writes for the driver's own running trials (see the module)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        dialect = engine.dialect
        trials = models.TrialModel.__table__
        self._start = _column_attribute("datetime_start")
        self._complete = _column_attribute("datetime_complete")
        self._new_trial = _Insert(trials, ("study_id", "state", "datetime_start"), dialect)
        self._count = (
            f"SELECT count({trials.c.trial_id.name}) FROM {trials.name} "
            f"WHERE {trials.c.study_id.name} = ? AND {trials.c.trial_id.name} < ?"
        )
        self._number = (
            f"UPDATE {trials.name} SET {trials.c.number.name} = ? "
            f"WHERE {trials.c.trial_id.name} = ?"
        )
        self._end = (
            f"UPDATE {trials.name} SET {trials.c.state.name} = ?, "
            f"{trials.c.datetime_complete.name} = ? "
            f"WHERE {trials.c.trial_id.name} = ? AND {trials.c.state.name} = ?"
        )
        self._state = _processor(trials.c.state, dialect)
        self._datetime = _processor(trials.c.datetime_complete, dialect)
        self._attr = _Insert(
            models.TrialSystemAttributeModel.__table__, ("trial_id", "key", "value_json"), dialect
        )
        self._param = _Insert(
            models.TrialParamModel.__table__,
            ("trial_id", "param_name", "param_value", "distribution_json"),
            dialect,
        )
        self._value = _Insert(
            models.TrialValueModel.__table__,
            ("trial_id", "objective", "value", "value_type"),
            dialect,
        )
        self._report = _Insert(
            models.TrialIntermediateValueModel.__table__,
            ("trial_id", "step", "intermediate_value", "intermediate_value_type"),
            dialect,
        )
        reports = models.TrialIntermediateValueModel.__table__
        params = models.TrialParamModel.__table__
        self._earlier_param = (
            f"SELECT {params.name}.{params.c.distribution_json.name} FROM {params.name} "
            f"JOIN {trials.name} ON {trials.name}.{trials.c.trial_id.name} = "
            f"{params.name}.{params.c.trial_id.name} WHERE {trials.name}.{trials.c.study_id.name}"
            f" = ? AND {params.name}.{params.c.param_name.name} = ? LIMIT 1"
        )
        self._report_if_running = (
            self._report.sql.replace(" VALUES (", " SELECT ").removesuffix(")")
            + f" WHERE EXISTS (SELECT 1 FROM {trials.name} WHERE {trials.c.trial_id.name} = ?"
            f" AND {trials.c.state.name} = ?) AND NOT EXISTS (SELECT 1 FROM {reports.name}"
            f" WHERE {reports.c.trial_id.name} = ? AND {reports.c.step.name} = ?)"
        )
        self._count_finished = (
            f"SELECT count(*) FROM {trials.name} WHERE {trials.c.study_id.name} = ? "
            f"AND {trials.c.state.name} IN (?, ?, ?)"
        )

    def report_if_running(
        self, trial_id: int, step: int, value: float
    ) -> tuple[str, tuple[Any, ...]]:
        """One statement (and its arguments) that adds the trial's value at ``step``, only
        if the trial still runs and has no value at that step yet (else it adds nothing:
        Optuna's own write then raises or updates, as it would have)."""
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        return self._report_if_running, (
            *self._report.row(trial_id, step, stored, kind),
            trial_id,
            self._state(TrialState.RUNNING),
            trial_id,
            step,
        )

    def count_finished(self, study_id: int) -> tuple[str, tuple[Any, ...]]:
        """One statement (and its arguments) that counts the study's finished trials."""
        finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        return self._count_finished, (study_id, *(self._state(s) for s in finished))

    @staticmethod
    def usable(engine: Any) -> bool:
        return bool(engine.dialect.name == "sqlite")

    def _stored(self, column: str, attribute: str, value: datetime) -> Any:
        probe = models.TrialModel()
        setattr(probe, column, value)  # through Optuna's own conversion, if it has one
        return getattr(probe, attribute)

    def _run(self, work: Callable[[Any], Any]) -> Any:
        """``work(cursor)`` in one transaction on a connection of the storage's pool."""
        connection = self._engine.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                result = work(cursor)
            finally:
                cursor.close()
            connection.commit()
            return result
        except BaseException:
            connection.rollback()
            raise
        finally:
            connection.close()  # back to the pool

    def create(self, study_id: int, system_attrs: dict[str, Any]) -> tuple[int, int, datetime]:
        """A new running trial with these system attributes: (id, number, start)."""
        ((trial_id, number),), now = self.create_many(study_id, system_attrs, 1)
        return trial_id, number, now

    def create_many(
        self, study_id: int, system_attrs: dict[str, Any], count: int
    ) -> tuple[list[tuple[int, int]], datetime]:
        """``count`` new running trials in one transaction (one commit, one sync of the
        database file): their (id, number) in order, and their start."""
        now = datetime.now()
        start = self._stored("datetime_start", self._start, now)
        attrs = [(k, json.dumps(v)) for k, v in system_attrs.items()]  # the same for each

        def work(cursor: Any) -> list[tuple[int, int]]:
            made = []
            for _ in range(count):
                cursor.execute(
                    self._new_trial.sql, self._new_trial.row(study_id, TrialState.RUNNING, start)
                )
                trial_id = int(cursor.lastrowid)
                # The number is the count of the study's earlier trials, as Optuna counts
                # it; the first insert holds SQLite's write lock until the commit.
                (number,) = cursor.execute(self._count, (study_id, trial_id)).fetchone()
                cursor.execute(self._number, (number, trial_id))
                rows = [self._attr.row(trial_id, k, v) for k, v in attrs]
                if rows:
                    cursor.executemany(self._attr.sql, rows)
                made.append((trial_id, int(number)))
            return made

        return self._run(work), now

    def param(self, trial_id: int, name: str, internal: float, distribution_json: str) -> None:
        row = self._param.row(trial_id, name, internal, distribution_json)
        self._run(lambda cursor: cursor.execute(self._param.sql, row))

    def first_param(
        self,
        study_id: int,
        trial_id: int,
        name: str,
        internal: float,
        distribution_json: str,
        check: Callable[[str], None],
    ) -> None:
        """The first value of parameter ``name`` this driver writes: as Optuna does, the
        distribution of the study's earlier value of ``name``, if any, is first handed to
        ``check`` (which raises if the two are incompatible: nothing is written)."""
        row = self._param.row(trial_id, name, internal, distribution_json)

        def work(cursor: Any) -> None:
            earlier = cursor.execute(self._earlier_param, (study_id, name)).fetchone()
            if earlier is not None:
                check(str(earlier[0]))
            cursor.execute(self._param.sql, row)

        self._run(work)

    def system_attr(self, trial_id: int, key: str, value: Any) -> None:
        row = self._attr.row(trial_id, key, json.dumps(value))
        self._run(lambda cursor: cursor.execute(self._attr.sql, row))

    def report(self, trial_id: int, step: int, value: float) -> None:
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        row = self._report.row(trial_id, step, stored, kind)
        self._run(lambda cursor: cursor.execute(self._report.sql, row))

    def finish(self, trial_id: int, state: TrialState, values: Iterable[float] | None) -> bool:
        """End a running trial with its values; False (nothing written) if it no longer
        runs (another driver took it over)."""
        complete = self._datetime(self._stored("datetime_complete", self._complete, datetime.now()))
        rows = []
        for objective, value in enumerate(values or []):
            stored, kind = models.TrialValueModel.value_to_stored_repr(value)
            rows.append(self._value.row(trial_id, objective, stored, kind))
        running = self._state(TrialState.RUNNING)

        def work(cursor: Any) -> bool:
            cursor.execute(self._end, (self._state(state), complete, trial_id, running))
            if cursor.rowcount != 1:
                return False  # (nothing changed: the commit writes nothing)
            if rows:
                cursor.executemany(self._value.sql, rows)
            return True

        return bool(self._run(work))
