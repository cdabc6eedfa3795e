"""The Optuna side of a sweep: storage, sampler, pruner, and recovery after a crash.

Storage: SQLite in the run directory by default (a real database, embedded); a URL
(``postgresql://...``) when several nodes share a sweep; Optuna's journal file when the
run directory is on a network filesystem, where SQLite's locking is unsafe.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paralela._files import locked, move_into_place, open_new, temp_path
from paralela.errors import ConfigError, MissingExtraError

__all__ = [
    "DRIVER_ATTR",
    "INTERRUPTED_ATTR",
    "PRUNERS",
    "RERUN_ATTR",
    "SAMPLERS",
    "UNUSED_ATTR",
    "StorageChoice",
    "alembic_head",
    "choose_storage",
    "driver_identity",
    "import_optuna",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "recover_interrupted",
    "requeue_interrupted",
]

DRIVER_ATTR = "paralela:driver"
INTERRUPTED_ATTR = "paralela:interrupted"
RERUN_ATTR = "paralela:rerun_of"
UNUSED_ATTR = "paralela:unused"  # asked ahead but never started (the run stopped first)

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp", "nsga2", "nsga3", "qmc")
PRUNERS = ("none", "median", "percentile", "halving", "hyperband")


def import_optuna() -> Any:
    """Optuna, its logging quieted to warnings; a missing extra names ``paralela[sweep]``."""
    try:
        import optuna
    except ImportError as exc:
        raise MissingExtraError("optuna", "sweep", "paralela sweep") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True)
class StorageChoice:
    """Where a study lives: ``spec`` (a URL, or ``journal:PATH``) and why."""

    spec: str
    note: str | None = None


def choose_storage(run_dir: Path, storage: str | None) -> StorageChoice:
    """The user's storage, or SQLite in ``run_dir`` (a journal file on network filesystems)."""
    if storage:
        if not (storage.startswith("journal:") or "://" in storage):
            raise ConfigError(
                f"storage {storage!r} is not a database URL; use e.g. "
                "'postgresql://user@host/db', 'sqlite:///path/study.db' or 'journal:PATH'."
            )
        return StorageChoice(storage)
    from paralela.resources import filesystem_of, read_mounts

    fs = filesystem_of("run", str(run_dir), read_mounts())
    if fs.kind == "network":
        return StorageChoice(
            f"journal:{run_dir.resolve() / 'study.journal'}",
            note=(
                f"{run_dir} is on a network filesystem ({fs.fstype}), where SQLite locking "
                "is unsafe: using Optuna's journal file storage instead."
            ),
        )
    return StorageChoice(f"sqlite:///{run_dir.resolve() / 'study.db'}")


class _SQLiteConnection(sqlite3.Connection):
    """A SQLite connection in WAL mode with ``synchronous=NORMAL``.

    SQLite's default (a rollback journal, ``synchronous=FULL``) syncs the disk two or
    three times per commit: 15-30 ms of wall time and ~2 ms of CPU per Optuna write on
    the benchmark's VM, and a new database's tables took 0.5 s to create. In WAL mode a
    commit appends to the ``-wal`` file and syncs only at checkpoints; readers (the
    workers) and the writer no longer block each other. A committed trial survives the
    driver's death; only a power cut or OS crash can lose the last commits (the database
    stays consistent). Where WAL cannot be set (a filesystem without shared memory),
    the connection keeps SQLite's default journal: slower, equally correct.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        with contextlib.suppress(sqlite3.OperationalError):
            mode = self.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode is not None and str(mode[0]).lower() == "wal":
                self.execute("PRAGMA synchronous=NORMAL")


def open_storage(spec: str, *, checked: bool = False, wal: bool = False) -> Any:
    """An Optuna storage object for ``spec``.

    ``checked``: the database's schema was already checked against this Optuna version
    (by the driver); a worker then skips the check, which loads Optuna's migration
    scripts (0.1-0.3 s of CPU), and the tables' creation (SQLAlchemy asks SQLite about
    each table first). A new SQLite database needs neither.
    ``wal``: put a SQLite database in WAL mode (see ``_SQLiteConnection``); the sweep
    does it for its own database in the run directory, never for a database the user
    named. The mode stays with the file: the workers' connections use it too.
    """
    optuna = import_optuna()
    if spec.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(spec.removeprefix("journal:")))
    if spec.startswith("sqlite"):
        path = spec.removeprefix("sqlite:///")
        new = path != spec and path != ":memory:" and not os.path.exists(path)
        connect_args: dict[str, Any] = {"timeout": 60}
        if wal:
            connect_args["factory"] = _SQLiteConnection
        if not new:
            return optuna.storages.RDBStorage(
                spec,
                engine_kwargs={"connect_args": connect_args},
                skip_compatibility_check=checked,
                skip_table_creation=checked,  # the driver's check found every table
            )
        # Two drivers started at once on one run directory: one creates the database, the
        # other waits and finds it made (else both create tables and one fails). The file
        # appears whole (made under another name, then renamed), so the storage object is
        # built after the lock is let go: 64 drivers had queued behind each other's
        # RDBStorage set-up (~0.8 s each on a loaded machine) before their first ask.
        made = False
        with locked(os.path.dirname(os.path.abspath(path))):
            if not os.path.exists(path):
                made = _create_sqlite(path, wal=wal)
        return optuna.storages.RDBStorage(
            spec,
            engine_kwargs={"connect_args": connect_args},
            skip_compatibility_check=True,
            skip_table_creation=made,  # made whole just now: no need to ask about each
        )
    return optuna.storages.RDBStorage(
        spec, skip_compatibility_check=checked, skip_table_creation=checked
    )


# ``revision = "..."`` and ``down_revision = "..."`` (or None) in an alembic script.
_REVISION_LINE = re.compile(
    r"""^(revision|down_revision)\s*=\s*(?:"([^"]*)"|'([^']*)'|(None))\s*$""", re.MULTILINE
)


