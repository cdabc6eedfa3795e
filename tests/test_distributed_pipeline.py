"""Pipeline (model) parallelism: stages across real ranks, and stages on devices of one process.

The cross-rank tests start 2 real ranks (gloo on CPU) with the rank scripts in
``tests/distributed_scripts/pipeline_*.py`` and compare what they record with the
unsplit model run here, on the same batches and the same initial weights.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import spawn_ranks
from torch import nn

from paralela.distributed._pipeline import pipeline
from paralela.distributed._pipeline_local import PlacedPipeline, place_stages
from paralela.distributed._pipeline_split import balance_by_cost, split_stages
from paralela.errors import ConfigError

SCRIPTS = Path(__file__).resolve().parent / "distributed_scripts"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_pipeline.py"
TOL = 1e-6


def mlp() -> nn.Sequential:
    """Layers of 144, 0, 272, 0 and 68 parameters."""
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.detach().cpu() - b.detach().cpu()).abs().max())


# -- two stages on two ranks ---------------------------------------------------


@pytest.fixture(scope="module")
def equivalence_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank run that trains with GPipe, then with 1F1B, and records everything."""
    out = tmp_path_factory.mktemp("pipeline")
    spawn_ranks(SCRIPTS / "pipeline_equivalence.py", 2, [str(out)], timeout=100)
    return out


@pytest.mark.parametrize(
    ("schedule", "reduction"), [("gpipe", "mean"), ("1f1b", "mean"), ("1f1b", "sum")]
)
def test_two_stage_pipeline_equals_the_unsplit_model(
    equivalence_runs: Path, schedule: str, reduction: str
) -> None:
    first, last = (
        torch.load(equivalence_runs / f"{schedule}-{reduction}-rank{r}.pt", weights_only=False)
        for r in (0, 1)
    )
    assert (first["is_first"], first["is_last"], last["is_first"], last["is_last"]) == (
        True,
        False,
        False,
        True,
    )
    reference = mlp()
    reference.load_state_dict(first["initial"])
    # Balanced by parameters: 144 | 272 + 68 beats 144 + 272 | 68.
    assert first["stage_keys"] == ["0.bias", "0.weight"]
    assert last["stage_keys"] == ["2.bias", "2.weight", "4.bias", "4.weight"]
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5 if reduction == "mean" else 0.05)
    tol = TOL if reduction == "mean" else 16 * TOL  # a sum over 16 rows: larger values
    for step, (inputs, target) in enumerate(first["batches"]):  # 16 rows, then 8
        output = reference(inputs)
        loss = nn.functional.cross_entropy(output, target, reduction=reduction)
        loss.backward()
        grads = {name: p.grad for name, p in reference.named_parameters()}
        for rank, record in enumerate((first, last)):
            stage_grads = record["steps"][step]["grads"]
            assert sorted(stage_grads) == record["stage_keys"], rank
            for name, grad in stage_grads.items():
                assert grad is not None
                assert max_diff(grad, grads[name]) < tol, (step, name)
        seen = last["steps"][step]
        assert max_diff(seen["output"], output) < tol
        assert abs(float(seen["loss"]) - loss.item()) < tol
        assert len(seen["losses"]) == 4  # one per micro-batch
        combined = torch.stack(seen["losses"]).sum() / (4 if reduction == "mean" else 1)
        assert abs(float(combined) - loss.item()) < tol
        assert first["steps"][step]["loss"] is None
        assert first["steps"][step]["output"] is None
        optimizer.step()  # the next step checks the weights after an optimizer step
        optimizer.zero_grad()
    with torch.no_grad():
        expected = reference(first["probe"])
    assert first["predicted"] is None
    assert max_diff(last["predicted"], expected) < tol
    # Rank 0 gathered the whole model's state dict after training.
    gathered = first["gathered"]
    assert last["gathered"] is None
    assert sorted(gathered) == sorted(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert max_diff(gathered[key], value) < tol, key


def test_pipeline_errors_are_raised_alike_on_every_rank(tmp_path: Path) -> None:
    spawn_ranks(SCRIPTS / "pipeline_errors.py", 2, [str(tmp_path)], timeout=100)
    rank0, rank1 = (json.loads((tmp_path / f"errors-rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["messages"] == rank1["messages"]  # both ranks raised the same error
    said = rank0["messages"]
    assert "NO ERROR" not in said.values(), said
    assert "valid schedules are: gpipe, 1f1b" in said["schedule"]
    assert "3 stages needs 3 ranks" in said["stages"]
    assert "paralela launch --nproc 3" in said["stages"]
    assert "3 stages needs 3 ranks" in said["balance"]
    assert "at least as many micro-batches as stages (2)" in said["1f1b"]
    assert "schedule='gpipe'" in said["1f1b"]
    assert "1 layer(s) into 2 stages" in said["layers"]
    assert "5 rows does not split into 2 equal micro-batches" in said["rows"]
    assert "drop_last=True" in said["rows"]
    assert "last stage (rank 1) needs target=" in said["target"]
    assert "target has 4 rows but the inputs have 6" in said["mismatch"]
    assert "first stage (rank 0) needs inputs" in said["inputs"]
    assert "3 rows does not split" in said["predict_rows"]
    assert "pass loss_fn= to pipeline()" in said["no_loss"]
    # After all the refused steps the group still trains: nobody was left waiting.
    assert rank0["after"] == {"ok": True, "loss": None}
    assert rank1["after"]["ok"] is True
    assert 0.0 < rank1["after"]["loss"] < 10.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "interleaved"}, "valid schedules are: gpipe, 1f1b"),
        ({"loss_reduction": "max"}, "valid ones are: mean, sum"),
        ({"microbatches": 0}, "microbatches must be a whole number >= 1"),
    ],
)
def test_pipeline_refuses_bad_options_before_any_communication(
    kwargs: dict[str, Any], message: str
) -> None:
    options: dict[str, Any] = {"microbatches": 2, **kwargs}
    with pytest.raises(ConfigError, match=message):
        pipeline(mlp(), **options)
    assert not dist.is_initialized()  # refused before joining a process group


