"""SIGTERM stops every long command as Ctrl-C does: exit 143, what finished kept, a resume hint.

SIGTERM is how a cluster stops a job: Slurm sends it at the time limit, on preemption and
on ``scancel`` to every process of the job step, then SIGKILL after ``KillWait``. Each
test runs the real command in a session of its own; its own work sends SIGTERM to every
process of the group, as Slurm does (the driver, the group's leader, last: the sender
first writes that it outlived its own signal), once (an ``O_EXCL`` marker), and then
sleeps: the driver must stop it. The workers must outlive that SIGTERM (the driver decides), the
driver must stop within seconds, say what it kept and how to go on, exit 143, and leave
no process behind; the rerun finishes without doing again what had finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from compare_helpers import write_wine_csv
from helpers import default_sigint

from paralela.cli._errors import EXIT_INTERRUPTED, EXIT_TERMINATED

STOPPED = "Error: Stopped by SIGTERM (scancel, a time limit or preemption)."

# The work that sends SIGTERM, imported by the command from its working directory.
STOPPERS = """\
import os, signal, time


def once(name):
    # True the first time only, across processes and runs.
    try:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def sigterm_everyone():
    # As Slurm at a time limit: SIGTERM to every process of the job (here: the group),
    # then wait for the driver to stop this one. The driver (the group's leader) gets it
    # last, once this process has written that it outlived its own: the driver, stopping
    # on the signal, may stop this worker at any moment after.
    group = os.getpgid(0)
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if pid != group and os.getpgid(pid) == group:
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    logged("survived", os.getpid())
    os.kill(group, signal.SIGTERM)
    time.sleep(60)


def logged(kind, value):
    with open(f"{kind}.log", "a") as log:
        log.write(f"{value}\\n")


def square(x):
    logged("calls", x)
    if x == 5 and once("stopped"):
        sigterm_everyone()
    return x * x


def mapper(line):
    for word in line.split():
        if word == "stop" and once("stopped"):
            sigterm_everyone()
        yield word, 1


def reducer(word, counts):
    return sum(counts)


class Doubler:
    def predict(self, batch):
        if 5 in batch and once("stopped"):
            sigterm_everyone()
        return [2 * x for x in batch]
"""


MODELS = """\
from sklearn.tree import DecisionTreeClassifier

from stoppers import logged, once, sigterm_everyone


class Stopping(DecisionTreeClassifier):
    def fit(self, X, y, sample_weight=None, check_input=True):
        logged("fits", f"{self.max_depth}:{len(X)}:{float(X.sum())!r}")
        if self.max_depth == 3 and once("stopped"):
            sigterm_everyone()
        return super().fit(X, y, sample_weight=sample_weight, check_input=check_input)
"""

SPACE = """\
params:
  model: {type: choice, options: {stopping: {max_depth: [1, 2, 3, 4]}}}
estimators: {stopping: "models:Stopping"}
"""


def group_alive(pgid: int) -> list[psutil.Process]:
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def run_until_stopped(
    cwd: Path, poll: Callable[..., None], *args: str, when: Callable[[], bool] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m paralela ARGS`` in a session of its own until it exits; its work
    sends the SIGTERM (or the test does, to the whole group, once ``when()`` holds).
    Checks that it stopped within seconds and left no process of its group behind."""
    process = subprocess.Popen(
        [sys.executable, "-m", "paralela", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a job step's processes
    )
    try:
        if when is not None:
            poll(when, timeout=60, what="the work to start")
            os.killpg(process.pid, signal.SIGTERM)
        else:
            poll(lambda: (cwd / "stopped").exists(), timeout=60, what="the SIGTERM")
        sent = time.monotonic()
        out, err = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert took < 20, f"stopping took {took:.1f} s"
    poll(lambda: not group_alive(process.pid), timeout=15, what="every process to exit")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def paralela(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
    )


def assert_survived(workdir: Path) -> None:
    """The worker that sent the SIGTERM wrote after its own signal: it did not die of it."""
    assert (workdir / "survived.log").exists(), "the worker died of the SIGTERM"


def assert_stopped(proc: subprocess.CompletedProcess[str], hint: str) -> None:
    assert proc.returncode == EXIT_TERMINATED, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(STOPPED), proc.stderr
    assert hint in lines[0], proc.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "stoppers.py").write_text(STOPPERS)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(12)))
    return tmp_path


