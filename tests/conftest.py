"""Shared fixtures: a clean configuration, fresh process pools, and polling with a deadline.

Tests never sleep to wait for something: they poll a condition until a deadline
(:func:`wait_until`) and fail with a message when it does not come true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from disk_helpers import small_disk  # noqa: F401  (a small real tmpfs)
from spark_helpers import spark_cluster, spark_sessions  # noqa: F401  (Spark fixtures)

from paralela.backends import ProcessBackend


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` every few milliseconds until it is true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.005)


@pytest.fixture(autouse=True)
def _no_paralela_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the developer's shell must not change what a test sees."""
    for name in list(os.environ):
        if name.startswith("PARALELA_"):
            monkeypatch.delenv(name)


@pytest.fixture
def poll() -> Callable[..., None]:
    """:func:`wait_until`, for tests: ``poll(lambda: path.exists(), timeout=5)``."""
    return wait_until


@pytest.fixture
def process_backend() -> Iterator[ProcessBackend]:
    """A private pool of two worker processes, stopped after the test.

    Tests that kill workers use their own pool, so that what they break never reaches
    the shared pool other tests use.
    """
    backend = ProcessBackend(2)
    try:
        yield backend
    finally:
        backend.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The real local Slurm cluster (``tools/local-slurm.sh start``): its partition name.

    Outside CI a machine without Slurm skips these tests; CI sets
    ``PARALELA_REQUIRE_SLURM=1`` (``.ci/run`` starts the cluster), where a missing or
    stopped cluster fails them instead, so they can never be skipped silently there.
    """
    # Read before the autouse fixture above clears PARALELA_* (session scope runs first).
    required = os.environ.get("PARALELA_REQUIRE_SLURM") == "1"
    problem = None
    if shutil.which("sbatch") is None:
        problem = "sbatch is not on PATH"
    else:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
        if "UP" not in ping.stdout:
            problem = f"scontrol ping says: {ping.stdout.strip() or ping.stderr.strip()}"
    if problem:
        message = (
            f"no local Slurm cluster ({problem}); start it with: bash tools/local-slurm.sh start"
        )
        if required:
            pytest.fail(message)
        pytest.skip(message)
    return "debug"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium for the HTML report tests: the path of its executable.

    Skipped where it is not installed, except where ``tools/run-tests.sh`` installed it
    (``PARALELA_REQUIRE_CHROMIUM=1``, as in CI): there a missing browser fails the test.
    """
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (apt-get install chromium; make test does it as root)"
        if os.environ.get("PARALELA_REQUIRE_CHROMIUM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