def test_pipeline_refuses_a_module_that_is_not_a_sequential() -> None:
    with pytest.raises(ConfigError, match=r"wrap the layers in nn\.Sequential"):
        pipeline(nn.Linear(4, 4), microbatches=2)
    with pytest.raises(ConfigError, match="already one per stage"):
        pipeline([nn.Linear(4, 4), nn.Linear(4, 4)], microbatches=2, balance=[1, 1])
    with pytest.raises(ConfigError, match="Stage 1 is a str"):
        pipeline([nn.Linear(4, 4), "relu"], microbatches=2)  # type: ignore[list-item]
    assert not dist.is_initialized()


# -- the example ---------------------------------------------------------------


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_pipeline", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_pipeline_example_learns_the_digits(tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "result.json", tmp_path / "model.pt"
    procs = spawn_ranks(
        EXAMPLE,
        2,
        ["--epochs", "4", "--out", str(out), "--checkpoint", str(checkpoint)],
        timeout=100,
    )
    assert "test accuracy" in procs[1].stdout
    assert "saved the whole model (6 tensors)" in procs[0].stdout
    result = json.loads(out.read_text())
    assert result["accuracy"] > 0.85, result
    assert len(result["losses"]) == 4
    assert result["losses"][-1] < result["losses"][0] / 2
    # The gathered checkpoint is the whole model: the unsplit model scores the same.
    example = load_example()
    model = example.make_model()
    model.load_state_dict(torch.load(checkpoint))
    _, _, x_test, y_test = example.load_data()
    with torch.no_grad():
        correct = int((model(x_test).argmax(1) == y_test).sum())
    assert correct / len(y_test) == result["accuracy"]


