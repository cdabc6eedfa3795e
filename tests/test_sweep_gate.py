"""Command trials that are ``python SCRIPT.py ...``: each slot's next process is started
while the slot's current trial runs and waits at a gate (``paralela.sweeping._gate``).
Real processes, real SQLite; the tests check what the scripts saw and when they ran."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from helpers import children_running
from optuna.trial import TrialState
from sweep_helpers import (
    RECORD_VARIABLE,
    SEEN_SCRIPT,
    SLEEP_VARIABLE,
    TIMED_TRIAL,
    command,
    notes,
    pid_gone,
    seen_line,
    write_script,
)

import paralela
from paralela.sweeping._gate import ENV_GATE_FD, PRELOAD, is_python_script
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


def at_gate(pid: int) -> bool:
    """Whether the process sleeps reading a pipe, as a gated trial at its gate does
    (Linux's ``/proc/PID/wchan``: ``pipe_read``, ``anon_pipe_read`` on newer kernels)."""
    return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()


def gated(
    argv: list[str], tmp_path: Path, poll: Callable[..., None]
) -> tuple[CommandTrial, TrialSpec]:
    """A gated trial of ``argv``, waiting at its gate (its preloading done)."""
    spec = TrialSpec(1, 0, {}, str(tmp_path / "trial.log"))
    events: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
    trial = CommandTrial(argv, spec, dict(os.environ), events, gated=True)
    poll(lambda: at_gate(trial.process.pid), timeout=30, what="the trial to reach its gate")
    return trial, spec


def test_which_commands_start_ahead(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert is_python_script([sys.executable, str(script), "--x", "{x}"])
    assert is_python_script(["python3", str(script)])
    assert is_python_script(["/usr/bin/python3.11", str(script)])
    assert not is_python_script([sys.executable, "-u", str(script)])  # interpreter options
    assert not is_python_script([sys.executable, "-m", "train"])
    assert not is_python_script([sys.executable, str(tmp_path / "missing.py")])
    assert not is_python_script([sys.executable, str(tmp_path / "{name}.py")])
    assert not is_python_script(["bash", str(script)])
    assert not is_python_script([sys.executable])


def test_a_gated_script_sees_what_python_script_gives_it(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    script = tmp_path / "code" / "seen.py"
    script.write_text(SEEN_SCRIPT)
    args = ["--x", "1.5", "word"]
    direct = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, check=True
    )
    spec = TrialSpec(1, 7, {"x": 1.5}, str(tmp_path / "trial.log"))
    events: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
    trial = CommandTrial(
        [sys.executable, str(script), "--x", "{x}", "word"],
        spec,
        dict(os.environ),
        events,
        gated=True,
    )
    time.sleep(0.3)  # it waits: the script has not run
    assert '"pickled"' not in Path(spec.log_path).read_text()
    trial.open_gate()
    assert trial.process.wait(timeout=30) == 0
    kinds = []
    while not kinds or kinds[-1] != "exit":
        kinds.append(str(events.get(timeout=10)[0]))

    gated = seen_line(Path(spec.log_path).read_text())
    plain = seen_line(direct.stdout)
    for key in ("argv", "path0", "file", "main_file", "name", "pickled"):
        assert gated[key] == plain[key], key
    assert gated["name"] == gated["pickled"] == "__main__"
    assert gated["path0"] == str(script.parent)
    assert gated["gate_variable"] is False  # the gate leaves no trace in the environment
    assert gated["params"] == json.dumps({"x": 1.5})


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('def f():\n    raise ValueError("bad " + sys.argv[1])\nprint("out")\nf()\n', 1),
        ("def (\n", 1),  # a syntax error
        ('print("bye")\nsys.exit(3)\n', 3),
    ],
)
def test_a_gated_script_ends_as_it_would_without_the_gate(
    tmp_path: Path, body: str, code: int
) -> None:
    script = tmp_path / "ends.py"
    script.write_text("import sys\n" + body if "def (" not in body else body)
    direct = subprocess.run(
        [sys.executable, str(script), "x"], capture_output=True, text=True, timeout=60
    )
    spec = TrialSpec(1, 0, {}, str(tmp_path / "trial.log"))
    events: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
    trial = CommandTrial(
        [sys.executable, str(script), "x"], spec, dict(os.environ), events, gated=True
    )
    trial.open_gate()
    assert trial.process.wait(timeout=30) == direct.returncode == code
    log = Path(spec.log_path).read_text()
    header = f"$ {sys.executable} {script} x\n"
    assert log == header + direct.stdout + direct.stderr  # the same traceback, line for line