@pytest.mark.parametrize("backend", ["processes", "sequential"])
def test_map_keeps_finished_chunks_and_resumes_without_redoing_them(
    workdir: Path, poll: Callable[..., None], backend: str
) -> None:
    args = ["map", "stoppers:square", "-i", "items.jsonl", "-o", "out.jsonl", "--run-dir", "run"]
    args += ["--chunksize", "1", "--workers", "2", "--backend", backend]
    proc = run_until_stopped(workdir, poll, *args)
    assert_stopped(proc, "Finished chunks are kept in run; run again to resume.")
    if backend == "processes":
        assert_survived(workdir)
    summary = json.loads((workdir / "run" / "summary.json").read_text())
    chunks = list((workdir / "run" / "chunks").iterdir())
    assert all(p.suffix == ".pkl" for p in chunks), chunks  # whole chunk files only
    finished = {int(p.stem.split("-")[0]) for p in chunks}
    assert 5 not in finished
    assert summary["computed_items"] >= len(finished)  # one may be cut short as it is kept
    assert not (workdir / "out.jsonl").exists()
    first = (workdir / "calls.log").read_text().split()

    done = paralela(workdir, *args)
    assert done.returncode == 0, done.stderr
    lines = (workdir / "out.jsonl").read_text().splitlines()
    results = [json.loads(line)["result"] for line in lines]
    assert results == [i * i for i in range(12)]
    again = set((workdir / "calls.log").read_text().split()[len(first) :])
    assert not finished & {int(x) for x in again}, "a finished chunk was computed again"
    assert set(again) | {str(i) for i in finished} == {str(i) for i in range(12)}


@pytest.mark.slow
def test_mapreduce_stops_and_reruns_to_the_counts(workdir: Path, poll: Callable[..., None]) -> None:
    corpus = workdir / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"{i}.txt").write_text("a b a\n" * 20 + ("stop\n" if i == 2 else ""))
    args = ["mapreduce", "stoppers.py", "-i", "corpus", "--run-dir", "run", "--workers", "2"]
    proc = run_until_stopped(workdir, poll, *args)
    assert_stopped(proc, "Finished tasks are kept in run; run again to resume.")
    assert_survived(workdir)
    done = paralela(workdir, *args)
    assert done.returncode == 0, done.stderr
    pairs = [json.loads(line) for line in done.stdout.splitlines()]
    assert {p["key"]: p["value"] for p in pairs} == {"a": 160, "b": 80, "stop": 1}


@pytest.mark.slow
def test_predict_stops_and_reruns_to_every_prediction(
    workdir: Path, poll: Callable[..., None]
) -> None:
    inputs = workdir / "inputs"
    inputs.mkdir()
    for shard in range(4):  # one shard per file
        (inputs / f"{shard}.jsonl").write_text("".join(f"{3 * shard + i}\n" for i in range(3)))
    args = ["predict", "stoppers:Doubler", "-i", "inputs", "-o", "out", "--run-dir", "run"]
    args += ["--batch-size", "2", "--workers", "2"]
    proc = run_until_stopped(workdir, poll, *args)
    assert_stopped(proc, "Finished shards are kept in run; run the same command again")
    assert_survived(workdir)
    done = paralela(workdir, *args)
    assert done.returncode == 0, done.stderr
    parts = (workdir / "out").glob("part-*")
    rows = [json.loads(line) for part in parts for line in part.read_text().splitlines()]
    assert sorted(r["output"] for r in rows) == [2 * i for i in range(12)]


