"""TensorFlow MultiWorkerMirroredStrategy: examples/train_tf_mwms.py as 2 real workers.

The workers are real TensorFlow processes on 127.0.0.1 that find each other through
``TF_CONFIG``: first written by hand in TensorFlow's documented format, then by
``paralela launch``. tensorflow-cpu is a test dependency (CI installs it), so these
tests fail rather than skip where it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from distributed_helpers import run_all

from paralela.distributed._env import free_ports

if importlib.util.find_spec("tensorflow") is None:  # without importing it: 3 s, 1 GB
    raise ImportError(
        "tests/test_distributed_tf.py needs TensorFlow: pip install tensorflow-cpu==2.21.0"
    )

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_tf_mwms.py"
EPOCHS = 8  # the example's default
STEPS = EPOCHS * (1437 // 64)  # 1437 training digits, global batch 64, whole batches
WORKER_LINE = re.compile(
    r"worker (\d): (\d+) steps, test accuracy (\d\.\d+), weights checksum (\d+\.\d+)"
)

# Both ranks all-reduce once; then rank 1 exits 3 while rank 0 waits in a second
# all-reduce that rank 1 never joins.
DYING_RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def count_workers():
        ones = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)

    rank = os.environ["RANK"]
    print(f"rank {rank}: {int(count_workers())} workers in the all-reduce", flush=True)
    if rank == "1":
        sys.exit(3)
    count_workers()
    print("rank 0: not reached", flush=True)
    """
)


def tf_config(ports: list[int], index: int) -> str:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def run_workers(args: list[str], timeout: float = 100) -> list[subprocess.CompletedProcess[str]]:
    """Run the example as workers 0 and 1; fail the test if either fails or hangs.

    TensorFlow workers ignore SIGTERM once the strategy has started, so a hung worker
    is killed (SIGKILL) when ``timeout`` runs out.
    """
    ports = free_ports(2)  # distinct
    envs = [dict(os.environ, TF_CONFIG=tf_config(ports, i), OMP_NUM_THREADS="1") for i in (0, 1)]
    return run_all(EXAMPLE, envs, args, timeout=timeout, what="worker")


def worker_line(output: str, index: int) -> tuple[int, float, float]:
    """``(steps, accuracy, weights checksum)`` that worker ``index`` printed."""
    found = {int(m[1]): m for m in WORKER_LINE.finditer(output)}
    assert index in found, output
    match = found[index]
    return int(match[2]), float(match[3]), float(match[4])


def check_results(results: dict[str, Any], worker1_output: str) -> None:
    """Both workers trained every step together, and the model learned the digits."""
    assert results["num_replicas_in_sync"] == 2
    assert results["num_workers"] == 2
    assert results["steps"] == STEPS
    # A one-hot per replica id, summed over the workers by an all-reduce each step.
    assert results["steps_per_replica"] == [STEPS, STEPS]
    assert results["examples_seen"] == STEPS * 64
    assert results["accuracy"] > 0.9, results
    assert 0.0 < results["test_loss"] < 0.5, results
    # Worker 1 ran as many steps and ended with the chief's weights: the gradients
    # really were all-reduced, not computed twice on their own.
    steps, accuracy, checksum = worker_line(worker1_output, 1)
    assert steps == STEPS
    assert accuracy == pytest.approx(results["accuracy"], abs=1e-4)
    assert checksum == pytest.approx(results["weights_checksum"], rel=1e-6)


def test_two_workers_train_digits_together(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    chief, worker = run_workers(["--out", str(out), "--timeout", "30"])
    assert "chief: 2 replicas, test accuracy" in chief.stdout
    assert f"epoch {EPOCHS}/{EPOCHS}: train loss" in chief.stdout
    assert "epoch" not in worker.stdout  # only the chief reports progress
    check_results(json.loads(out.read_text()), worker.stdout)


def test_paralela_launch_sets_tf_config_for_the_example(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "paralela", "launch", "--nproc", "2"),
            *("--log-dir", str(tmp_path / "logs"), str(EXAMPLE)),
            *("--out", str(out), "--timeout", "30"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "2 rank(s) finished" in proc.stdout + proc.stderr
    rank1_log = (tmp_path / "logs" / "rank-1.log").read_text()
    check_results(json.loads(out.read_text()), rank1_log)


def test_launch_stops_a_tensorflow_group_when_a_worker_dies(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(DYING_RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "paralela", "launch", "--nproc", "2"),
            *("--stop-grace", "1", "--log-dir", str(tmp_path / "logs"), str(script)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "rank 0: 2 workers in the all-reduce" in output  # they did meet first
    assert "Rank 1 (pid" in output
    assert "exit code 3" in output
    assert "not reached" not in output
    ranks = json.loads((tmp_path / "logs" / "launch.json").read_text())["attempts"][0]
    assert [r["returncode"] for r in ranks] == [-9, 3]
    # -9: once the strategy has started, TensorFlow catches SIGTERM (to notice
    # preemption) and goes on waiting, so only the launcher's SIGKILL after
    # --stop-grace ends rank 0. docs/tensorflow.md says so; this keeps it true.


@pytest.mark.parametrize(
    ("tf_config_value", "message"),
    [
        (None, "TF_CONFIG is not set"),
        ("not json", "is not a valid cluster spec"),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}}', "is not a valid cluster spec"),
        (
            '{"cluster": {"chief": ["a:1"], "ps": ["b:1"], "worker": ["c:1"]}, '
            '"task": {"type": "worker", "index": 0}}',
            "launch without --tf-ps",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
            "is not in its cluster",
        ),
    ],
)
def test_example_explains_a_missing_or_unusable_tf_config(
    tmp_path: Path, tf_config_value: str | None, message: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if tf_config_value is not None:
        env["TF_CONFIG"] = tf_config_value
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "results.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "paralela launch" in proc.stderr or "--tf-ps" in proc.stderr
    assert not (tmp_path / "results.json").exists()
