"""Start-up cannot creep back: what a fresh interpreter imports to reach ``paralela.map``,
to run a map, in a worker before its first task, and for the CLI's ``map --help``.

Each check runs a fresh interpreter (a subprocess: this one has imported everything
already) and fails naming the modules it should not have imported, so the commit that
added an eager import is found at once. The lists name what is heavy or what the path
does not need; ``bench/bench_map.py`` workload d measures the time itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

# Never for `import paralela; paralela.map`, nor for a map of an importable function.
HEAVY = [
    "numpy",
    "torch",
    "pandas",
    "optuna",
    "sqlalchemy",
    "sqlite3",
    "rich",  # the progress bar's, only on a terminal (rich.console, rich.progress)
    "typer",
    "click",
    "fastapi",
    "uvicorn",
    "pydantic",
    "pyspark",
    "sklearn",
    "submitit",
    "psutil",  # only to stop a worker's own processes
    "cloudpickle",  # only for what goes by value (__main__, lambdas, closures)
    "multiprocessing",  # the pipe to the workers is paralela.backends._connection
    "socket",  # the pipe is made by _socket.socketpair (socket.py: ~2 ms of enums)
    "paralela.runs",  # the run store: only with run_dir=
    "paralela.resources._detect",  # resource detection: not needed to start workers
    "paralela.mapping._packed",  # cluster tasks only
]
# Not before a worker's first task either: a worker is a fresh interpreter per process.
WORKER_HEAVY = [
    *HEAVY,
    "typing",
    "dataclasses",
    "inspect",
    "concurrent.futures",
    "logging",
    "socket",
    "subprocess",
    "traceback",
    "pickle",  # the C pickler (_pickle) is enough: pickle.py imports re and struct
    "re",
    "signal",  # the worker sets its handlers with _signal: signal.py builds enums
    "enum",
]
# The CLI imports typer and rich for any command: a looser list.
CLI_HEAVY = ["numpy", "torch", "pandas", "optuna", "sqlite3", "pyspark", "fastapi", "sklearn"]


def imported_by(code: str, cwd: Path) -> list[str]:
    """The modules a fresh interpreter holds after running ``code`` (in ``cwd``)."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


_STARTUP: list[str] = []


def present(modules: list[str], names: list[str]) -> list[str]:
    """Which of ``names`` (or their submodules) are in ``modules``, leaving out what a
    bare interpreter of this environment imports already (a site hook's modules)."""
    if not _STARTUP:
        _STARTUP.extend(imported_by("pass", Path.cwd()))
    return sorted(
        n
        for n in names
        if n not in _STARTUP and any(m == n or m.startswith(n + ".") for m in modules)
    )


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "budget_job.py").write_text(
        textwrap.dedent(
            '''
            import sys


            def modules_here(x):
                """The modules of the process that runs the task."""
                return sorted(sys.modules)
            '''
        )
    )
    return tmp_path


def test_reaching_paralela_map_imports_nothing_heavy(tmp_path: Path) -> None:
    modules = imported_by("import paralela\nparalela.map", tmp_path)
    assert present(modules, HEAVY) == []


def test_a_map_of_an_importable_function_imports_nothing_heavy_in_the_driver(
    job_dir: Path,
) -> None:
    code = "import paralela, budget_job\nparalela.map(budget_job.modules_here, [0, 1], workers=2)"
    modules = imported_by(code, job_dir)
    assert "paralela.backends._processes" in modules  # it did start worker processes
    assert present(modules, HEAVY) == []


def test_a_worker_imports_nothing_heavy_before_its_first_task(job_dir: Path) -> None:
    code = textwrap.dedent(
        """
        import json, os
        import paralela, budget_job
        worker = paralela.map(budget_job.modules_here, [0], workers=1)[0]
        print(json.dumps(worker))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(job_dir), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=job_dir, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    worker = json.loads(done.stdout.splitlines()[-1])
    assert "paralela.backends._worker" in worker  # the list is a worker's
    assert present(worker, WORKER_HEAVY) == []


def test_a_run_dir_loads_the_run_store_and_nothing_heavier(job_dir: Path) -> None:
    run_dir = str(job_dir / "run")
    code = (
        "import paralela, budget_job\n"
        f"paralela.map(budget_job.modules_here, [0, 1], workers=2, run_dir={run_dir!r})"
    )
    modules = imported_by(code, job_dir)
    assert "paralela.runs._store" in modules
    # The run store names the host that wrote a chunk (socket.gethostname).
    assert present(modules, [m for m in HEAVY if m not in ("paralela.runs", "socket")]) == []


def test_the_cli_map_help_imports_no_science_stack(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps(sorted(sys.modules))))
        sys.argv = ["paralela", "map", "--help"]
        from paralela.cli import main
        main()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.splitlines()[-1])
    assert "paralela.cli" in modules
    assert present(modules, CLI_HEAVY) == []


# Imported by paralela.map only once the backend is chosen, so that a processes backend's
# workers boot (~30 ms each) while the driver imports these, not after.
AFTER_SPAWN = [
    "paralela.mapping._engine",
    "paralela.mapping._summary",
    "paralela.mapping._progress",
    "paralela.tasks",
    "concurrent.futures",  # and its logging: a Future is made at the first submit
    "logging",
]


def test_the_workers_start_before_the_driver_imports_the_map_engine(job_dir: Path) -> None:
    # The backend is made (its manager thread spawns the workers) in the caller's thread
    # before the engine is imported; what that thread imports next races the spawns.
    code = textwrap.dedent(
        """
        import importlib, json, sys
        import paralela, budget_job
        _processes = importlib.import_module("paralela.backends._processes")
        seen = []
        construct = _processes.ProcessBackend.__init__

        def constructing(self, *args, **kwargs):
            seen.append(sorted(sys.modules))
            construct(self, *args, **kwargs)

        _processes.ProcessBackend.__init__ = constructing
        paralela.map(budget_job.modules_here, [0, 1], workers=2)
        print(json.dumps(seen))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(job_dir), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=job_dir, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    at_start = json.loads(done.stdout.splitlines()[-1])
    assert len(at_start) == 1  # one pool of workers made
    assert present(at_start[0], AFTER_SPAWN) == []
