"""Job states from Slurm's commands: parsers on real outputs, and the fallback from
``sacct`` to ``scontrol`` to ``squeue`` with fake commands on ``PATH`` (no cluster)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from paralela.backends.slurm._commands import SlurmCommandError, run_command
from paralela.backends.slurm._state import (
    JobState,
    StateReader,
    expand_task_ids,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
    wait_job,
)

# Captured on the local cluster (Slurm 22.05): an array of 6 with a throttle of 2.
SCONTROL = """\
JobId=4 ArrayJobId=4 ArrayTaskId=2-5%2 ArrayTaskThrottle=2 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=PENDING Reason=JobArrayTaskLimit Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   Command=(null) WorkDir=/tmp/with space
JobId=6 ArrayJobId=4 ArrayTaskId=1 ArrayTaskThrottle=2 JobName=wrap
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
JobId=5 ArrayJobId=4 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=wrap
   JobState=COMPLETED Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
"""
SACCT = """\
10_1|COMPLETED|0:0
10_2|CANCELLED by 0|0:0
10_[3-5%1]|CANCELLED by 0|0:0
10_0|REQUEUED|0:0
11|TIMEOUT|0:15
12|OUT_OF_MEMORY|0:125
"""
SQUEUE = """\
4_2|PENDING
4_1|RUNNING
7|COMPLETED
"""


def test_parse_scontrol_expands_pending_ranges() -> None:
    states = parse_scontrol(SCONTROL)
    assert sorted(states) == ["4_0", "4_1", "4_2", "4_3", "4_4", "4_5"]
    assert states["4_0"] == JobState("4_0", "COMPLETED", "0:0", "scontrol")
    assert states["4_1"].state == "FAILED"
    assert states["4_1"].failed
    assert states["4_1"].describe() == "FAILED (exit code 1)"
    assert all(states[f"4_{i}"].state == "PENDING" for i in range(2, 6))
    assert not states["4_2"].finished


def test_parse_scontrol_plain_job() -> None:
    text = "JobId=77 JobName=x\n   JobState=CANCELLED Reason=None\n   ExitCode=0:15\n"
    assert parse_scontrol(text) == {"77": JobState("77", "CANCELLED", "0:15", "scontrol")}
    assert parse_scontrol("") == {}


def test_parse_sacct() -> None:
    states = parse_sacct(SACCT)
    assert states["10_2"].state == "CANCELLED"
    assert [states[f"10_{i}"].state for i in (3, 4, 5)] == ["CANCELLED"] * 3
    assert states["10_0"].state == "REQUEUED"
    assert not states["10_0"].finished
    assert states["11"].describe() == "TIMEOUT (killed by signal 15)"
    assert states["12"].failed
    assert states["10_1"].finished
    assert not states["10_1"].failed


def test_parse_squeue() -> None:
    states = parse_squeue(SQUEUE)
    assert states == {
        "4_2": JobState("4_2", "PENDING", "", "squeue"),
        "4_1": JobState("4_1", "RUNNING", "", "squeue"),
        "7": JobState("7", "COMPLETED", "", "squeue"),
    }


@pytest.mark.parametrize(
    ("spec", "tasks"),
    [("3", [3]), ("2-5%2", [2, 3, 4, 5]), ("[1,3-4]", [1, 3, 4]), ("x", []), ("1-", [])],
)
def test_expand_task_ids(spec: str, tasks: list[int]) -> None:
    assert expand_task_ids(spec) == tasks


# -- the fallback, with fake commands ------------------------------------------------


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that alone makes up PATH: commands are the ones a test writes."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    return directory


def command(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f'#!/bin/sh\necho "$@" >> {directory}/{name}.calls\n{body}\n')
    path.chmod(0o755)


def calls(directory: Path, name: str) -> list[str]:
    path = directory / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


INVALID = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'


def test_without_accounting_states_come_from_scontrol_then_squeue(fake_bin: Path) -> None:
    command(fake_bin, "sacct", 'echo "Slurm accounting storage is disabled" >&2; exit 1')
    command(
        fake_bin,
        "scontrol",
        'case "$3" in 7) printf "JobId=7 JobName=a\\n   JobState=FAILED\\n   ExitCode=2:0\\n";;'
        f" *) {INVALID};; esac",
    )
    command(fake_bin, "squeue", f'case "$6" in 8) echo "8|CANCELLED";; *) {INVALID};; esac')
    reader = StateReader()
    states = reader.query(["7", "8", "9"])
    assert states == {
        "7": JobState("7", "FAILED", "2:0", "scontrol"),
        "8": JobState("8", "CANCELLED", "", "squeue"),
    }
    assert "accounting storage is disabled" in reader.notes[0]
    assert not reader.uses_sacct
    reader.query(["7"])
    assert len(calls(fake_bin, "sacct")) == 1  # not asked again


def test_ids_sacct_does_not_know_yet_are_asked_of_the_controller(fake_bin: Path) -> None:
    # slurmdbd lags behind a submission: sacct answers, but without the new job.
    command(fake_bin, "sacct", 'echo "5_0|COMPLETED|0:0"')
    command(fake_bin, "scontrol", 'printf "JobId=6 JobName=a\\n   JobState=RUNNING\\n"')
    command(fake_bin, "squeue", "exit 1")
    reader = StateReader()
    states = reader.query(["5", "6"])
    assert states["5_0"].source == "sacct"
    assert states["6"] == JobState("6", "RUNNING", "", "scontrol")
    assert reader.uses_sacct
    assert calls(fake_bin, "scontrol") == ["show job 6"]


def test_a_controller_that_does_not_answer_is_an_error(fake_bin: Path) -> None:
    command(fake_bin, "scontrol", 'echo "Unable to contact slurm controller" >&2; exit 1')
    command(fake_bin, "squeue", 'echo "Unable to contact slurm controller" >&2; exit 1')
    with pytest.raises(SlurmCommandError, match="Unable to contact slurm controller"):
        StateReader().query(["3"])


def test_wait_job_returns_the_final_state(fake_bin: Path) -> None:
    # RUNNING twice, then COMPLETED.
    command(
        fake_bin,
        "scontrol",
        f"n=$(wc -l < {fake_bin}/scontrol.calls)\n"
        'if [ "$n" -lt 3 ]; then s=RUNNING; else s=COMPLETED; fi\n'
        'printf "JobId=3 JobName=a\\n   JobState=$s\\n   ExitCode=0:0\\n"',
    )
    (fake_bin / "wc").symlink_to("/usr/bin/wc")
    states = wait_job("3", interval=0.01, timeout=10)
    assert states == {"3": JobState("3", "COMPLETED", "0:0", "scontrol")}
    assert len(calls(fake_bin, "scontrol")) == 3


def test_wait_job_gives_up_on_a_job_nobody_knows(fake_bin: Path) -> None:
    command(fake_bin, "scontrol", INVALID)
    command(fake_bin, "squeue", INVALID)
    started = time.monotonic()
    states = wait_job("42", interval=0.01, lost_after=0.3)
    assert states == {"42": JobState("42", "VANISHED")}
    assert states["42"].failed
    assert time.monotonic() - started < 5


def test_wait_job_times_out(fake_bin: Path) -> None:
    command(fake_bin, "scontrol", 'printf "JobId=3 JobName=a\\n   JobState=PENDING\\n"')
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        wait_job("3", interval=0.01, timeout=0.2)


def test_commands_have_timeouts(fake_bin: Path) -> None:
    (fake_bin / "sleep").symlink_to("/bin/sleep")
    command(fake_bin, "scontrol", "exec sleep 10")
    started = time.monotonic()
    with pytest.raises(SlurmCommandError, match="did not answer in time"):
        run_command(["scontrol", "show", "config"], timeout=0.3)
    assert time.monotonic() - started < 5