def test_stage_stops_keeps_finished_files_and_goes_on(
    workdir: Path, poll: Callable[..., None]
) -> None:
    src = workdir / "data"
    src.mkdir()
    for i in range(400):
        (src / f"{i:03}.bin").write_bytes(os.urandom(4096))
    dest = workdir / "dest"

    def copying() -> bool:
        return dest.is_dir() and any(dest.rglob("*.bin"))

    proc = run_until_stopped(workdir, poll, "stage", "data", "dest", "--workers", "1", when=copying)
    assert_stopped(proc, "Finished files are recorded")
    kept = {p.name for p in dest.rglob("*.bin")}
    assert 0 < len(kept) < 400
    done = paralela(workdir, "stage", "data", "dest")
    assert done.returncode == 0, done.stderr
    assert {p.name for p in dest.rglob("*") if p.is_file() and p.suffix == ".bin"} == {
        p.name for p in src.iterdir()
    }


@pytest.mark.slow
def test_compare_keeps_finished_folds_and_goes_on_without_refitting_them(
    workdir: Path, poll: Callable[..., None]
) -> None:
    write_wine_csv(workdir / "wine.csv")
    (workdir / "models.py").write_text(MODELS)
    (workdir / "space.yaml").write_text(SPACE)
    args = ["compare", "space.yaml", "--data", "wine.csv", "--target", "label", "--cv", "3"]
    args += ["--workers", "2", "--run-dir", "run", "--no-refit", "--no-progress"]
    proc = run_until_stopped(workdir, poll, *args)
    assert_stopped(proc, "run the same command again")
    assert "folds.jsonl" in proc.stderr
    assert_survived(workdir)
    lines = (workdir / "run" / "folds.jsonl").read_text().splitlines()
    finished = sum(json.loads(line)["kind"] == "fold" for line in lines)
    first = len((workdir / "fits.log").read_text().splitlines())

    done = paralela(workdir, *args)
    assert done.returncode == 0, done.stderr
    assert "4 candidates (4 complete, 0 pruned, 0 failed)" in done.stdout
    refitted = (workdir / "fits.log").read_text().splitlines()[first:]
    assert len(refitted) == 4 * 3 - finished  # finished folds are not fitted again
    assert len(set(refitted)) == len(refitted)


# While the commands are imported (inside main): a real signal from an import hook.
WHILE_IMPORTING = """\
import os, signal, sys

class SignalOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "paralela.cli._map":
            os.kill(os.getpid(), int(os.environ["SIGNAL"]))
        return None

sys.meta_path.insert(0, SignalOnImport())
sys.argv[:] = ["paralela", "info"]
from paralela.cli import main
main()
"""

# While a command sets up (imports the user's function), before its work begins.
SIGNALS_ITSELF = """\
import os, signal
os.kill(os.getpid(), int(os.environ["SIGNAL"]))

def square(x):
    return x * x
"""


@pytest.mark.parametrize(
    ("sig", "code", "head"),
    [
        (signal.SIGINT, EXIT_INTERRUPTED, "Error: Interrupted."),
        (signal.SIGTERM, EXIT_TERMINATED, STOPPED),
    ],
    ids=["ctrl-c", "sigterm"],
)
@pytest.mark.parametrize("when", ["importing", "loading the function"])
def test_an_interrupt_while_a_command_starts_is_one_line(
    workdir: Path, sig: signal.Signals, code: int, head: str, when: str
) -> None:
    if when == "importing":
        argv = [sys.executable, "-c", WHILE_IMPORTING]
    else:
        (workdir / "signals_itself.py").write_text(SIGNALS_ITSELF)
        argv = [sys.executable, "-m", "paralela", "map", "signals_itself:square"]
        argv += ["-i", "items.jsonl", "-o", "out.jsonl"]
    proc = subprocess.run(
        argv,
        cwd=workdir,
        env={**os.environ, "SIGNAL": str(int(sig))},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=default_sigint,  # Ctrl-C reaches it even under a runner ignoring SIGINT
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith(head), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # no traceback