def test_train_pipeline_example_runs_as_one_process(tmp_path: Path) -> None:
    # No launcher: a group of one rank, the whole model as the only stage.
    launch_vars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    plain_env = {k: v for k, v in os.environ.items() if k not in launch_vars}
    plain_env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--epochs", "1", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=100,
        env=plain_env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Pipeline(stage 0 of 1" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["accuracy"] > 0.5


# -- split_stages ----------------------------------------------------------------


def test_split_stages_balances_parameters_and_keeps_the_layers() -> None:
    model = mlp()
    stages = split_stages(model, 2)
    assert [len(s) for s in stages] == [2, 3]
    # The same layer objects under their original names: the keys add up to the model's.
    assert stages[0][0] is model[0]
    assert [name for name, _ in stages[1].named_children()] == ["2", "3", "4"]
    keys = [k for s in stages for k in s.state_dict()]
    assert keys == list(model.state_dict())
    x = torch.randn(5, 8)
    assert max_diff(stages[1](stages[0](x)), model(x)) == 0.0


def test_split_stages_with_explicit_balance() -> None:
    model = mlp()
    assert [len(s) for s in split_stages(model, 3, balance=[1, 3, 1])] == [1, 3, 1]
    assert [len(s) for s in split_stages(model, 5)] == [1, 1, 1, 1, 1]
    assert [len(s) for s in split_stages(model, 1)] == [5]


def test_balance_by_cost_minimises_the_largest_stage() -> None:
    assert balance_by_cost([1, 1, 1, 1, 10], 2) == [4, 1]
    assert balance_by_cost([10, 1, 1, 1, 1], 2) == [1, 4]
    assert balance_by_cost([3, 3, 3, 3], 2) == [2, 2]
    assert balance_by_cost([5, 5, 5, 5, 5, 5], 3) == [2, 2, 2]
    # A layer without parameters stays with the layer before it (the later boundary).
    assert balance_by_cost([5, 0, 5, 0, 1], 2) == [2, 3]
    # No parameters at all: every layer counts one.
    assert balance_by_cost([0, 0, 0, 0], 2) == [2, 2]
    assert sum(balance_by_cost([7, 1, 9, 2, 2, 8, 1], 4)) == 7


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: split_stages(nn.Linear(2, 2), 1), "needs an nn.Sequential"),  # type: ignore[arg-type]
        (lambda: split_stages(mlp(), 0), "at least 1"),
        (lambda: split_stages(mlp(), 6), "5 layer.* into 6 stages.*at most 5"),
        (lambda: split_stages(mlp(), 2, balance=[2, 2]), r"summing to the model's 5 layers"),
        (lambda: split_stages(mlp(), 2, balance=[5, 0]), "each at least 1"),
        (lambda: split_stages(mlp(), 2, balance=[1, 1, 3]), "needs 2 whole numbers"),
    ],
)
def test_split_stages_errors(call: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()


# -- place_stages: one process, several devices ----------------------------------


def check_placed_equals_unsplit(
    devices: list[str], microbatches: int, rows: int, tol: float = TOL
) -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    placed = place_stages(model, devices, microbatches=microbatches)
    assert isinstance(placed, PlacedPipeline)
    assert list(placed.state_dict()) == list(reference.state_dict())
    opt_placed = torch.optim.SGD(placed.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):  # the later steps check the weights after optimizer steps
        x, y = torch.randn(rows, 8, generator=gen), torch.randint(0, 4, (rows,), generator=gen)
        out = placed(x)
        assert out.device == torch.device(devices[-1])
        expected = reference(x)
        assert max_diff(out, expected) < tol
        nn.functional.cross_entropy(out, y.to(out.device)).backward()
        nn.functional.cross_entropy(expected, y).backward()
        ref_params = dict(reference.named_parameters())
        for name, p in placed.named_parameters():
            assert p.grad is not None
            assert max_diff(p.grad, ref_params[name].grad) < tol, name  # type: ignore[arg-type]
        opt_placed.step()
        opt_ref.step()
        opt_placed.zero_grad()
        opt_ref.zero_grad()


@pytest.mark.parametrize(("microbatches", "rows"), [(4, 16), (3, 10), (8, 5), (1, 6)])
def test_place_stages_on_cpu_equals_the_unsplit_model(microbatches: int, rows: int) -> None:
    # 10 rows in 3 micro-batches are cut 4/3/3; 5 rows in 8 run as 5 micro-batches.
    check_placed_equals_unsplit(["cpu", "cpu"], microbatches, rows)


def test_place_stages_reports_its_layout() -> None:
    placed = place_stages(mlp(), ["cpu", "cpu", "cpu"], microbatches=2, balance=[2, 2, 1])
    names = [[name for name, _ in s.named_children()] for s in placed.stages]
    assert names == [["0", "1"], ["2", "3"], ["4"]]
    assert "[0,1] on cpu; [2,3] on cpu; [4] on cpu" in repr(placed)


@pytest.mark.parametrize(
    ("devices", "kwargs", "message"),
    [
        ([], {}, "at least one device"),
        (["cpu", "cuda:7"], {}, "'cuda:7' is not present.*CUDA_VISIBLE_DEVICES"),
        (["cpu", "tpu:0"], {}, "'tpu:0' is not a device"),
        (["cpu"] * 6, {}, "5 layer.* into 6 stages"),
        (["cpu", "cpu"], {"microbatches": 0}, "microbatches must be a whole number >= 1"),
        (["cpu", "cpu"], {"balance": [4, 4]}, "summing to the model's 5 layers"),
    ],
)
def test_place_stages_errors(devices: list[str], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        place_stages(mlp(), devices, **kwargs)


def test_placed_pipeline_refuses_an_empty_batch() -> None:
    placed = place_stages(mlp(), ["cpu", "cpu"], microbatches=2)
    with pytest.raises(ConfigError, match=r"at least one row; got a tensor of shape \(0, 8\)"):
        placed(torch.randn(0, 8))


@pytest.mark.gpu
def test_place_stages_on_two_gpus_equals_the_unsplit_model() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    # Other kernels than the CPU's reference: float32 rounding differs a little more.
    check_placed_equals_unsplit(["cuda:0", "cuda:1"], 4, 32, tol=1e-5)


@pytest.mark.gpu
def test_place_stages_across_cpu_and_gpu_equals_the_unsplit_model() -> None:
    if torch.cuda.device_count() < 1:
        pytest.skip("needs a CUDA device")
    check_placed_equals_unsplit(["cpu", "cuda:0"], 4, 32, tol=1e-5)
