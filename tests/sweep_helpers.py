"""Shared by the sweep tests: a fake ``nvidia-smi`` with three GPUs, trial scripts written
to a test's directory, objectives for function trials, and readers for what trials noted.

Every trial (function or command) notes what it saw with :func:`note`: one JSON line,
appended with ``O_APPEND`` (whole lines, whatever process writes), to the file named by
``$SWEEP_TEST_RECORD``. Tests read the lines back with :func:`notes` and check what
really ran, where and when. This module imports nothing heavy: command trials and the
sweep's worker processes import it too.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent
RECORD_VARIABLE = "SWEEP_TEST_RECORD"
SLEEP_VARIABLE = "SWEEP_TEST_SLEEP"  # seconds a timed trial lasts
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# -- a fake nvidia-smi: three GPUs ---------------------------------------------------

GPU_UUIDS = (
    "GPU-0a0a0a0a-0000-0000-0000-000000000000",
    "GPU-1b1b1b1b-0000-0000-0000-000000000000",
    "GPU-2c2c2c2c-0000-0000-0000-000000000000",
)

# It answers only the query paralela makes (and -L), so a change of query shows up.
_FAKE_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
cat <<'END'
{listing}
END
exit 0
fi
if [ "$1" != "--query-gpu=index,uuid,name,memory.total,memory.free" ] || \\
   [ "$2" != "--format=csv,noheader,nounits" ]; then
  echo "unexpected arguments: $*" >&2
  exit 2
fi
cat <<'END'
{rows}
END
"""


def write_fake_nvidia_smi(directory: Path, free_mib: Iterable[int] = (40000,) * 3) -> Path:
    """An executable ``nvidia-smi`` in ``directory`` listing three A100s with
    :data:`GPU_UUIDS` and ``free_mib`` MiB free each; returns ``directory``."""
    free = list(free_mib)
    rows = "\n".join(
        f"{i}, {uuid}, NVIDIA A100-SXM4-40GB, 40960, {free[i]}" for i, uuid in enumerate(GPU_UUIDS)
    )
    listing = "\n".join(
        f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: {uuid})" for i, uuid in enumerate(GPU_UUIDS)
    )
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "nvidia-smi"
    tool.write_text(_FAKE_SMI.format(rows=rows, listing=listing))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return directory


def write_no_nvml(directory: Path) -> Path:
    """A ``pynvml`` module that fails to import, in ``directory``: put it first on
    ``PYTHONPATH`` so that a child process falls back to ``nvidia-smi`` (the fake one)
    even on a machine with real GPUs."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pynvml.py").write_text(
        'raise ImportError("NVML is hidden from this test: it uses a fake nvidia-smi")\n'
    )
    return directory


def fake_gpu_env(
    directory: Path, free_mib: Iterable[int] = (40000,) * 3, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a child process that must see the three fake GPUs: the fake
    ``nvidia-smi`` first on PATH, NVML hidden, ``CUDA_VISIBLE_DEVICES`` unset."""
    env = dict(os.environ if base is None else base)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    smi = write_fake_nvidia_smi(directory / "bin", free_mib)
    no_nvml = write_no_nvml(directory / "no_nvml")
    env["PATH"] = f"{smi}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(no_nvml), env.get("PYTHONPATH")]))
    return env


def show_three_gpus(
    monkeypatch: Any, directory: Path, free_mib: Iterable[int] = (40000,) * 3
) -> tuple[str, ...]:
    """Make this process see the three fake GPUs (a pytest ``monkeypatch`` undoes it):
    the fake nvidia-smi on PATH, NVML "not installed", CUDA_VISIBLE_DEVICES unset."""
    env = fake_gpu_env(directory, free_mib)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails
    return GPU_UUIDS


# -- what trials note ----------------------------------------------------------------


