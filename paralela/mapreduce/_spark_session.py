"""The Spark session a MapReduce job runs in: reuse the user's, or start one and stop it.

::

    spark_context(master, spark_conf)
      a SparkContext is already active (the user's SparkSession) ──> use it, leave it running
          (master= must name its master or be None; spark_conf= must agree with its settings)
      none is active ──> master or $PARALELA_SPARK_MASTER (checked) or "local[*]"
                     ──> spark://: does each address accept a connection within
                         PROBE_SECONDS? none does: MapReduceError, no JVM started
                     ──> SparkContext(master, UI off, progress bar off, executors'
                          Python = this Python, + spark_conf) ──> stopped already? (the
                          master took no application) MapReduceError
                     ──> the job ──> stop() (on success, error, Ctrl-C)

pyspark is imported here only, on first use: ``import paralela`` never loads it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from paralela.errors import ConfigError, MapReduceError, MissingExtraError

__all__ = [
    "APP_NAME",
    "DEFAULT_MASTER",
    "MASTER_ENV",
    "import_pyspark",
    "session_conf",
    "spark_context",
]

#: The master of a session paralela starts when neither master= nor the environment
#: names one: every core of this machine.
DEFAULT_MASTER = "local[*]"
#: The environment variable that names the master when master= is not given.
MASTER_ENV = "PARALELA_SPARK_MASTER"
APP_NAME = "paralela-mapreduce"
#: The master URLs Spark understands (``$PARALELA_SPARK_MASTER`` must be one of them).
MASTER_FORMS = (
    "local, local[N], local[*], local[N,F], spark://HOST:PORT (several: "
    "spark://H1:P1,H2:P2), yarn, k8s://https://HOST:PORT, mesos://HOST:PORT"
)
_MASTER_URL = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[[\d, ]+\]|yarn|(spark|k8s|mesos)://\S+"
)
#: How long, in all, the addresses of a spark:// master have to accept a connection
#: before the job is refused. Spark's own client tries a master that does not answer 3
#: times, 20 s apart, and then stops the context it returned: ~65 s, then "Cannot call
#: methods on a stopped SparkContext" from the first call that uses it.
PROBE_SECONDS = 10.0
#: A spark:// address without a port: the standalone master's default.
DEFAULT_MASTER_PORT = 7077
#: Settings of a session paralela starts (spark_conf= overrides each): no web UI (a port
#: and a thread for nothing in a batch job), no console progress bar (it garbles logs).
QUIET_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
LOG_LEVEL = "WARN"
#: Loggers that print a failed task's whole Python and JVM trace, once per attempt, in a
#: session paralela starts: the job's error already says what failed (and keeps Spark's
#: exception as its ``__context__``). Spark still logs "Task 1 in stage 0.0 failed".
QUIET_LOGGERS = {
    "org.apache.spark.executor.Executor": "FATAL",
    "org.apache.spark.scheduler.TaskSetManager": "ERROR",
    "org.apache.spark.storage.BlockManager": "ERROR",
}


def import_pyspark() -> Any:
    """The ``pyspark`` module.

    Raises:
        MissingExtraError: pyspark is not installed (names the ``spark`` extra).
    """
    try:
        import pyspark
    except ImportError as exc:
        raise MissingExtraError("pyspark", "spark", "The Spark engine") from exc
    return pyspark


def session_conf(master: str, spark_conf: Mapping[str, str] | None) -> dict[str, str]:
    """The settings of a session paralela starts on ``master``: quiet, named, with the
    executors running this very Python (so they import the same paralela and the same
    packages), then ``spark_conf`` on top.

    ``PYSPARK_PYTHON`` in the environment, or ``spark.pyspark.python`` in ``spark_conf``,
    choose another Python (a cluster whose nodes keep Python elsewhere).
    """
    conf = {"spark.master": master, "spark.app.name": APP_NAME, **QUIET_CONF}
    conf["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
    conf.update({str(k): str(v) for k, v in (spark_conf or {}).items()})
    return conf


def _check_reuse(active: Any, master: str | None, spark_conf: Mapping[str, str] | None) -> None:
    """Refuse to run on the user's active session with another master or other settings:
    Spark allows one SparkContext per process, and a running one cannot change them."""
    if master is not None and master != active.master:
        raise ConfigError(
            f"A Spark session on master {active.master!r} is already running in this "
            f"process, and master={master!r} asks for another one; Spark allows one per "
            "process. Pass master=None to run on the running session, or stop it first "
            "(spark.stop())."
        )
    if spark_conf:
        running = dict(active.getConf().getAll())
        differ = sorted(k for k, v in spark_conf.items() if running.get(k) != str(v))
        if differ:
            raise ConfigError(
                f"spark_conf= sets {', '.join(differ)}, but the Spark session already "
                "running in this process has other values, and a running session cannot "
                "change them. Set them when you build your session, or stop it so that "
                "paralela starts one with them."
            )


@contextlib.contextmanager
def spark_context(
    master: str | None, spark_conf: Mapping[str, str] | None
) -> Iterator[tuple[Any, bool]]:
    """``(SparkContext, started)``: the running one (``started`` False: left running), or
    one started for the job and stopped when the block ends, however it ends.

    Raises:
        MissingExtraError: pyspark is not installed.
        ConfigError: a session is running with another master or other settings.
        MapReduceError: Spark does not start (no Java, a master that does not answer);
            the message keeps Spark's reason.
    """
    import_pyspark()
    from pyspark import SparkConf, SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        _check_reuse(active, master, spark_conf)
        yield active, False
        return
    chosen = master or _master_from_environment() or DEFAULT_MASTER
    check_master_answers(chosen)
    conf = SparkConf().setAll(list(session_conf(chosen, spark_conf).items()))
    try:
        sc = SparkContext(conf=conf)
    except Exception as exc:
        raise MapReduceError(
            f"Spark did not start on master {chosen!r}: {_first_line(exc).rstrip('.')}. Check that "
            "Java 17 or newer is installed (java -version; on Debian: apt-get install "
            "openjdk-17-jre-headless) and that the master answers."
        ) from exc
    if _stopped(sc):  # a master that took the connection but not the application
        sc.stop()
        raise MapReduceError(
            f"The Spark master {chosen} does not answer: it accepted a connection but "
            "registered no application, and Spark gave up. Check that the URL is the "
            f"master's (its log says 'Starting Spark master at spark://...'), or run on "
            "this machine with master='local[*]'."
        )
    try:
        # pyspark starts executors' Python workers with sc.pythonExec, which it takes from
        # $PYSPARK_PYTHON only ("python3" otherwise: maybe a Python without paralela).
        sc.pythonExec = conf.get("spark.pyspark.python") or sys.executable
        sc.setLogLevel(LOG_LEVEL)
        _quiet(sc)
        yield sc, True
    finally:
        sc.stop()


def _master_from_environment() -> str | None:
    """``$PARALELA_SPARK_MASTER``, or None when unset or empty.

    Raises:
        ConfigError: it is not a master URL Spark understands (names the forms).
    """
    raw = os.environ.get(MASTER_ENV, "").strip()
    if not raw:
        return None
    if _MASTER_URL.fullmatch(raw) is None:
        raise ConfigError(
            f"Environment variable {MASTER_ENV}={raw!r} is not understood (it sets the "
            f"Spark master); allowed: {MASTER_FORMS}. Fix or unset it."
        )
    return raw


def check_master_answers(master: str, seconds: float = PROBE_SECONDS) -> None:
    """For a ``spark://`` master, check that one of its addresses accepts a TCP
    connection within ``seconds`` in all; any other master is left to Spark.

    Raises:
        MapReduceError: none answers (names the master and each address's reason).
    """
    if not master.startswith("spark://"):
        return
    addresses = [a.strip() for a in master[len("spark://") :].split(",") if a.strip()]
    deadline = time.monotonic() + seconds
    reasons = []
    for i, address in enumerate(addresses):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            host, port = address, str(DEFAULT_MASTER_PORT)
        wait = max(0.1, (deadline - time.monotonic()) / (len(addresses) - i))
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=wait):
                return
        except OSError as exc:  # refused, timed out, unknown host
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    raise MapReduceError(
        f"The Spark master {master} does not answer ({'; '.join(reasons) or 'no address'}, "
        f"within {seconds:g} s). Check the URL (spark://HOST:PORT, port "
        f"{DEFAULT_MASTER_PORT} by default) and that the master runs (sbin/start-master.sh; "
        "its log names its URL), or run on this machine with master='local[*]'."
    )


def _stopped(sc: Any) -> bool:
    """Whether Spark stopped ``sc`` while starting it (it gave up on the master)."""
    try:
        return bool(sc._jsc.sc().isStopped())
    except Exception:  # no such interface: let the job's first call tell
        return False


def _quiet(sc: Any) -> None:
    """Lower :data:`QUIET_LOGGERS` through log4j 2 (Spark's logger); only log output is
    at stake, so a log4j that does not have this interface is left as it is."""
    with contextlib.suppress(Exception):
        log4j = sc._jvm.org.apache.logging.log4j
        for name, level in QUIET_LOGGERS.items():
            log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]
