"""``paralela.map(..., backend="slurm")`` on the real local Slurm cluster.

Every item appends its index to an execution log (one ``O_APPEND`` write per line), so
a test can tell exactly which items ran how often: after a cancel, a requeue or a
retry, finished items must appear once and only the interrupted ones twice.
Items that must be interrupted block on a gate file until the test has acted; the
functions that block never wait for more than a minute, so nothing can hang.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import paralela
from paralela.backends import get_backend
from paralela.backends.slurm import SlurmBackend, cancel, requeue
from paralela.errors import ConfigError, WorkerDiedError

pytestmark = pytest.mark.slurm

# -- the work (imported by the array tasks through the driver's sys.path) --------------


def square(x: int) -> int:
    return x * x


def logged(x: int, log: str, block: frozenset[int] = frozenset(), gate: str = "") -> int:
    """Record the call; items in ``block`` wait for ``gate`` on a job's first run."""
    with open(log, "a") as f:
        f.write(f"{x}\n")
    first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    if x in block and first_run and not os.path.exists(gate):
        Path(f"{log}.blocked-{x}").touch()
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(0.05)
    return x * 10


def sees_devices(x: int) -> tuple[str, int, str, str]:
    """What a worker of an array task sees: its GPUs, pid, task and thread limit."""
    time.sleep(0.05)  # long enough for both of a task's workers to take items
    task = os.environ["SLURM_ARRAY_TASK_ID"]
    return (
        os.environ.get("CUDA_VISIBLE_DEVICES", "?"),
        os.getpid(),
        task,
        os.environ["OMP_NUM_THREADS"],
    )


