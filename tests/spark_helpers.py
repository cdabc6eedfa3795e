"""A real Apache Spark for the tests: a standalone master and worker on 127.0.0.1, and
Spark sessions on ``local[2]`` or on that cluster.

::

    spark_cluster (one per test session)
      spark-class ...deploy.master.Master --host 127.0.0.1 --port 0 --webui-port 0
          log: "Starting Spark master at spark://127.0.0.1:PORT", "...started at http://..."
      spark-class ...deploy.worker.Worker spark://127.0.0.1:PORT --cores 2 --memory 1g
          ready when the master's http://.../json/ lists it ALIVE
      stopped at the end of the test session (each in its own process group: killed
      with it, the JVMs and the executors they started)

    spark_sessions (one per test module): the active SparkSession, made on demand for a
      master and stopped when another master is asked for; one JVM for the module
      (pyspark keeps its gateway between sessions), shut down at the module's end

Both come from the pyspark package's own scripts (``pyspark/bin/spark-class``, with
``SPARK_HOME`` the package's directory) and need Java. Where Java or pyspark is missing
the tests skip with the reason, except under ``tools/run-tests.sh`` as root (CI), which
installs Debian's headless JRE and sets ``PARALELA_REQUIRE_SPARK=1``: there they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "SESSION_CONF",
    "SparkSessions",
    "StandaloneCluster",
    "spark_cluster",
    "spark_problem",
    "spark_sessions",
]

#: How long the master and the worker may take to come up (a cold JVM: ~5 s each).
START_TIMEOUT = 90.0
#: Settings of the sessions the tests make: quiet and small.
SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.executor.memory": "512m",
    "spark.driver.memory": "1g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def spark_problem() -> str | None:
    """Why Spark cannot run here (no pyspark, no Java), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'paralela[spark]'; make install-dev does)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return (
            "Java is not installed (apt-get install openjdk-17-jre-headless; "
            "tools/run-tests.sh does it as root)"
        )
    return None


def _require_spark() -> None:
    """Skip (or, with PARALELA_REQUIRE_SPARK=1, fail) where Spark cannot run."""
    problem = spark_problem()
    if problem is not None:
        if os.environ.get("PARALELA_REQUIRE_SPARK") == "1":
            pytest.fail(problem)
        pytest.skip(problem)


def spark_home() -> Path:
    """The pyspark package's directory: a pip-installed pyspark is a whole SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class StandaloneCluster:
    """A Spark standalone master and one worker on 127.0.0.1, started from pyspark's
    ``bin/spark-class``. Logs and the worker's directory are under ``directory``."""

    directory: Path
    cores: int = 2
    memory: str = "1g"
    master_url: str = ""
    webui_url: str = ""
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        home = spark_home()
        log = self.directory / f"{name}.log"
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.directory / "local"),
            PYSPARK_PYTHON=sys.executable,
        )
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stopped as one
            )
        self._processes.append(process)
        return process, log

    def _wait_for(self, what: str, ready: Any, process: subprocess.Popen[bytes], log: Path) -> Any:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            found = ready()
            if found:
                return found
            if process.poll() is not None:
                raise RuntimeError(
                    f"the Spark {what} exited with code {process.returncode} before it was "
                    f"ready; the end of {log}:\n{_tail(log)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark {what} was not ready after {START_TIMEOUT:.0f} s; the end of "
                    f"{log}:\n{_tail(log)}"
                )
            time.sleep(0.1)

    def start(self) -> None:
        """Start the master, then the worker; return once the master lists the worker
        ALIVE. Raises RuntimeError (with the end of the log) when either does not."""
        (self.directory / "local").mkdir(parents=True, exist_ok=True)
        (self.directory / "work").mkdir(parents=True, exist_ok=True)
        master, master_log = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip

        def master_ready() -> tuple[str, str] | None:
            text = master_log.read_text(errors="replace")
            url = re.search(r"Starting Spark master at (spark://\S+)", text)
            ui = re.search(r"MasterWebUI.*started at (http://\S+)", text)
            return (url.group(1), ui.group(1)) if url and ui else None

        self.master_url, self.webui_url = self._wait_for("master", master_ready, master, master_log)
        worker, worker_log = self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--cores", str(self.cores), "--memory", self.memory,
            "--host", "127.0.0.1", "--webui-port", "0",
            "--work-dir", str(self.directory / "work"),
        )  # fmt: skip
        self._wait_for("worker", self.alive_workers, worker, worker_log)

    def alive_workers(self) -> int:
        """How many workers the master's JSON status lists as ALIVE (0 when it does not
        answer)."""
        try:
            with urllib.request.urlopen(self.webui_url.rstrip("/") + "/json/", timeout=5) as r:
                status = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """Stop the worker, then the master: SIGTERM to each process group, SIGKILL to
        what is left after 10 s."""
        for process in reversed(self._processes):
            _kill_group(process, signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
                process.wait(timeout=10)
            _kill_group(process, signal.SIGKILL)  # the executors and Python workers it left
        self._processes.clear()


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read it: {exc})"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A real Spark standalone cluster (master + one 2-core worker) on 127.0.0.1 for the
    whole test session; its ``master_url`` is ``spark://127.0.0.1:PORT``."""
    _require_spark()
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.fail(f"the Spark standalone cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


class SparkSessions:
    """The test module's active SparkSession, one at a time (Spark allows one per
    process): :meth:`session` returns the one on ``master``, stopping another first."""

    def __init__(self) -> None:
        self.active: Any = None
        self.master: str | None = None

    def session(self, master: str = "local[2]", conf: dict[str, str] | None = None) -> Any:
        if self.active is not None and self.master == master:
            return self.active
        self.stop()
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(master).appName("paralela-tests")
        settings = {**SESSION_CONF, "spark.pyspark.python": sys.executable, **(conf or {})}
        for key, value in settings.items():
            builder = builder.config(key, value)
        self.active = builder.getOrCreate()
        self.active.sparkContext.pythonExec = sys.executable  # as paralela's own sessions
        self.active.sparkContext.setLogLevel("WARN")
        self.master = master
        return self.active

    def stop(self) -> None:
        if self.active is not None:
            self.active.stop()
        self.active = None
        self.master = None

    def shut_down_jvm(self) -> None:
        """Stop the session and pyspark's JVM (it outlives sessions; the rest of the test
        run does not need it). A later SparkContext starts a new one."""
        self.stop()
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if gateway is None:
            return
        SparkContext._gateway = None
        SparkContext._jvm = None
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the JVM exits when this pipe closes
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture(scope="module")
def spark_sessions() -> Iterator[SparkSessions]:
    """Spark sessions for one test module (``spark.session("local[2]")``), stopped at
    its end."""
    _require_spark()
    sessions = SparkSessions()
    try:
        yield sessions
    finally:
        sessions.shut_down_jvm()
