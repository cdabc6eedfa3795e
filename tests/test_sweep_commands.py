"""``paralela.sweep`` over commands: real trial processes started with their ``{param}``
placeholders filled in, pinned to a slot, reporting through their pipe, stopped by the
pruner with real signals; real Optuna on a real SQLite database.

GPUs: the machine's real ones are hidden (``CUDA_VISIBLE_DEVICES=""``); the GPU tests
show three GPUs through a fake ``nvidia-smi`` (NVML hidden).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sweep_helpers import (
    RECORD_VARIABLE,
    SEEDED_STEPS,
    SLEEP_VARIABLE,
    TIMED_TRIAL,
    command,
    devices_overlap,
    intervals_by_device,
    most_at_once,
    notes,
    pid_gone,
    seed_study,
    show_three_gpus,
    write_script,
)

import paralela
from paralela.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

SPACE = {"x": {"type": "float", "low": -2.0, "high": 3.0}}

# The first trial of the run reports a bad value every 50 ms, then would sleep a minute
# (the pruner must stop it first); the others report a good value at once.
PRUNED_TRIAL = f"""\
import sweep_helpers
from pathlib import Path

if sweep_helpers.claim_first(Path(os.environ["SWEEP_TEST_RECORD"]).with_suffix(".first")):
    if "--ignore-sigterm" in sys.argv:
        signal.signal(signal.SIGTERM, lambda *_: note("sigterm-ignored"))
    note("bad-start")
    for step in range({SEEDED_STEPS}):
        paralela.report(100.0, step=step)
        time.sleep(0.05)
    time.sleep(60)
    note("bad-not-pruned")
else:
    note("good-start")
    paralela.report(0.1)
"""

# What a trial does is the "mode" column of a CSV space.
MODES_TRIAL = """\
mode = sys.argv[1]
note("ran", mode=mode)
if mode == "ok":
    paralela.report(1.0)
elif mode == "crash":
    for i in range(200):
        print(f"line {i} of a long traceback-like output", flush=True)
    print("the last words of the crash", file=sys.stderr, flush=True)
    sys.exit(3)
elif mode == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "silent":
    print("finished without reporting anything")
"""

REPORTING_TRIAL = """\
x = float(sys.argv[1])
for step in range(3):
    paralela.report(x + 1.0 / (step + 1))
"""


@pytest.fixture(autouse=True)
def _cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same CPU slots on every machine: hide real GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file trials note what they saw in (see ``sweep_helpers.note``)."""
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(path))
    return path


@pytest.fixture
def three_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """Three GPUs, seen through a fake nvidia-smi; returns their UUIDs."""
    return show_three_gpus(monkeypatch, tmp_path / "gpus")


@pytest.fixture
def timed_trial(tmp_path: Path) -> list[str]:
    """``python timed.py --x {x}`` (see ``sweep_helpers.TIMED_TRIAL``)."""
    return command(write_script(tmp_path, "timed.py", TIMED_TRIAL), "--x", "{x}")


# -- 1. one trial per GPU slot --------------------------------------------------------


def test_command_trials_get_one_gpu_each_and_never_share_one(
    three_gpus: tuple[str, ...],
    timed_trial: list[str],
    record: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SLEEP_VARIABLE, "0.3")
    result = paralela.sweep(timed_trial, SPACE, n_trials=9, gpus="0,1,2", run_dir=tmp_path / "r")

    assert result.slots == 3
    ran = notes(record, "ran")
    assert len(ran) == 9
    by_device = intervals_by_device(ran)
    assert set(by_device) == set(three_gpus)  # each trial saw exactly one GPU, by UUID
    for device, intervals in by_device.items():
        assert most_at_once(intervals) == 1, f"two trials at once on {device}"
    assert devices_overlap(by_device), "the three GPUs never ran trials at the same time"
    seen = {n["number"]: n["devices"] for n in ran}
    assert {t.number: t.devices for t in result.trials} == seen
    assert {t.slot for t in result.trials} == {0, 1, 2}


def test_gpus_restricts_the_sweep_to_those_gpus(
    three_gpus: tuple[str, ...], timed_trial: list[str], record: Path, tmp_path: Path
) -> None:
    result = paralela.sweep(timed_trial, SPACE, n_trials=6, gpus="0,2", run_dir=tmp_path / "r")

    assert result.slots == 2
    assert {n["devices"] for n in notes(record, "ran")} == {three_gpus[0], three_gpus[2]}


def test_gpus_none_gives_cpu_slots_that_hide_the_gpus(
    three_gpus: tuple[str, ...], timed_trial: list[str], record: Path, tmp_path: Path
) -> None:
    result = paralela.sweep(
        timed_trial, SPACE, n_trials=3, workers=2, gpus="none", run_dir=tmp_path / "r"
    )

    assert result.slots == 2
    assert {n["devices"] for n in notes(record, "ran")} == {""}