def alembic_head(versions: Path | None = None) -> str | None:
    """The newest revision of Optuna's database schema, read from the text of its
    migration scripts (in ``versions``, by default Optuna's own); ``None`` where they do
    not read as one plain chain (a script without exactly one ``revision`` and one
    ``down_revision`` line, a branch, a gap).

    Alembic learns it by executing every script (each defines SQLAlchemy models).
    """
    if versions is None:
        import optuna.storages._rdb

        versions = Path(optuna.storages._rdb.__file__).parent / "alembic" / "versions"
    revisions: set[str] = set()
    parents: set[str | None] = set()
    try:
        scripts = sorted(versions.glob("*.py"))
        for script in scripts:
            found: dict[str, list[str | None]] = {"revision": [], "down_revision": []}
            for match in _REVISION_LINE.finditer(script.read_text(encoding="utf-8")):
                found[match.group(1)].append(
                    None if match.group(4) else (match.group(2) or match.group(3))
                )
            (revision,), (parent,) = found["revision"], found["down_revision"]
            if revision is None or revision in revisions:
                return None
            revisions.add(revision)
            parents.add(parent)
    except (OSError, UnicodeDecodeError, ValueError):  # (ValueError: not one line each)
        return None
    heads = revisions - parents
    if len(heads) != 1 or len(parents) != len(scripts) or not parents <= revisions | {None}:
        return None
    return heads.pop()


def _create_sqlite(path: str, *, wal: bool) -> bool:
    """Create a new SQLite database as Optuna's ``RDBStorage`` does, faster; ``True``
    where this call made it. Its tables and indexes (the SQL that SQLAlchemy's
    ``create_all`` runs, compiled from Optuna's models), Optuna's version row, and
    alembic's version table with the newest revision (:func:`alembic_head`): run
    through :mod:`sqlite3` in one transaction. Optuna asks alembic for that revision,
    which executes every migration script (40-100 ms of CPU at each sweep's start on the
    benchmark's VM, the slots idle meanwhile), and creates the tables through an engine
    that first asks SQLite about each (another 10-15 ms). Where the revision cannot be
    read, or anything fails, ``RDBStorage`` creates what is missing its own way.

    The database is made under a temporary name with ``synchronous=OFF``, then synced
    once and renamed into place (as ``runs/_atomic.py`` writes a file): SQLite's own
    way syncs the disk at each of its steps (writing the first page, switching to WAL,
    the tables, the checkpoint on close), 8-10 syncs and 0.1-0.3 s of the sweep's start
    on the benchmark's VM, with the slots idle. Either the whole database is there under
    its name, or none (a crash leaves only a ``.creating-*`` file behind).
    """
    head = alembic_head()
    if head is None:
        return False

    import sqlalchemy

    temp = str(temp_path(path))
    open_new(temp).close()  # ours (O_EXCL, no symlink followed); SQLite fills the empty file
    try:
        try:
            script = _creation_sql(head)
            connection = sqlite3.connect(temp, isolation_level=None)  # BEGIN/COMMIT below
            try:
                connection.execute("PRAGMA synchronous=OFF")  # synced once, below
                if wal:
                    connection.execute("PRAGMA journal_mode=WAL")  # kept in the file
                connection.execute("BEGIN")
                for statement in script:
                    connection.execute(statement)
                connection.execute("COMMIT")
            finally:
                connection.close()  # the last connection: its WAL folds into the file
        except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error):
            return False  # RDBStorage creates what is missing, its own way
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return move_into_place(temp, path)  # False: another driver's won the race
    except OSError:
        return False
    finally:
        for leftover in (temp, f"{temp}-wal", f"{temp}-shm", f"{temp}-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _creation_sql(head: str) -> list[str]:
    """The statements that make an empty Optuna database in SQLite at revision
    ``head``: what ``create_all``, Optuna's version row and ``alembic stamp`` write."""
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.version import __version__
    from sqlalchemy.dialects import sqlite as sqlite_dialect
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = sqlite_dialect.dialect()

    def sql(clause: Any) -> str:
        return str(clause.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))

    # Alembic's own version table, as ``alembic stamp`` creates it.
    version = sqlalchemy.Table(
        "alembic_version",
        sqlalchemy.MetaData(),
        sqlalchemy.Column("version_num", sqlalchemy.String(32), nullable=False),
        sqlalchemy.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
    )
    script = []
    for table in [*models.BaseModel.metadata.sorted_tables, version]:
        script.append(sql(CreateTable(table)))
        script.extend(sql(CreateIndex(index)) for index in table.indexes)
    script.append(sql(version.insert().values(version_num=head)))
    info = models.VersionInfoModel.__table__
    script.append(
        sql(
            info.insert().values(
                version_info_id=1,
                schema_version=models.SCHEMA_VERSION,
                library_version=__version__,
            )
        )
    )
    return script


