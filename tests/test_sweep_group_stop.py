"""A command trial stopped by ``trial_timeout`` or by the pruner takes its whole process
group with it: a child that ignores SIGTERM gets SIGKILL after the grace period, even
once the group's leader (the trial command itself) has exited. Real trial processes,
real signals, real Optuna on SQLite; the CLI as a real process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sweep_helpers import RECORD_VARIABLE, command, notes, pid_gone, seed_study, write_script

import paralela
from paralela.backends import stop_group
from paralela.cli._errors import EXIT_FAILED

pytestmark = pytest.mark.timeout(90)

# A data loader worker that ignores SIGTERM; it says "ready" once it does.
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)

# The first trial starts a stubborn child, notes its pid, then hangs (reporting a bad
# value every 50 ms with --report, for the pruner). With --keep-fds the child also holds
# the trial's report pipe, as a shell's background job does. The trial after it waits
# (20 s at most) for that child to go and notes whether it went: the sweep must stop the
# child while it goes on, not only when it ends.
GROUP_TRIAL = f"""\
import subprocess
import sweep_helpers
from pathlib import Path

record = Path(os.environ[sweep_helpers.RECORD_VARIABLE])
if sweep_helpers.claim_first(record.with_suffix(".first")):
    child = subprocess.Popen(
        [sys.executable, "-c", {STUBBORN!r}],
        stdout=subprocess.PIPE,
        close_fds="--keep-fds" not in sys.argv,
    )
    child.stdout.readline()
    note("child", child=child.pid)
    if "--report" in sys.argv:
        for step in range(sweep_helpers.SEEDED_STEPS):
            paralela.report(100.0, step=step)
            time.sleep(0.05)
    time.sleep(600)
else:
    (first,) = sweep_helpers.notes(record, "child")
    deadline = time.monotonic() + 20
    while not sweep_helpers.pid_gone(first["child"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    note("next", child_gone=sweep_helpers.pid_gone(first["child"]))
    paralela.report(0.1)
"""


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The trials' notes; the stubborn children they noted are killed after the test
    (a failing test must not leave a process behind for ten minutes)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(path))
    try:
        yield path
    finally:
        for child in notes(path, "child"):
            with contextlib.suppress(OSError):
                os.kill(child["child"], signal.SIGKILL)


@pytest.mark.slow
def test_a_timed_out_trials_child_that_ignores_sigterm_is_killed(
    record: Path, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "train.py", GROUP_TRIAL)
    result = paralela.sweep(
        command(script),
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=2,
        workers=1,
        trial_timeout=2.5,
        grace_period=0.5,
        run_dir=tmp_path / "run",
        progress=False,
        plots=False,
    )
    first, after = result.trials
    assert first.state == "FAIL"
    assert "timed out after 2.5 s" in (first.error or "")
    assert first.exit_code == -signal.SIGTERM  # the leader itself went on SIGTERM
    seen = notes(record, "next")
    assert seen, "the next trial timed out waiting for the stubborn child to go"
    assert seen[0]["child_gone"], "the stubborn child outlived its timed-out trial"
    assert after.state == "COMPLETE"


@pytest.mark.slow
def test_a_pruned_trials_child_that_holds_the_report_pipe_is_killed(
    record: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    seed_study(run_dir, "prune")  # four good trials for the median to compare with
    script = write_script(tmp_path, "train.py", GROUP_TRIAL)
    started = time.monotonic()
    result = paralela.sweep(
        command(script, "--report", "--keep-fds"),
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=6,
        workers=1,
        pruner="median",
        grace_period=0.5,
        run_dir=run_dir,
        study_name="prune",
        progress=False,
        plots=False,
    )
    assert time.monotonic() - started < 30, "the pruned trial's group was not killed"
    assert [t.state for t in result.trials] == ["COMPLETE"] * 4 + ["PRUNED", "COMPLETE"]
    (seen,) = notes(record, "next")
    assert seen["child_gone"], "the stubborn child outlived its pruned trial"


@pytest.mark.slow
def test_the_cli_leaves_no_child_of_a_timed_out_trial_behind(record: Path, tmp_path: Path) -> None:
    """The sweep ends with the timed-out trial, before its grace period is over: the
    command must still kill the child before it exits."""
    script = write_script(tmp_path, "train.py", GROUP_TRIAL)
    (tmp_path / "space.yaml").write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml", "--trials", "1",
         "--trial-timeout", "1", "--no-plots", "--", *command(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr  # its only trial timed out
    assert "timed out after 1 s" in done.stderr
    (child,) = notes(record, "child")
    assert pid_gone(child["child"]), "the stubborn child outlived `paralela sweep`"


def test_stop_group_kills_a_group_whose_leader_has_exited(poll: Callable[..., None]) -> None:
    """The group of a leader that exited at once, with a member that ignores SIGTERM."""
    starts_child = (
        "import subprocess, sys\n"
        f"c = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], stdout=subprocess.PIPE)\n"
        "c.stdout.readline()\n"
        "print(c.pid, flush=True)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", starts_child], stdout=subprocess.PIPE, start_new_session=True
    ) as leader:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        try:
            assert leader.wait(timeout=30) == 0
            grace = 0.3
            started = time.monotonic()
            assert stop_group(leader.pid, grace) is True  # SIGKILL was needed
            assert time.monotonic() - started >= grace
            poll(lambda: pid_gone(member), timeout=10, what="the member to die of SIGKILL")
            poll(lambda: stop_group(leader.pid, grace) is False, timeout=10, what="no group")
        finally:
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGKILL)


def test_stop_group_returns_once_the_group_is_gone() -> None:
    """A group that goes on SIGTERM is not waited on for the whole grace period."""
    with subprocess.Popen(["sleep", "600"], start_new_session=True) as proc:
        reaper = threading.Thread(target=proc.wait, daemon=True)  # as a trial's reader thread
        reaper.start()
        started = time.monotonic()
        assert stop_group(proc.pid, 60.0) is False
        assert time.monotonic() - started < 30
        reaper.join(timeout=30)
        assert proc.returncode == -signal.SIGTERM