def test_min_free_gpu_memory_skips_gpus_in_use(
    timed_trial: list[str], record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uuids = show_three_gpus(monkeypatch, tmp_path / "gpus", free_mib=(40000, 1000, 30000))
    result = paralela.sweep(
        timed_trial, SPACE, n_trials=4, min_free_gpu_memory=10, run_dir=tmp_path / "r"
    )

    assert result.slots == 2
    assert {n["devices"] for n in notes(record, "ran")} == {uuids[0], uuids[2]}
    assert "skipped GPUs in use by others (less than 10 GiB free): 1" in result.notes
    with pytest.raises(ConfigError, match="No GPU has 100 GiB free"):
        paralela.sweep(
            timed_trial, SPACE, n_trials=4, min_free_gpu_memory=100, run_dir=tmp_path / "r2"
        )


def test_a_gpu_that_is_not_there_is_a_config_error(
    three_gpus: tuple[str, ...], timed_trial: list[str], record: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"GPU '7' in gpus='0,7' is not visible"):
        paralela.sweep(timed_trial, SPACE, n_trials=2, gpus="0,7", run_dir=tmp_path / "r")
    assert notes(record) == []


# -- 2. pruning stops the process and frees its slot ----------------------------------


@pytest.mark.parametrize(
    ("ignores_sigterm", "stopped_by"),
    [(False, signal.SIGTERM), (True, signal.SIGKILL)],
    ids=["sigterm", "sigkill-after-grace"],
)
def test_a_pruned_command_is_stopped_and_its_slot_runs_the_next_trial(
    ignores_sigterm: bool,
    stopped_by: int,
    record: Path,
    tmp_path: Path,
    poll: Callable[..., None],
) -> None:
    run_dir = tmp_path / "run"
    seed_study(run_dir, "prune")  # four good complete trials for the median to compare with
    script = write_script(tmp_path, "prune.py", PRUNED_TRIAL)
    argv = command(script, *(["--ignore-sigterm"] if ignores_sigterm else []))
    grace = 1.0
    result = paralela.sweep(
        argv,
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        n_trials=6,
        workers=1,
        pruner="median",
        grace_period=grace,
        run_dir=run_dir,
        study_name="prune",
    )

    assert [t.state for t in result.trials] == ["COMPLETE"] * 4 + ["PRUNED", "COMPLETE"]
    pruned, after = result.trials[4], result.trials[5]
    assert pruned.exit_code == -stopped_by
    assert 1 <= max(pruned.intermediate) < 10  # pruned at the first step past the warm-up
    assert after.value == 0.1
    assert after.slot == pruned.slot == 0
    assert notes(record, "bad-not-pruned") == []
    (bad,) = notes(record, "bad-start")
    poll(lambda: pid_gone(bad["pid"]), timeout=5, what="the pruned trial's process to exit")
    (good,) = notes(record, "good-start")
    assert good["t"] - bad["t"] < 15, "the next trial should start long before the 60 s"
    ignored = notes(record, "sigterm-ignored")
    if ignores_sigterm:
        assert len(ignored) == 1
        assert good["t"] - ignored[0]["t"] >= grace - 0.1  # SIGKILL came after the grace
    else:
        assert ignored == []


# -- 5. errors --------------------------------------------------------------------------


def test_failing_and_silent_commands_are_recorded_and_the_sweep_goes_on(
    record: Path, tmp_path: Path
) -> None:
    modes = ["ok", "crash", "silent", "killed", "ok"]
    space = tmp_path / "modes.csv"
    space.write_text("mode\n" + "\n".join(modes) + "\n")
    script = write_script(tmp_path, "modes.py", MODES_TRIAL)
    result = paralela.sweep(command(script, "{mode}"), space, workers=2, run_dir=tmp_path / "r")

    assert [n["mode"] for n in sorted(notes(record, "ran"), key=lambda n: n["number"])] == modes
    by_mode = {t.params["mode"]: t for t in result.trials}
    assert [t.state for t in result.trials] == ["COMPLETE", "FAIL", "FAIL", "FAIL", "COMPLETE"]
    assert by_mode["ok"].value == 1.0

    crash = by_mode["crash"]
    assert crash.exit_code == 3
    assert crash.error is not None
    assert crash.error.startswith("the trial command ended with exit code 3; the end of its log:")
    assert "the last words of the crash" in crash.error
    assert "line 199 of" in crash.error
    assert "line 0 of" not in crash.error  # the tail of the log, not all of it
    assert crash.log_path is not None
    assert "line 0 of" in Path(crash.log_path).read_text()  # which is whole in the log

    killed = by_mode["killed"]
    assert killed.exit_code == -signal.SIGKILL
    assert killed.error is not None
    assert "ended with signal 9" in killed.error

    silent = by_mode["silent"]
    assert silent.exit_code == 0
    assert silent.error is not None
    assert "exited 0 but reported no value" in silent.error
    assert "paralela.report(value)" in silent.error


def test_a_command_that_is_not_found_is_refused_before_any_trial(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="Trial command not found: 'no-such-trainer-xyz'"):
        paralela.sweep(["no-such-trainer-xyz", "--x", "{x}"], SPACE, n_trials=2, run_dir=run_dir)
    assert not run_dir.exists()


def test_a_placeholder_the_space_does_not_define_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        paralela.sweep(
            [sys.executable, "train.py", "--x", "{x}", "--lr", "{lr}"],
            SPACE,
            n_trials=2,
            run_dir=run_dir,
        )
    assert "uses {lr}, which the space does not define; its parameters are: x" in str(info.value)
    assert not run_dir.exists()


def test_max_failures_stops_a_sweep_of_failing_commands(record: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path, "modes.py", MODES_TRIAL)
    started = time.monotonic()
    with pytest.raises(paralela.SweepError, match="more than max_failures=0") as info:
        paralela.sweep(
            command(script, "{mode}"),
            {"mode": ["crash"]},
            n_trials=100,
            workers=2,
            max_failures=0,
            run_dir=tmp_path / "r",
        )
    assert time.monotonic() - started < 20
    assert "the last words of the crash" in str(info.value)
    assert 1 <= len(notes(record, "ran")) <= 2


# -- 6. what a command trial sees and leaves ------------------------------------------


def test_placeholders_params_logs_and_values(
    timed_trial: list[str], record: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    space = {**SPACE, "epochs": 3}
    result = paralela.sweep(timed_trial, space, n_trials=4, workers=2, run_dir=run_dir)

    ran = {n["number"]: n for n in notes(record, "ran")}
    assert sorted(ran) == [t.number for t in result.trials] == [0, 1, 2, 3]
    for trial in result.trials:
        seen = ran[trial.number]
        # the command line and $PARALELA_TRIAL_PARAMS (current_params()) agree
        assert seen["argv_x"] == seen["params"]["x"] == trial.params["x"]
        assert seen["params"] == trial.params == {"x": trial.params["x"], "epochs": 3}
        assert trial.state == "COMPLETE"
        assert trial.value == (trial.params["x"] - 1.0) ** 2
        assert trial.intermediate == {0: trial.value}
        assert trial.exit_code == 0
        assert trial.log_path == str(run_dir / "trials" / f"trial-{trial.number:05d}.log")
        log = Path(trial.log_path).read_text()
        assert f"--x {trial.params['x']}\n" in log.splitlines(keepends=True)[0]
        assert f"command trial output: x={trial.params['x']!r}" in log
    assert result.best_value == min(t.value for t in result.trials if t.value is not None)
    assert (run_dir / "trials.csv").read_text().count("\n") == 5


def test_every_report_is_an_intermediate_value_and_the_last_is_the_value(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "reports.py", REPORTING_TRIAL)
    result = paralela.sweep(command(script, "{x}"), SPACE, n_trials=2, run_dir=tmp_path / "r")

    for trial in result.trials:
        x = trial.params["x"]
        assert trial.intermediate == {0: x + 1.0, 1: x + 0.5, 2: x + 1.0 / 3}
        assert trial.value == x + 1.0 / 3


def test_a_sweep_stopped_by_failures_stops_its_running_trials_and_requeues_them(
    record: Path, tmp_path: Path, poll: Callable[..., None]
) -> None:
    # One trial crashes once the other is surely running a one-minute sleep: the sweep
    # stops at once, stops the sleeping trial, and queues it again for the next run.
    script = write_script(
        tmp_path,
        "stop.py",
        """\
        import sweep_helpers
        from pathlib import Path

        note("ran", mode=sys.argv[1])
        if sys.argv[1] == "crash":
            record = Path(os.environ["SWEEP_TEST_RECORD"])
            deadline = time.monotonic() + 20
            while len(sweep_helpers.notes(record, "ran")) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            sys.exit(3)
        time.sleep(60)
        """,
    )
    space = tmp_path / "modes.csv"
    space.write_text("mode\nsleep\ncrash\n")
    run_dir = tmp_path / "run"
    started = time.monotonic()
    with pytest.raises(paralela.SweepError, match="1 trials failed, more than max_failures=0"):
        paralela.sweep(command(script, "{mode}"), space, workers=2, max_failures=0, run_dir=run_dir)
    assert time.monotonic() - started < 20, "the sweep waited for the sleeping trial"
    (sleeping,) = [n for n in notes(record, "ran") if n["mode"] == "sleep"]
    poll(lambda: pid_gone(sleeping["pid"]), timeout=10, what="the running trial to stop")

    (name,) = optuna.get_all_study_names(f"sqlite:///{run_dir / 'study.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{run_dir / 'study.db'}")
    by_number = {t.number: t for t in study.trials}
    assert by_number[1].state == TrialState.FAIL  # the crash
    assert by_number[0].state == TrialState.FAIL
    assert by_number[0].system_attrs["paralela:interrupted"] is True
    (again,) = study.get_trials(states=(TrialState.WAITING,))
    assert again.system_attrs["fixed_params"] == {"mode": "sleep"}
    assert again.user_attrs == {"paralela:rerun_of": 0}
