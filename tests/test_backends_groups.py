"""The one group-stop helper (``paralela.backends.stop_group`` / ``stop_groups``): SIGTERM,
a grace period watching the group (not its leader), SIGKILL to what is left. Real
processes, real signals. Sweep's use of it is in ``test_sweep_group_stop.py``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from sweep_helpers import pid_gone

from paralela.backends import group_alive, kill_group, stop_group, stop_groups

pytestmark = pytest.mark.timeout(60)

# Ignores SIGTERM; says "ready" once it does.
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
# Starts a stubborn child (it stays in this group), prints the child's pid, then
# sleeps; it goes on SIGTERM, leaving the child behind.
LEAVES_A_CHILD = (
    "import subprocess, sys, time\n"
    f"c = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], stdout=subprocess.PIPE)\n"
    "c.stdout.readline()\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def started() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start ``python -c CODE`` in a session of its own; SIGKILLed after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


def _ready(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    return proc.stdout.readline()


def test_a_leader_given_to_reap_does_not_keep_its_group_alive(
    started: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    """No thread waits for the leader: stop_group reaps it, and returns once it went on
    SIGTERM instead of watching its zombie for the whole grace period."""
    proc = started("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    _ready(proc)
    began = time.monotonic()
    assert stop_group(proc.pid, 30.0, leader=proc) is False  # no SIGKILL was needed
    assert time.monotonic() - began < 15
    assert proc.returncode == -signal.SIGTERM
    assert not group_alive(proc.pid)


def test_the_child_of_a_leader_gone_on_sigterm_gets_sigkill_after_the_grace(
    started: Callable[[str], subprocess.Popen[bytes]], poll: Callable[..., None]
) -> None:
    """The bug ``paralela scale`` had: the leader went on SIGTERM, so its stubborn child
    was never killed. The group is watched, not the leader."""
    proc = started(LEAVES_A_CHILD)
    child = int(_ready(proc))
    grace = 0.3
    began = time.monotonic()
    assert stop_group(proc.pid, grace, leader=proc) is True
    assert time.monotonic() - began >= grace
    assert proc.returncode == -signal.SIGTERM
    poll(lambda: pid_gone(child), timeout=10, what="the stubborn child to die of SIGKILL")


def test_stop_groups_shares_one_grace_period_and_kills_only_what_is_left(
    started: Callable[[str], subprocess.Popen[bytes]], poll: Callable[..., None]
) -> None:
    polite = started("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    stubborn = [started(STUBBORN) for _ in range(2)]
    for proc in (polite, *stubborn):
        _ready(proc)
    grace = 1.0
    began = time.monotonic()
    killed = stop_groups(
        [polite.pid, *(p.pid for p in stubborn), polite.pid], grace, reap=[polite, *stubborn]
    )
    took = time.monotonic() - began
    assert killed == {p.pid for p in stubborn}
    assert grace <= took < 2 * grace + 5  # one grace period for all, not one each
    assert polite.wait(timeout=10) == -signal.SIGTERM
    for proc in stubborn:
        assert proc.wait(timeout=10) == -signal.SIGKILL
    poll(lambda: not any(group_alive(p.pid) for p in stubborn), timeout=10, what="groups gone")


def test_a_gone_group_is_neither_signalled_nor_an_error(
    started: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    proc = started("pass\n")
    proc.wait(timeout=30)  # reaped: the group is empty
    assert not group_alive(proc.pid)
    assert kill_group(proc.pid) is False
    assert stop_groups([proc.pid], 30.0) == set()
    assert stop_group(proc.pid, 30.0) is False


def test_scale_stops_a_commands_stubborn_child_after_its_grace(
    started: Callable[[str], subprocess.Popen[bytes]],
    poll: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``paralela scale`` stopped on Ctrl-C: the measured command went on SIGTERM, the
    worker it left (ignoring SIGTERM) goes too."""
    from paralela.scaling import _command

    monkeypatch.setattr(_command, "TERM_GRACE", 0.3)
    proc = started(LEAVES_A_CHILD)
    child = int(_ready(proc))
    _command._stop(proc)
    assert proc.returncode == -signal.SIGTERM
    poll(lambda: pid_gone(child), timeout=10, what="the command's worker to die")
