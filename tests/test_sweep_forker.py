"""Command trials of ``python SCRIPT.py ...`` forked from the sweep's prepared interpreter
(``paralela.sweeping._forker``): what the script sees and how it ends are those of
``python SCRIPT.py``; whatever the forker cannot do, a fresh interpreter does. Real
processes throughout."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sweep_helpers import (
    RECORD_VARIABLE,
    SEEN_SCRIPT,
    command,
    notes,
    seen_line,
    write_script,
)

import paralela
from paralela.errors import ConfigError
from paralela.sweeping._forker import LOST_EXIT, Forker, forking_allowed
from paralela.sweeping._trials import CommandTrial, TrialSpec

pytestmark = pytest.mark.timeout(60)

SPACE = {"x": {"type": "float", "low": -2.0, "high": 3.0}}


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(path))
    return path


def make_forker(script: Path, python: str = sys.executable) -> Iterator[Forker]:
    forker = Forker(python, str(script))
    try:
        yield forker
    finally:
        forker.close()


def trial_of(
    argv: list[str], tmp_path: Path, env: dict[str, str], forker: Forker | None, number: int = 0
) -> tuple[CommandTrial, TrialSpec, queue.SimpleQueue[tuple[object, ...]]]:
    spec = TrialSpec(1, number, {"x": 1.5}, str(tmp_path / f"trial-{number}.log"))
    events: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
    trial = CommandTrial(argv, spec, env, events, gated=True, forker=forker)
    return trial, spec, events


def gone(pid: int) -> bool:
    """Ended: no such process, or one that is only waiting to be reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_forking_is_on_unless_turned_off() -> None:
    assert forking_allowed({})
    assert forking_allowed({"PARALELA_FORK_TRIALS": "1"})
    for off in ("0", "no", "False", " off "):
        assert not forking_allowed({"PARALELA_FORK_TRIALS": off})
    with pytest.raises(ConfigError, match=r"PARALELA_FORK_TRIALS='maybe' is not understood.*1.*0"):
        forking_allowed({"PARALELA_FORK_TRIALS": "maybe"})


def test_a_forked_script_sees_what_python_script_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "code").mkdir()
    script = tmp_path / "code" / "seen.py"
    script.write_text(SEEN_SCRIPT)
    monkeypatch.setenv("SWEEP_TEST_DROPPED", "in the driver's environment only")
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_TEST_DROPPED"}
    env["SWEEP_TEST_EXTRA"] = "the trial's"
    args = ["--x", "1.5", "word"]
    direct = subprocess.run(
        [sys.executable, "code/seen.py", *args], env=env, capture_output=True, text=True, check=True
    )
    for forker in make_forker(Path("code/seen.py")):
        trial, spec, _ = trial_of(
            [sys.executable, "code/seen.py", "--x", "{x}", "word"], tmp_path, env, forker
        )
        time.sleep(0.3)  # it waits at its gate: the script has not run
        assert '"pickled"' not in Path(spec.log_path).read_text()
        trial.open_gate()
        assert trial.process.wait(timeout=30) == 0
        forker_pid = forker._process.pid if forker._process is not None else None

    forked = seen_line(Path(spec.log_path).read_text())
    plain = seen_line(direct.stdout)
    for key in ("argv", "path0", "file", "main_file", "name", "pickled", "cwd", "loop_modules"):
        assert forked[key] == plain[key], key
    assert forked["extra"] == "the trial's"
    assert forked["dropped"] is None
    assert forked["forker_variable"] is False
    assert forked["gate_variable"] is False
    assert forked["params"] == json.dumps({"x": 1.5})
    assert forked["ppid"] == forker_pid  # forked, not started by the driver
    assert forked["pgid"] == forked["pid"] == trial.process.pid  # a process group of its own


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('def f():\n    raise ValueError("bad " + sys.argv[1])\nprint("out")\nf()\n', 1),
        ("def (\n", 1),  # a syntax error
        ('print("bye")\nsys.exit(3)\n', 3),
        ('import atexit\natexit.register(lambda: print("at exit"))\nprint("body")\n', 0),
    ],
)
def test_a_forked_script_ends_as_it_would_as_a_fresh_interpreter(
    tmp_path: Path, body: str, code: int
) -> None:
    script = tmp_path / "ends.py"
    script.write_text("import sys\n" + body if "def (" not in body else body)
    direct = subprocess.run(
        [sys.executable, str(script), "x"], capture_output=True, text=True, timeout=60
    )
    for forker in make_forker(script):
        trial, spec, _ = trial_of(
            [sys.executable, str(script), "x"], tmp_path, {**os.environ}, forker
        )
        assert not isinstance(trial.process, subprocess.Popen)  # forked
        trial.open_gate()
        assert trial.process.wait(timeout=30) == direct.returncode == code
    log = Path(spec.log_path).read_text()
    header = f"$ {sys.executable} {script} x\n"
    assert log == header + direct.stdout + direct.stderr  # the same output, line for line


def test_a_forked_trial_killed_by_a_signal_ends_with_its_number(tmp_path: Path) -> None:
    script = tmp_path / "long.py"
    script.write_text("import time\ntime.sleep(60)\n")
    for forker in make_forker(script):
        trial, _, _ = trial_of([sys.executable, str(script)], tmp_path, {**os.environ}, forker)
        trial.open_gate()
        os.killpg(trial.process.pid, signal.SIGKILL)
        assert trial.process.wait(timeout=30) == -signal.SIGKILL