def test_a_closed_gate_ends_the_process_unrun(tmp_path: Path, record: Path) -> None:
    script = write_script(tmp_path, "never.py", 'note("ran")\n')
    spec = TrialSpec(1, 3, {}, str(tmp_path / "trial.log"))
    events: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
    env = {**os.environ, RECORD_VARIABLE: str(record)}
    trial = CommandTrial([sys.executable, str(script)], spec, env, events, gated=True)
    trial.close_gate()
    assert trial.process.wait(timeout=30) == 0
    assert notes(record) == []


def test_each_slot_starts_its_next_trial_before_its_turn_and_runs_it_only_then(
    tmp_path: Path, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.4")
    body = "note('born', created=__import__('psutil').Process().create_time())\n" + TIMED_TRIAL
    script = write_script(tmp_path, "timed.py", body)
    result = paralela.sweep(
        command(script, "--x", "{x}"), SPACE, n_trials=6, workers=2, run_dir=tmp_path / "r"
    )

    assert [t.state for t in result.trials] == ["COMPLETE"] * 6
    born = {n["number"]: n for n in notes(record, "born")}
    ran = {n["number"]: n for n in notes(record, "ran")}
    assert sorted(ran) == list(range(6))  # each trial ran once
    ahead = 0
    for trial in result.trials:
        assert trial.started is not None
        # No line of the script ran before its turn (its record's start)...
        assert born[trial.number]["t"] >= trial.started
        # ...but the process of most was there long before, waiting at its gate.
        if born[trial.number]["created"] < trial.started - 0.2:
            ahead += 1
    assert ahead >= 3
    logs = sorted(p.name for p in (tmp_path / "r" / "trials").iterdir())
    assert logs == [f"trial-{n:05d}.log" for n in range(6)]
    for n in range(6):  # one command line per log: no trial was started twice
        log = (tmp_path / "r" / "trials" / f"trial-{n:05d}.log").read_text()
        assert log.count("$ ") == 1


def test_at_the_timeout_the_waiting_processes_end_unrun(
    tmp_path: Path, record: Path, monkeypatch: pytest.MonkeyPatch, poll: Callable[..., None]
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.5")
    script = write_script(tmp_path, "timed.py", TIMED_TRIAL)
    run_dir = tmp_path / "r"
    result = paralela.sweep(
        command(script, "--x", "{x}"), SPACE, timeout=1.2, workers=2, run_dir=run_dir
    )

    ran = sorted(n["number"] for n in notes(record, "ran"))
    assert ran == sorted(t.number for t in result.trials)  # the waiting ones never ran
    assert all(t.state == "COMPLETE" for t in result.trials)
    logs = sorted(p.name for p in (run_dir / "trials").iterdir())
    assert logs == [f"trial-{n:05d}.log" for n in ran]
    study = optuna.load_study(
        study_name=result.study_name, storage=f"sqlite:///{run_dir / 'study.db'}"
    )
    unused = [t for t in study.get_trials() if "paralela:unused" in t.system_attrs]
    assert unused  # the trials taken for the waiting processes, given back
    assert all(t.state == TrialState.FAIL for t in unused)
    for process in children_running(ENV_GATE_FD):
        poll(lambda pid=process.pid: pid_gone(pid), timeout=10, what="a gated process to end")

    again = paralela.sweep(
        command(script, "--x", "{x}"), SPACE, n_trials=len(ran) + 1, workers=2, run_dir=run_dir
    )
    assert len([t for t in again.trials if t.state == "COMPLETE"]) == len(ran) + 1


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "fresh"])
def test_a_process_that_dies_at_its_gate_leaves_its_trial_to_a_fresh_one(
    tmp_path: Path, record: Path, fork: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trial 0 kills the process waiting for the slot's next turn, then finishes. A forked
    # one is the forker's child (its environment as /proc shows it is the forker's).
    monkeypatch.setenv("PARALELA_FORK_TRIALS", fork)
    killer = """\
    import psutil

    def waiting():
        for forker in psutil.Process(os.getppid()).children():
            try:
                if "PARALELA_FORKER_FD" in forker.environ() and forker.children():
                    return forker.children()[0]
            except (psutil.Error, OSError):
                continue
        for p in psutil.process_iter():
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if (
                "PARALELA_GATE_FD" in env
                and env.get("SWEEP_TEST_RECORD") == os.environ["SWEEP_TEST_RECORD"]
                and env.get("PARALELA_TRIAL_NUMBER") == "1"
            ):
                return p
        return None

    if os.environ["PARALELA_TRIAL_NUMBER"] == "0":
        deadline = time.monotonic() + 20
        while waiting() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        victim = waiting()
        note("killed", victim=None if victim is None else victim.pid)
        if victim is not None:
            victim.kill()
        time.sleep(0.3)
    note("ran")
    paralela.report(1.0)
    """
    script = write_script(tmp_path, "killer.py", killer)
    result = paralela.sweep(command(script), SPACE, n_trials=3, workers=1, run_dir=tmp_path / "r")

    (killed,) = notes(record, "killed")
    assert killed["victim"] is not None
    assert [t.state for t in result.trials] == ["COMPLETE"] * 3
    assert sorted(n["number"] for n in notes(record, "ran")) == [0, 1, 2]


def test_the_preloaded_modules_are_loaded_before_the_script_and_change_nothing_else(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    # Its first line notes which PRELOAD modules are already there; then it uses them.
    script = tmp_path / "parse.py"
    script.write_text(
        "import sys\n"
        f"there = sorted(n for n in {PRELOAD!r} if n in sys.modules)\n"
        "import argparse, json, math, shutil\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, required=True)\n"
        "lr = parser.parse_args().lr\n"
        "print(json.dumps({'there': there, 'lr': lr, 'sqrt': math.sqrt(lr), "
        "'shutil': shutil.__file__}))\n"
    )
    argv = [sys.executable, str(script), "--lr", "0.25"]
    direct = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    trial, spec = gated(argv, tmp_path, poll)
    assert Path(spec.log_path).read_text().count("\n") == 1  # its command line: nothing ran
    trial.open_gate()
    assert trial.process.wait(timeout=30) == 0
    seen = json.loads(Path(spec.log_path).read_text().splitlines()[-1])

    assert direct["there"] == []  # `python SCRIPT.py` loads none of them before line 1
    assert seen["there"] == sorted(PRELOAD)  # the gated process had them already
    assert {k: v for k, v in seen.items() if k != "there"} == {
        k: v for k, v in direct.items() if k != "there"
    }


def test_a_module_of_the_user_that_shadows_a_preloaded_one_loads_only_after_the_gate(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    marker = tmp_path / "imported.txt"
    code = tmp_path / "code"
    code.mkdir()
    # The user's own shutil.py beside the script: `python SCRIPT.py` imports it, not the
    # standard library's. Importing it leaves a mark.
    (code / "shutil.py").write_text(
        f"with open({str(marker)!r}, 'a') as f:\n    f.write('imported\\n')\n"
    )
    script = code / "uses.py"
    script.write_text("import json, shutil\nprint(json.dumps({'shutil': shutil.__file__}))\n")
    argv = [sys.executable, str(script)]
    direct = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert direct["shutil"] == str(code / "shutil.py")
    marker.unlink()

    trial, spec = gated(argv, tmp_path, poll)
    assert not marker.exists()  # nothing of the user's ran before the gate
    trial.open_gate()
    assert trial.process.wait(timeout=30) == 0
    seen = json.loads(Path(spec.log_path).read_text().splitlines()[-1])
    assert seen == direct
    assert marker.read_text() == "imported\n"  # once, after the gate


def test_a_script_changed_while_its_process_waits_runs_as_it_is_when_the_gate_opens(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    script = tmp_path / "changing.py"
    script.write_text("print('the first version')\n")
    trial, spec = gated([sys.executable, str(script)], tmp_path, poll)  # compiled it
    script.write_text("print('the second version, longer')\n")
    trial.open_gate()
    assert trial.process.wait(timeout=30) == 0
    assert Path(spec.log_path).read_text().splitlines()[1:] == ["the second version, longer"]


def test_the_scripts_own_garbage_is_collected_as_without_the_gate(
    tmp_path: Path, poll: Callable[..., None]
) -> None:
    # The gate freezes what it loaded (gc.freeze: Python's exit skips those objects);
    # the script's own cycles are still collected, during the run and at its exit.
    out = tmp_path / "out.txt"
    script = tmp_path / "cycles.py"
    script.write_text(
        "import gc, os, sys\n"
        "out = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
        "class Node:\n"
        "    def __init__(self, name):\n"
        "        self.name, self.peer, self.out, self.write = name, None, out, os.write\n"
        "    def __del__(self):  # (at exit, only what the object holds is left)\n"
        "        self.write(self.out, f'freed {self.name}\\n'.encode())\n"
        "def cycle(name):\n"
        "    a, b = Node(name), Node(name + '-peer')\n"
        "    a.peer, b.peer = b, a\n"
        "cycle('during')\n"
        "gc.collect()\n"
        "kept = Node('at-exit')\n"
        "kept.peer = kept\n"
    )
    subprocess.run([sys.executable, str(script), str(out)], check=True, timeout=60)
    direct = sorted(out.read_text().splitlines())
    out.unlink()
    trial, _ = gated([sys.executable, str(script), str(out)], tmp_path, poll)
    trial.open_gate()
    assert trial.process.wait(timeout=30) == 0
    assert sorted(out.read_text().splitlines()) == direct
    assert direct == ["freed at-exit", "freed during", "freed during-peer"]