def make_sampler(name: str, *, seed: int | None, grid: dict[str, list[Any]] | None) -> Any:
    """An Optuna sampler by name; see :data:`SAMPLERS`."""
    optuna = import_optuna()
    key = name.lower().replace("-", "").replace("_", "")
    if key == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if key == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if key == "grid":
        if grid is None:
            raise ConfigError("sampler 'grid' needs a space whose parameters all have values.")
        return optuna.samplers.GridSampler(grid, seed=seed)
    if key in ("cmaes", "cma"):
        _need("cmaes", "CMA-ES sampling")
        return optuna.samplers.CmaEsSampler(seed=seed)
    if key == "gp":
        _need("scipy", "the GP sampler")
        _need("torch", "the GP sampler")
        return optuna.samplers.GPSampler(seed=seed)
    if key in ("nsga2", "nsgaii"):
        return optuna.samplers.NSGAIISampler(seed=seed)
    if key in ("nsga3", "nsgaiii"):
        return optuna.samplers.NSGAIIISampler(seed=seed)
    if key == "qmc":
        _need("scipy", "QMC sampling")
        return optuna.samplers.QMCSampler(seed=seed)
    raise ConfigError(f"Unknown sampler {name!r}; valid samplers are: {', '.join(SAMPLERS)}.")


def _need(module: str, purpose: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{purpose} needs the Python package '{module}': pip install {module}")


def make_pruner(name: str | None) -> Any:
    """An Optuna pruner by name; see :data:`PRUNERS`."""
    optuna = import_optuna()
    key = (name or "none").lower().replace("-", "_")
    if key in ("none", "nop"):
        return optuna.pruners.NopPruner()
    if key == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    if key == "percentile":
        return optuna.pruners.PercentilePruner(25.0, n_startup_trials=4, n_warmup_steps=1)
    if key in ("halving", "successive_halving", "sha", "asha"):
        return optuna.pruners.SuccessiveHalvingPruner()
    if key == "hyperband":
        return optuna.pruners.HyperbandPruner()
    raise ConfigError(f"Unknown pruner {name!r}; valid pruners are: {', '.join(PRUNERS)}.")


def driver_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _driver_alive(identity: str) -> bool:
    host, _, pid = identity.rpartition(":")
    if host != socket.gethostname():
        return True  # another node's driver: assume it lives (its own restart recovers it)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def recover_interrupted(study: Any) -> list[int]:
    """Fail the trials a dead driver left RUNNING and queue each for one re-run.

    Returns the numbers of the trials recovered. A trial whose driver runs on another
    host is left alone: that driver (or its restart) owns it.
    """
    import_optuna()
    from optuna.trial import TrialState

    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.system_attrs.get(DRIVER_ATTR)
        if owner is not None and (owner == driver_identity() or _driver_alive(owner)):
            continue
        requeue_interrupted(study, trial)
        recovered.append(trial.number)
    return recovered


def requeue_interrupted(study: Any, trial: Any) -> None:
    """Fail a trial that never finished (``interrupted``) and queue its parameters for one
    re-run; an interrupted trial does not count against the budget."""
    from optuna.trial import TrialState

    study._storage.set_trial_system_attr(trial._trial_id, INTERRUPTED_ATTR, True)
    study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    if trial.params:
        study.enqueue_trial(trial.params, user_attrs={RERUN_ATTR: trial.number})