def dies_once(x: int, marker: str) -> int:
    """Kills its whole array task (cpus_per_task=1 runs items in the task's process)."""
    if x == 3 and not os.path.exists(marker):
        Path(marker).touch()
        print(f"item {x}: dying on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    return x + 1


def always_dies(x: int) -> int:
    if x == 1:
        print("item 1: out of luck", file=sys.stderr, flush=True)
        os._exit(3)
    return x


# -- helpers ---------------------------------------------------------------------------


def options(partition: str, tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {
        "slurm_partition": partition,
        "slurm_job_dir": str(tmp_path / "jobs"),
        "cpus_per_task": 1,
        "timeout_min": 5,
        **more,
    }


def executions(log: Path) -> collections.Counter[int]:
    return collections.Counter(int(line) for line in log.read_text().split())


def arrays(tmp_path: Path) -> list[Path]:
    """The job directories, oldest first (one per submitted array; named ...-SEQUENCE)."""
    return sorted((tmp_path / "jobs").iterdir(), key=lambda p: int(p.name.rsplit("-", 1)[1]))


def array_id(directory: Path) -> str:
    return (directory / "array_id").read_text().strip()


def covered(run_dir: Path) -> set[int]:
    """Items finished and kept in the packed chunks' sub run directories."""
    done: set[int] = set()
    for path in run_dir.glob("packed/*/chunks/*.pkl"):  # packed/<start>-<end>/chunks/<a>-<b>
        offset = int(path.parent.parent.name.split("-")[0])
        start, end = (int(p) for p in path.stem.split("-"))
        done.update(range(offset + start, offset + end))
    return done


class Background:
    """Runs a map in a thread; ``result()`` waits with a deadline (hang-proof)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.value = call()
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = 90) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(f"the map did not end within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def backends() -> Iterator[list[SlurmBackend]]:
    """Backends made by a test; their leftover tasks are cancelled afterwards."""
    made: list[SlurmBackend] = []
    yield made
    for backend in made:
        backend.shutdown(wait=True, cancel_futures=True)


# -- tests -----------------------------------------------------------------------------


def test_map_packs_items_into_at_most_max_jobs_array_tasks(
    slurm_cluster: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    opts = options(slurm_cluster, tmp_path, max_jobs=7, cpus_per_task=2)
    results = paralela.map(square, range(500), backend="slurm", backend_options=opts)
    assert results == [x * x for x in range(500)]
    assert results.summary.chunks == 7
    [directory] = arrays(tmp_path)  # one sbatch for the whole map
    assert len(list((directory / "logs").iterdir())) == 7

    def states() -> list[str]:  # the controller's view (sacct lags a second behind)
        return subprocess.run(
            ["squeue", "-h", "-t", "all", "-r", "-j", array_id(directory), "-o", "%i|%T"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split()  # fmt: skip

    assert len(states()) == 7
    # Results come back as files, so a task may still be COMPLETING for a moment.
    poll(lambda: all(t.endswith("|COMPLETED") for t in states()), timeout=30, what="COMPLETED")
    # Once every result is in, the array's data is removed; its script and logs stay.
    poll(lambda: not (directory / "calls").exists(), timeout=30, what="calls/ removed")
    assert not (directory / "results").exists()
    assert not (directory / "refs").exists()
    assert (directory / "job.sh").exists()
    # Each task ran its chunk on a local pool of the 2 CPUs it was given.
    log = (directory / "logs" / "0.out").read_text()
    assert "task 0 done (ok)" in log
    # A generator has no length: it is read first, then packed the same way.
    again = paralela.map(square, (x for x in range(30)), backend="slurm",
                         backend_options={**opts, "max_jobs": 4})  # fmt: skip
    assert again == [x * x for x in range(30)]
    assert again.summary.chunks == 4


def test_a_task_given_gpus_runs_one_worker_per_gpu_each_seeing_only_its_own(
    slurm_cluster: str, tmp_path: Path
) -> None:
    opts = options(slurm_cluster, tmp_path, max_jobs=2, cpus_per_task=2, gpus_per_task=2)
    seen = paralela.map(sees_devices, range(40), backend="slurm", backend_options=opts)
    by_task: dict[str, dict[int, set[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(set)
    )
    for devices, pid, task, threads in seen:
        by_task[task][pid].add(devices)
        assert threads == "1"  # 2 CPUs shared by 2 workers
    assert len(by_task) == 2
    for workers in by_task.values():
        assert len(workers) == 2  # one worker per granted GPU
        assert all(len(devices) == 1 for devices in workers.values())  # always the same
        mine = [next(iter(devices)) for devices in workers.values()]
        assert all("," not in d and d != "?" for d in mine)  # exactly one GPU each
        assert len(set(mine)) == 2  # and not the same one


def test_scancel_mid_run_then_resume_computes_only_what_is_missing(
    slurm_cluster: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    log, gate, run_dir = tmp_path / "calls.log", tmp_path / "gate", tmp_path / "run"
    fn = functools.partial(logged, log=str(log), block=frozenset({6, 10}), gate=str(gate))
    opts = options(slurm_cluster, tmp_path, max_jobs=3)  # chunks 0-3, 4-7, 8-11

    def go() -> Any:
        return paralela.map(fn, range(12), backend="slurm", backend_options=opts,
                            run_dir=run_dir, retries=0)  # fmt: skip

    first = Background(go)
    poll(lambda: (run_dir / "chunks").is_dir() and len(os.listdir(run_dir / "chunks")) == 1,
         timeout=60, what="chunk 0-3 to finish")  # fmt: skip
    poll(lambda: {4, 5, 8, 9} <= covered(run_dir), timeout=60, what="items before the blocks")
    [directory] = arrays(tmp_path)
    cancel([array_id(directory)])
    with pytest.raises(WorkerDiedError, match=r"CANCELLED") as info:
        first.result()
    assert str(directory / "logs") in str(info.value)

    gate.touch()
    results = go()
    assert results == [x * 10 for x in range(12)]
    assert results.summary.resumed_items == 4
    # Only the two chunks that were missing went to Slurm, and inside them only the
    # items that had not finished ran again.
    assert len(list((arrays(tmp_path)[-1] / "logs").iterdir())) == 2
    counts = executions(log)
    assert {x for x, n in counts.items() if n == 2} == {6, 10}
    assert set(counts) == set(range(12))
    assert max(counts.values()) == 2
    assert not (run_dir / "packed").exists()  # sub run directories are folded in


def test_requeue_and_warning_signal_mid_run_redo_nothing_finished(
    slurm_cluster: str, tmp_path: Path, poll: Callable[..., None]
) -> None:
    log, run_dir = tmp_path / "calls.log", tmp_path / "run"
    fn = functools.partial(logged, log=str(log), block=frozenset({2, 6}), gate=str(tmp_path / "g"))
    opts = options(slurm_cluster, tmp_path, max_jobs=2)  # chunks 0-3 and 4-7
    running = Background(
        lambda: paralela.map(
            fn, range(8), backend="slurm", backend_options=opts, run_dir=run_dir, retries=0
        )
    )
    poll(lambda: {0, 1, 4, 5} <= covered(run_dir), timeout=60, what="items before the blocks")
    [directory] = arrays(tmp_path)
    job = array_id(directory)
    requeue(f"{job}_0")  # the administrator's way
    # Slurm's warning before a time limit or preemption: the task requeues itself.
    cancel([f"{job}_1"], signal="USR1", batch_only=True)
    results = running.result(timeout=100)
    assert results == [x * 10 for x in range(8)]
    counts = executions(log)
    assert {x for x, n in counts.items() if n == 2} == {2, 6}
    assert set(counts) == set(range(8))
    assert max(counts.values()) == 2
    task1 = (directory / "logs" / "1.out").read_text()
    assert "got SIGUSR1" in task1
    assert f"requeueing {job}_1" in task1
    assert "(restart 1)" in task1
    assert "(restart 1)" in (directory / "logs" / "0.out").read_text()


def test_a_task_that_dies_is_retried(slurm_cluster: str, tmp_path: Path) -> None:
    fn = functools.partial(dies_once, marker=str(tmp_path / "died"))
    opts = options(slurm_cluster, tmp_path, max_jobs=3)
    results = paralela.map(fn, range(9), backend="slurm", backend_options=opts, retries=1)
    assert results == [x + 1 for x in range(9)]
    assert results.summary.retries == 1
    first, retry = arrays(tmp_path)
    assert len(list((retry / "logs").iterdir())) == 1  # only the dead chunk again
    assert "dying on purpose" in (first / "logs" / "1.out").read_text()


def test_a_task_that_keeps_dying_is_reported_with_its_log(
    slurm_cluster: str, tmp_path: Path
) -> None:
    opts = options(slurm_cluster, tmp_path, max_jobs=2)
    with pytest.raises(WorkerDiedError) as info:
        paralela.map(always_dies, range(4), backend="slurm", backend_options=opts, retries=1)
    message = str(info.value)
    assert "while running items 0..1" in message
    assert "tried 2 time(s)" in message
    assert re.search(r"Slurm task \d+_0 ended FAILED \(exit code 3\)", message), message
    assert "item 1: out of luck" in message  # the tail of its log
    assert info.value.exitcode == 3


def test_without_sacct_states_come_from_scontrol_and_a_cancel_is_noticed(
    slurm_cluster: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    poll: Callable[..., None],
    backends: list[SlurmBackend],
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text(
        "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n"
    )
    (fake / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    backend = SlurmBackend(options(slurm_cluster, tmp_path, max_jobs=2))
    backends.append(backend)
    assert paralela.map(square, range(20), backend=backend) == [x * x for x in range(20)]

    log, gate = tmp_path / "calls.log", tmp_path / "gate"
    fn = functools.partial(logged, log=str(log), block=frozenset({0}), gate=str(gate))
    running = Background(lambda: paralela.map(fn, range(2), backend=backend, retries=0))
    poll(lambda: Path(f"{log}.blocked-0").exists(), timeout=60, what="item 0 to block")
    cancel([array_id(arrays(tmp_path)[-1])])
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match="CANCELLED"):
        running.result(timeout=60)
    assert time.monotonic() - started < 30
    assert any("sacct is not usable" in note for note in backend._reader.notes)
    gate.touch()


def test_options_are_checked_before_anything_is_submitted(
    slurm_cluster: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"Unknown option\(s\) 'partition' \(did you mean"):
        paralela.map(square, range(3), backend="slurm", backend_options={"partition": "x"})
    with pytest.raises(ConfigError, match=r"sbatch refuses the options.*invalid partition"):
        get_backend("slurm", None, {"slurm_partition": "no-such-partition"})
    with pytest.raises(ConfigError, match="nodes=2 would leave the other nodes idle"):
        paralela.map(square, range(3), backend="slurm",
                     backend_options=options(slurm_cluster, tmp_path, nodes=2))  # fmt: skip
    assert not (tmp_path / "jobs").exists()


def test_cli_map_on_slurm(slurm_cluster: str, tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text("def triple(x):\n    return 3 * x\n")
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(10)))
    proc = subprocess.run(
        [sys.executable, "-m", "paralela", "map", "work:triple", "-i", "items.jsonl",
         "-o", "out.jsonl", "--backend", "slurm", "--option", f"slurm_partition={slurm_cluster}",
         "--option", "max_jobs=3", "--option", f"slurm_job_dir={tmp_path / 'jobs'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["result"] for r in lines] == [3 * i for i in range(10)]
    assert "3 chunks" in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "paralela", "map", "work:triple", "-i", "items.jsonl",
         "-o", "out.jsonl", "--backend", "slurm", "--option", "gpus=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "Unknown option(s) 'gpus'" in bad.stderr
    assert "gpus_per_task" in bad.stderr