def test_a_closed_gate_ends_a_forked_process_unrun(tmp_path: Path, record: Path) -> None:
    script = write_script(tmp_path, "never.py", 'note("ran")\n')
    for forker in make_forker(script):
        trial, _, _ = trial_of([sys.executable, str(script)], tmp_path, {**os.environ}, forker)
        trial.close_gate()
        assert trial.process.wait(timeout=30) == 0
    assert notes(record) == []


@pytest.mark.parametrize(
    "change", [{"PYTHONPATH": "/somewhere"}, {"LC_ALL": "C"}, {"TZ": "UTC"}, {"PATH": "/bin"}]
)
def test_a_trial_whose_interpreter_start_would_differ_starts_fresh(
    tmp_path: Path, change: dict[str, str]
) -> None:
    script = tmp_path / "seen.py"
    script.write_text(SEEN_SCRIPT)
    for forker in make_forker(script):
        assert forker.start([str(script)], {**os.environ, **change}, (1, 1, 1)) is None
        trial, spec, _ = trial_of(
            [sys.executable, str(script)], tmp_path, {**os.environ, **change}, forker
        )
        assert isinstance(trial.process, subprocess.Popen)  # a fresh interpreter
        trial.open_gate()
        assert trial.process.wait(timeout=30) == 0
    assert seen_line(Path(spec.log_path).read_text())["ppid"] == os.getpid()


def test_a_forker_that_cannot_start_leaves_each_trial_to_a_fresh_interpreter(
    tmp_path: Path,
) -> None:
    script = tmp_path / "seen.py"
    script.write_text(SEEN_SCRIPT)
    for forker in make_forker(script, python="/bin/false"):  # exits at once
        trial, spec, _ = trial_of([sys.executable, str(script)], tmp_path, {**os.environ}, forker)
        assert isinstance(trial.process, subprocess.Popen)
        trial.open_gate()
        assert trial.process.wait(timeout=30) == 0
    assert seen_line(Path(spec.log_path).read_text())["ppid"] == os.getpid()


def test_a_forker_killed_under_its_trials_loses_only_their_exit_codes(tmp_path: Path) -> None:
    script = tmp_path / "seen.py"
    script.write_text(SEEN_SCRIPT)
    for forker in make_forker(script):
        waiting, spec, events = trial_of(
            [sys.executable, str(script)], tmp_path, {**os.environ}, forker
        )
        assert forker._process is not None
        forker._process.kill()
        forker._process.wait()
        waiting.open_gate()  # its process still runs its script, and ends
        assert waiting.process.wait(timeout=30) == LOST_EXIT
        assert "exit code is unknown: the sweep's trial forker was killed" in (
            waiting.describe_exit(LOST_EXIT)
        )
        assert gone(waiting.process.pid)  # (waited for: it ended)
        assert seen_line(Path(spec.log_path).read_text())["ppid"] != os.getpid()
        assert events.get(timeout=10)[0] == "exit"
        later, _, _ = trial_of(
            [sys.executable, str(script)], tmp_path, {**os.environ}, forker, number=1
        )
        assert isinstance(later.process, subprocess.Popen)  # fresh from now on
        later.open_gate()
        assert later.process.wait(timeout=30) == 0


def test_a_sweep_forks_its_script_trials_and_leaves_no_process(
    tmp_path: Path, record: Path
) -> None:
    body = 'note("ran", ppid=os.getppid())\nparalela.report(float(sys.argv[2]) ** 2)\n'
    script = write_script(tmp_path, "trial.py", body)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = paralela.sweep(
        command(script, "--x", "{x}"),
        SPACE,
        n_trials=8,
        workers=2,
        run_dir=tmp_path / "r",
        progress=False,
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 8
    for t in result.trials:
        assert t.values == [pytest.approx(t.params["x"] ** 2)]
    parents = [n["ppid"] for n in notes(record, "ran")]
    assert len(parents) == 8
    # the first trial of each slot starts as a fresh interpreter; the others are forked
    # (each taken ahead while its slot's trial runs), all from one forker
    forked = [p for p in parents if p != os.getpid()]
    assert 2 <= parents.count(os.getpid()) <= 4
    assert len(forked) >= 4
    assert len(set(forked)) == 1
    (forker_pid,) = set(parents) - {os.getpid()}
    assert gone(forker_pid)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert left == set()


def test_with_forking_off_every_trial_is_a_fresh_interpreter(
    tmp_path: Path, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARALELA_FORK_TRIALS", "0")
    script = write_script(
        tmp_path, "trial.py", 'note("ran", ppid=os.getppid())\nparalela.report(1.0)\n'
    )
    result = paralela.sweep(
        command(script), SPACE, n_trials=5, workers=2, run_dir=tmp_path / "r", progress=False
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 5
    assert [n["ppid"] for n in notes(record, "ran")] == [os.getpid()] * 5


def test_a_fork_setting_not_understood_stops_the_sweep_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARALELA_FORK_TRIALS", "sometimes")
    script = write_script(tmp_path, "trial.py", "paralela.report(1.0)\n")
    with pytest.raises(ConfigError, match="PARALELA_FORK_TRIALS='sometimes' is not understood"):
        paralela.sweep(command(script), SPACE, n_trials=2, run_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
