"""All-reduce training with real gloo process groups started by ``paralela launch``,
and the checkpoints a restarted group resumes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import paralela.distributed as pd
from paralela.errors import ConfigError

SCRIPT = Path(__file__).parent / "distributed_scripts" / "ddp_steps.py"


def launch(tmp_path: Path, *args: str, restarts: int = 0) -> subprocess.CompletedProcess[str]:
    """Run the rank program as 2 ranks; fail the test unless the launch succeeds."""
    done = subprocess.run(
        [
            sys.executable, "-m", "paralela", "launch", "--nproc", "2",
            "--max-restarts", str(restarts),
            str(SCRIPT), *args,
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def single(tmp_path: Path, out: Path) -> None:
    subprocess.run(
        [sys.executable, str(SCRIPT), "--mode", "single", "--out", str(out)],
        cwd=tmp_path, check=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def max_difference(a: Path, b: Path) -> float:
    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max()) for k in left)


def test_two_rank_ddp_equals_one_process_on_the_combined_batch(tmp_path: Path) -> None:
    launch(tmp_path, "--out", str(tmp_path / "ddp.pt"))
    single(tmp_path, tmp_path / "single.pt")
    assert max_difference(tmp_path / "ddp.pt", tmp_path / "single.pt") < 1e-6
    # ... and training did move the weights (the comparison is not between two inits).
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    torch.save(init.state_dict(), tmp_path / "init.pt")
    assert max_difference(tmp_path / "ddp.pt", tmp_path / "init.pt") > 1e-2


def test_a_killed_rank_restarts_the_group_from_the_checkpoint(tmp_path: Path) -> None:
    launch(tmp_path, "--out", str(tmp_path / "clean.pt"), "--checkpoint", str(tmp_path / "c.pt"))
    done = launch(
        tmp_path,
        "--out", str(tmp_path / "restarted.pt"),
        "--checkpoint", str(tmp_path / "restarted.ckpt"),
        "--die-at", "20",  # 8 steps per epoch: dies in epoch 2, after the epoch-1 checkpoint
        restarts=1,
    )  # fmt: skip
    assert "rank 1 kills itself at step 20" in done.stdout
    assert "Restarting the group (restart 1 of 1)" in done.stdout
    assert "[rank 0] resumed after epoch 1" in done.stdout
    assert "after 1 restart(s)" in done.stderr
    assert max_difference(tmp_path / "clean.pt", tmp_path / "restarted.pt") < 1e-6


def test_without_restarts_the_kill_fails_the_launch(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", "2", str(SCRIPT),
         "--out", str(tmp_path / "x.pt"), "--die-at", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Rank 1" in done.stderr
    assert "SIGKILL" in done.stderr
    assert not (tmp_path / "x.pt").exists()


# -- in this process: a group of one, shards, checkpoints ------------------------------


@pytest.fixture
def group_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[pd.DistContext]:
    """This test process as the only rank of a gloo group."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    ctx = pd.init()
    yield ctx
    torch.distributed.destroy_process_group()


def test_init_without_a_launcher_makes_a_group_of_one(group_of_one: object) -> None:
    ctx = pd.init()  # a second call returns the same group
    assert (ctx.rank, ctx.world_size, ctx.backend) == (0, 1, "gloo")
    assert ctx.device == torch.device("cpu")
    assert ctx.is_main
    assert pd.rank() == 0
    assert pd.world_size() == 1
    assert pd.is_main()
    pd.barrier()
    model = pd.data_parallel(torch.nn.Linear(3, 1))
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)


def test_shard_reshuffles_every_epoch_and_can_resume(group_of_one: object) -> None:
    data = TensorDataset(torch.arange(40).float())
    loader = pd.shard(data, batch_size=8, seed=3)
    assert len(loader) == 5
    first = torch.cat([b[0] for b in loader]).tolist()
    second = torch.cat([b[0] for b in loader]).tolist()
    assert sorted(first) == sorted(second) == list(range(40))
    assert first != second  # a new order each epoch
    again = pd.shard(data, batch_size=8, seed=3)
    again.set_epoch(1)
    assert torch.cat([b[0] for b in again]).tolist() == second


def test_shard_splits_the_data_between_ranks() -> None:
    from torch.utils.data import DistributedSampler

    data = TensorDataset(torch.arange(10).float())
    shares = [list(DistributedSampler(data, num_replicas=2, rank=r, seed=0)) for r in (0, 1)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(10))


def test_shard_rejects_a_sampler(group_of_one: object) -> None:
    with pytest.raises(ConfigError, match="sampler"):
        pd.shard(TensorDataset(torch.zeros(4)), batch_size=2, sampler=None)
    with pytest.raises(ConfigError, match="batch_size"):
        pd.shard(TensorDataset(torch.zeros(4)), batch_size=0)


def test_checkpoint_round_trip_and_first_run(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "ckpt.pt"
    assert pd.load_checkpoint(path) is None
    pd.save_checkpoint({"w": torch.ones(3), "epoch": 4}, path)
    state = pd.load_checkpoint(path)
    assert state is not None
    assert state["epoch"] == 4
    assert torch.equal(state["w"], torch.ones(3))
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]  # no temporary left


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    pd.save_checkpoint({"epoch": 1}, path)

    class Unsaveable:
        def __reduce__(self) -> object:
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        pd.save_checkpoint({"epoch": 2, "bad": Unsaveable()}, path)
    state = pd.load_checkpoint(path)
    assert state is not None
    assert state["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA device")
def test_a_gpu_rank_uses_nccl_on_its_own_device(tmp_path: Path) -> None:
    ranks = min(2, torch.cuda.device_count())
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys, torch, paralela.distributed as pd\n"
        "ctx = pd.init()\n"
        "t = torch.ones(1, device=ctx.device) * (ctx.rank + 1)\n"
        "torch.distributed.all_reduce(t)\n"
        "info = {'backend': ctx.backend, 'device': str(ctx.device), 'sum': t.item(),\n"
        "        'visible': os.environ['CUDA_VISIBLE_DEVICES']}\n"
        "open(sys.argv[1] + f'/{ctx.rank}.json', 'w').write(json.dumps(info))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nproc", str(ranks),
         str(probe), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    infos = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(ranks)]
    assert {i["backend"] for i in infos} == {"nccl"}
    assert {i["device"] for i in infos} == {"cuda:0"}  # one GPU per rank, seen as cuda:0
    assert len({i["visible"] for i in infos}) == ranks  # ... a different one each
    assert {i["sum"] for i in infos} == {ranks * (ranks + 1) / 2}