def note(event: str, **fields: Any) -> None:
    """Append ``{"event": event, pid, devices, trial number, time, **fields}`` as one
    JSON line to ``$SWEEP_TEST_RECORD``."""
    line = json.dumps(
        {
            "event": event,
            "pid": os.getpid(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "number": int(os.environ.get("PARALELA_TRIAL_NUMBER", "-1")),
            "t": time.time(),
            **fields,
        }
    )
    fd = os.open(os.environ[RECORD_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def notes(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The lines noted in ``path`` (those of one ``event`` if given); [] before any."""
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [n for n in found if event is None or n["event"] == event]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (start, end) intervals share some time."""
    return a[0] < b[1] and b[0] < a[1]


def most_at_once(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of the (start, end) intervals that overlap at one instant."""
    edges = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    now = most = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def intervals_by_device(ran: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """The (start, end) of the noted trials, by the CUDA_VISIBLE_DEVICES they saw."""
    by_device: dict[str, list[tuple[float, float]]] = {}
    for n in ran:
        by_device.setdefault(n["devices"], []).append((n["start"], n["end"]))
    return by_device


def devices_overlap(by_device: Mapping[str, list[tuple[float, float]]]) -> bool:
    """Some two trials on different devices ran at the same time."""
    devices = list(by_device)
    return any(
        overlap(a, b)
        for i, d1 in enumerate(devices)
        for d2 in devices[i + 1 :]
        for a in by_device[d1]
        for b in by_device[d2]
    )


def pid_gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- a study seeded with good trials (so that a pruner has something to compare with) -

SEEDED_STEPS = 200


def seed_study(run_dir: Path, study_name: str, n: int = 4, value: float = 0.1) -> None:
    """Put ``n`` completed trials of the space ``{"x": float in [0, 1]}`` in the SQLite
    database of ``run_dir``, each with ``value`` at every step below :data:`SEEDED_STEPS`."""
    import optuna
    from optuna.distributions import FloatDistribution

    run_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=study_name, storage=f"sqlite:///{run_dir.resolve() / 'study.db'}"
    )
    for i in range(n):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": i / 10},
                distributions={"x": FloatDistribution(0.0, 1.0)},
                value=value,
                intermediate_values=dict.fromkeys(range(SEEDED_STEPS), value),
            )
        )


# -- function trials (module level: the sweep's worker processes import them) --------


def timed(params: dict[str, Any]) -> float:
    """Lasts ``$SWEEP_TEST_SLEEP`` seconds; notes ("ran", its devices, start, end)."""
    start = time.time()
    time.sleep(float(os.environ.get(SLEEP_VARIABLE, "0.05")))
    note("ran", start=start, end=time.time(), params=params)
    return float(params["x"])


def quadratic(params: dict[str, Any]) -> float:
    """(x - 1)^2, with its output in the trial's log and what it was given noted."""
    import paralela

    print(f"function trial output: x={params['x']!r}")
    note("ran", params=params, current=paralela.current_params())
    return (float(params["x"]) - 1.0) ** 2


def reporting(params: dict[str, Any]) -> None:
    """Reports 1/(step+1) + x for three steps and returns nothing: the last report is
    the value."""
    import paralela

    for step in range(3):
        paralela.report(1.0 / (step + 1) + float(params["x"]), step=step)


def two_objectives(params: dict[str, Any]) -> tuple[float, float]:
    """x^2 (to minimise) and sin(x) (to maximise)."""
    import math

    x = float(params["x"])
    return x * x, math.sin(x)


def worse_than_seeded(trial: Any) -> float:
    """An Optuna objective as the pruning examples write it, worse at every step than
    the trials of :func:`seed_study`: a median pruner past its start-up trials stops it."""
    import optuna

    trial.suggest_float("x", 0.0, 1.0)
    for step in range(3):
        trial.report(100.0, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return 100.0


def modules_loaded(params: dict[str, Any]) -> float:
    """Notes whether Optuna is loaded in this worker (a trial that reports nothing needs
    no Optuna, nor its start-up time)."""
    note("modules", optuna="optuna" in sys.modules, sqlalchemy="sqlalchemy" in sys.modules)
    return float(params["x"])


def raises(params: dict[str, Any]) -> float:
    """A bug in the objective."""
    note("ran", params=params)
    raise ValueError(f"objective broke on x={params['x']}")


def returns_none(params: dict[str, Any]) -> None:
    """Neither returns nor reports a value."""
    note("ran", params=params)


def bad_after_first(params: dict[str, Any]) -> float:
    """The first trial to run reports a bad value every step for a long time (the pruner
    must stop it); the others finish at once with a good value."""
    import paralela

    if claim_first(Path(os.environ[RECORD_VARIABLE]).with_suffix(".first")):
        note("bad-start")
        for step in range(SEEDED_STEPS):
            paralela.report(100.0, step=step)  # raises TrialPruned once the pruner says so
            time.sleep(0.05)
        note("bad-not-pruned")
        return 100.0
    note("good")
    return 0.1


def claim_first(marker: Path) -> bool:
    """True for exactly one caller, whatever process: creates ``marker`` exclusively."""
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def slow_by_phase(params: dict[str, Any]) -> float:
    """A trial of the killed-driver tests: in the run of phase "first" (``$SWEEP_TEST_PHASE``)
    the first two trials to start end at once and the others last a minute (the driver is
    killed meanwhile); in other phases every trial ends at once. Notes "start" and "end"."""
    phase = os.environ["SWEEP_TEST_PHASE"]
    note("start", params=params, phase=phase)
    if phase == "first" and not claim_quick():
        time.sleep(60)
    note("end", params=params, phase=phase)
    return float(params["x"])


def slow_by_phase_trial(trial: Any) -> float:
    """:func:`slow_by_phase` as an Optuna objective: it samples ``x`` itself."""
    return slow_by_phase({"x": trial.suggest_float("x", 0.0, 1.0)})


def claim_quick() -> bool:
    """True for the first two callers (any process) of a test."""
    directory = Path(os.environ[RECORD_VARIABLE]).parent
    return any(claim_first(directory / f"quick-{i}") for i in range(2))


# -- command trials: scripts written to the test's directory -------------------------

_PREAMBLE = f"""\
import os
import signal
import sys
import time

sys.path.insert(0, {str(TESTS_DIR)!r})
import paralela
from sweep_helpers import note
"""


def write_script(directory: Path, name: str, body: str) -> Path:
    """A trial script: imports (``paralela``, ``note`` from this module), then ``body``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(_PREAMBLE + "\n" + textwrap.dedent(body))
    return path


# Reads --x from its command line, checks it against current_params(), prints, lasts
# $SWEEP_TEST_SLEEP seconds, notes ("ran", devices, start, end), reports (x - 1)^2.
TIMED_TRIAL = """\
x = float(sys.argv[sys.argv.index("--x") + 1])
params = paralela.current_params()
print(f"command trial output: x={x!r}", flush=True)
start = time.time()
time.sleep(float(os.environ.get("SWEEP_TEST_SLEEP", "0.05")))
note("ran", start=start, end=time.time(), params=params, argv_x=x)
paralela.report((x - 1.0) ** 2)
"""

# The killed-driver tests' command trial: :func:`slow_by_phase`.
RESUME_TRIAL = """\
import sweep_helpers
paralela.report(sweep_helpers.slow_by_phase(paralela.current_params()))
"""


def command(script: Path, *args: str) -> list[str]:
    """``python script ARGS``, as a trial command."""
    return [sys.executable, str(script), *args]


def interrupts(params: dict[str, Any]) -> float:
    """Code that raises KeyboardInterrupt itself (a training loop's own "stop" path)."""
    if params["x"] > 0:
        raise KeyboardInterrupt("the objective gave up")
    return float(params["x"] ** 2)


def hangs_above_zero(params: dict[str, Any]) -> float:
    """A trial that hangs (a deadlocked data loader) for x > 0; quick otherwise."""
    if params["x"] > 0:
        time.sleep(600)
    return float(params["x"] ** 2)


# A trial script that prints what it sees of its start as one JSON line (read it back
# with seen_line): what `python SCRIPT ARGS` gives it, and what a gate or fork left.
SEEN_SCRIPT = """\
import json
import os
import pickle
import sys

import __main__


class Thing:  # pickled by reference to __main__, as multiprocessing does
    pass


print(json.dumps({
    "pickled": type(pickle.loads(pickle.dumps(Thing()))).__module__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "file": __file__,
    "main_file": getattr(__main__, "__file__", None),
    "name": __name__,
    "cwd": os.getcwd(),
    "extra": os.environ.get("SWEEP_TEST_EXTRA"),
    "dropped": os.environ.get("SWEEP_TEST_DROPPED"),
    "forker_variable": "PARALELA_FORKER_FD" in os.environ,
    "gate_variable": "PARALELA_GATE_FD" in os.environ,
    "loop_modules": sorted({"select", "_socket", "marshal"} & set(sys.modules)),
    "params": os.environ.get("PARALELA_TRIAL_PARAMS"),
    "ppid": os.getppid(),
    "pgid": os.getpgid(0),
    "pid": os.getpid(),
}))
"""


def seen_line(output: str) -> dict[str, object]:
    (line,) = [x for x in output.splitlines() if x.startswith('{"pickled"')]
    seen: dict[str, object] = json.loads(line)
    return seen
