"""The parameter server (paralela/distributed/_ps*.py): real rpc ranks, then units.

The rank program is tests/distributed_scripts/ps_train.py; the test process computes the
single-process reference from the same model, data and optimizer, loaded from it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from distributed_helpers import spawn_ranks

from paralela.distributed import _ps_server as server
from paralela.distributed._ps import parameter_server
from paralela.distributed._ps_config import ParameterServerStats, shard_parameters
from paralela.errors import ConfigError

SCRIPT = Path(__file__).resolve().parent / "distributed_scripts" / "ps_train.py"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_ps.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ps_train", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ps_train = _load_script()


def run_ps(tmp_path: Path, world_size: int, mode: str, servers: int, steps: int, *extra: str):
    """Run the rank script; return each rank's JSON report and each trainer's .pt file."""
    spawn_ranks(SCRIPT, world_size, [str(tmp_path), mode, str(servers), str(steps), *extra])
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    saved = {
        r: torch.load(tmp_path / f"rank{r}.pt", map_location="cpu")
        for r in range(servers, world_size)
        if (tmp_path / f"rank{r}.pt").exists()
    }
    return reports, saved


def single_process_reference(trainers: int, steps: int) -> list[torch.Tensor]:
    """The same model and optimizer trained in this process on the combined batches."""
    model = ps_train.ps_model()
    optimizer = ps_train.ps_optimizer(list(model.parameters()))
    rows = ps_train.BATCH * trainers
    x, y = ps_train.ps_data(rows * steps)
    for step in range(steps):
        xb, yb = x[step * rows : (step + 1) * rows], y[step * rows : (step + 1) * rows]
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in model.parameters()]


def assert_matches_reference(
    params: list[torch.Tensor], reference: list[torch.Tensor], tolerance: float = 1e-6
) -> None:
    assert len(params) == len(reference)
    for got, want in zip(params, reference, strict=True):
        assert (got - want).abs().max().item() < tolerance


# --- real ranks ---------------------------------------------------------------------------


def test_sync_equals_single_process_training_on_the_combined_batch(tmp_path: Path) -> None:
    steps = 6
    reports, saved = run_ps(tmp_path, 3, "sync", 1, steps)
    reference = single_process_reference(trainers=2, steps=steps)
    # the servers really moved the weights: the reference is not the initial model
    initial = [p.detach() for p in ps_train.ps_model().parameters()]
    assert max((r - i).abs().max().item() for r, i in zip(reference, initial, strict=True)) > 1e-2
    for rank in (1, 2):
        assert_matches_reference(saved[rank]["params"], reference)
    server_stats = reports[0]["stats"]
    assert server_stats["role"] == "server"
    assert server_stats["updates"] == steps  # one optimizer step per round of two pushes
    assert server_stats["pushes"] == 2 * steps
    assert server_stats["staleness"] == [0] * (2 * steps)  # they pulled after every push
    for rank in (1, 2):
        stats = reports[rank]["stats"]
        assert stats["role"] == "trainer"
        assert stats["pushes"] == steps
        assert stats["pulls"] == steps + 2  # the first pull, one per step, the final one
    # each rank refused the other role's calls, naming what to call instead
    assert "serve() is for server ranks; rank 1 is a trainer" in reports[1]["role_error"]
    assert "push() is for trainer ranks; rank 0 is a server" in reports[0]["role_error"]


def test_two_servers_shard_the_parameters_and_stay_exact(tmp_path: Path) -> None:
    steps = 5
    reports, saved = run_ps(tmp_path, 4, "sync", 2, steps)
    # Linear(4, 8) weight (32 numbers) alone on server 0; bias (8), Linear(8, 1) weight
    # (8) and bias (1) on server 1
    assert all(report["shards"] == [[0], [1, 2, 3]] for report in reports)
    reference = single_process_reference(trainers=2, steps=steps)
    for rank in (2, 3):
        assert_matches_reference(saved[rank]["params"], reference)
    for rank in (0, 1):
        stats = reports[rank]["stats"]
        assert (stats["role"], stats["updates"], stats["pushes"]) == ("server", steps, 2 * steps)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
def test_sync_with_the_model_on_a_gpu_matches_the_cpu_reference(tmp_path: Path) -> None:
    # gradients and parameters travel as CPU tensors and are copied to the model's device
    steps = 5
    _, saved = run_ps(tmp_path, 3, "sync", 1, steps, "--device", "cuda")
    reference = single_process_reference(trainers=2, steps=steps)
    for rank in (1, 2):  # float32 on the GPU rounds differently from the CPU
        assert_matches_reference(saved[rank]["params"], reference, tolerance=1e-5)


def test_async_lowers_the_loss_and_records_staleness(tmp_path: Path) -> None:
    steps = 30
    reports, saved = run_ps(tmp_path, 3, "async", 1, steps, "--convex")
    for rank in (1, 2):  # least squares on the whole data set
        assert saved[rank]["after"] < 0.25 * saved[rank]["before"]
    # after finish() both trainers hold the same, final parameters
    for got, want in zip(saved[1]["params"], saved[2]["params"], strict=True):
        assert torch.equal(got, want)
    server_stats = reports[0]["stats"]
    assert server_stats["pushes"] == 2 * steps
    assert server_stats["updates"] == 2 * steps  # every push applied on arrival
    staleness = server_stats["staleness"]
    assert len(staleness) == 2 * steps
    assert all(isinstance(s, int) and s >= 0 for s in staleness)
    assert sum(server_stats["histogram"].values()) == 2 * steps
    # with one server, the trainers' own records are the server's, split between them
    trainer_staleness = reports[1]["stats"]["staleness"] + reports[2]["stats"]["staleness"]
    assert len(reports[1]["stats"]["staleness"]) == steps
    assert Counter(trainer_staleness) == Counter(staleness)


def test_a_failing_trainer_stops_every_rank_with_its_error(tmp_path: Path) -> None:
    reports, _ = run_ps(tmp_path, 3, "sync", 1, 6, "--fail-rank", "2")
    assert reports[2]["error"] == "ValueError: trainer broke on purpose"
    why = "trainer rank 2 failed: ValueError: trainer broke on purpose"
    assert reports[0]["error"].startswith("DistributedError: The parameter server stopped")
    assert why in reports[0]["error"]
    # trainer 1 (held in the round trainer 2 never joined, or pulling) learns why
    assert reports[1]["error"].startswith("DistributedError:")
    assert "on trainer rank 1: The parameter server stopped: " + why in reports[1]["error"]


def test_example_trains_digits_with_one_server_and_two_trainers() -> None:
    procs = spawn_ranks(EXAMPLE, 3, ["--epochs", "3"])
    match = re.search(r"final accuracy (\d\.\d+)", procs[1].stdout)
    assert match, procs[1].stdout
    assert float(match.group(1)) > 0.85
    assert re.search(r"server rank 0: \d+ pushes, \d+ optimizer steps", procs[0].stdout)
    assert "final accuracy" not in procs[2].stdout  # only the first trainer reports


# --- units: configuration ------------------------------------------------------------------


def test_shards_balance_elements_largest_first() -> None:
    assert shard_parameters([32, 8, 8, 1], 2) == [[0], [1, 2, 3]]
    assert shard_parameters([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]
    assert shard_parameters([1, 100, 1], 1) == [[0, 1, 2]]
    with pytest.raises(ConfigError, match=r"only 2 parameter tensor\(s\).*servers=2 or fewer"):
        shard_parameters([3, 4], 3)


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A rank's environment, as the launcher sets it (nothing listens on the port)."""
    for name, value in [
        ("RANK", "1"),
        ("WORLD_SIZE", "3"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ]:
        monkeypatch.setenv(name, value)
    return monkeypatch


def _linear() -> torch.nn.Module:
    return torch.nn.Linear(2, 1)


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({"mode": "eventually"}, {}, r"mode must be 'sync' .* or 'async' .*'eventually'"),
        ({"servers": 0}, {}, r"servers must be a positive integer, got 0"),
        ({"servers": 3}, {}, r"WORLD_SIZE=3 with servers=3 leaves no trainer rank.*--nproc 5"),
        ({}, {"WORLD_SIZE": "1"}, r"WORLD_SIZE=1 with servers=1 leaves no trainer"),
        ({"timeout": 0}, {}, r"timeout must be a positive number of seconds, got 0"),
        ({}, {"RANK": None}, r"RANK is not set: run the script under 'paralela launch"),
        ({}, {"RANK": "one"}, r"RANK must be an integer, got 'one'"),
        ({}, {"RANK": "3"}, r"RANK=3 is not below WORLD_SIZE=3"),
        ({}, {"MASTER_PORT": None}, r"MASTER_PORT is not set"),
        ({"rank": 5, "world_size": 4}, {}, r"RANK=5 is not below WORLD_SIZE=4"),
        ({"optimizer": "sgd"}, {}, r"optimizer must be a function from a list of parameters"),
        ({"model": "net"}, {}, r"model must be a torch.nn.Module, got str"),
        ({"model": torch.nn.ReLU()}, {}, r"no parameters"),
        (
            {"model": torch.nn.Linear(2, 1, bias=False), "servers": 2},
            {"WORLD_SIZE": "4"},
            r"only 1 param",
        ),
    ],
)
def test_bad_options_raise_config_error_before_any_rpc(
    launch_env: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str | None], message: str
) -> None:
    for name, value in env.items():
        if value is None:
            launch_env.delenv(name)
        else:
            launch_env.setenv(name, value)
    model = kwargs.pop("model", _linear())
    with pytest.raises(ConfigError, match=message):
        parameter_server(model, **kwargs)


def test_stats_histogram_counts_each_staleness() -> None:
    stats = ParameterServerStats("server", 5, 0, 5, (2, 0, 1, 0, 0))
    assert stats.histogram() == {0: 3, 1: 1, 2: 1}
    assert list(stats.histogram()) == [0, 1, 2]


# --- units: the server state, without rpc ---------------------------------------------------


def _state(mode: str, trainers: tuple[int, ...] = (1, 2), timeout: float = 30.0):
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    state = server.ServerState(
        params=[param],
        names=["w"],
        optimizer=optimizer,
        mode=mode,  # type: ignore[arg-type]
        trainers=trainers,
        timeout=timeout,
    )
    return state, param


def test_sync_round_waits_for_every_trainer_then_steps_once_with_the_mean() -> None:
    state, param = _state("sync")
    first = state.push(1, 0, [torch.tensor([1.0, 2.0])])
    assert not first.done()  # held until trainer 2 pushes
    second = state.push(2, 0, [torch.tensor([3.0, 6.0])])
    assert first.wait() == (0, 1)
    assert second.wait() == (0, 1)
    assert torch.equal(param.detach(), torch.tensor([-2.0, -4.0]))  # minus the mean
    assert param.grad is None


def test_sync_round_no_longer_waits_for_a_trainer_that_finished() -> None:
    state, param = _state("sync")
    held = state.push(1, 0, [torch.tensor([1.0, 1.0])])
    state.trainer_done(2)
    assert held.wait() == (0, 1)
    assert torch.equal(param.detach(), torch.tensor([-1.0, -1.0]))
    assert not state.finished.is_set()
    state.trainer_done(1)
    assert state.finished.is_set()
    assert state.serve() is None


def test_a_missing_gradient_counts_as_zero_in_the_mean() -> None:
    state, param = _state("sync")
    state.push(1, 0, [None])
    state.push(2, 0, [torch.tensor([4.0, 4.0])]).wait()
    assert torch.equal(param.detach(), torch.tensor([-2.0, -2.0]))


def test_async_applies_each_push_and_records_its_staleness() -> None:
    state, _param = _state("async")
    assert state.push(1, 0, [torch.ones(2)]).wait() == (0, 1)
    assert state.push(2, 0, [torch.ones(2)]).wait() == (1, 2)  # one step it did not see
    version, tensors = state.pull()  # type: ignore[misc]
    assert version == 2
    assert torch.equal(tensors[0], torch.tensor([-2.0, -2.0]))
    assert state.staleness == [0, 1]
    assert state.pushes == 2
    assert state.version == 2


def test_pushes_that_do_not_fit_are_refused_with_the_reason() -> None:
    state, _ = _state("sync")
    wrong_shape = state.push(1, 0, [torch.ones(3)]).wait()
    assert isinstance(wrong_shape, server.Failure)
    assert "shape (3,) for parameter 'w' of shape (2,)" in wrong_shape.message
    wrong_count = state.push(1, 0, [torch.ones(2), torch.ones(2)]).wait()
    assert "pushed 2 gradients to a server holding 1" in wrong_count.message
    state.push(1, 0, [torch.ones(2)])
    twice = state.push(1, 0, [torch.ones(2)]).wait()
    assert "pushed twice in one synchronous round" in twice.message
    state.trainer_done(2)
    state.trainer_done(1)
    late = state.push(1, 1, [torch.ones(2)]).wait()
    assert "pushed after it finished" in late.message


def test_a_failing_optimizer_stops_the_server_and_answers_the_round() -> None:
    class BrokenSGD(torch.optim.SGD):
        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            raise RuntimeError("nan")

    state, param = _state("sync")
    state.optimizer = BrokenSGD([param], lr=1.0)
    held = state.push(1, 0, [torch.ones(2)])
    answer = state.push(2, 0, [torch.ones(2)]).wait()
    assert isinstance(answer, server.Failure)
    assert held.wait() == answer
    assert "optimizer step on the server failed: RuntimeError: nan" in answer.message
    assert "optimizer step on the server failed" in (state.serve() or "")
    assert isinstance(state.pull(), server.Failure)


def test_serve_stops_when_no_trainer_is_heard_from_for_the_timeout() -> None:
    state, _ = _state("sync", timeout=0.3)
    held = state.push(1, 0, [torch.ones(2)])  # trainer 2 never comes
    waiting = state.wait_finished()
    error = state.serve()
    assert error is not None
    assert "no trainer has pushed, pulled or finished" in error
    assert "trainer ranks still expected: [1, 2]" in error
    assert isinstance(held.wait(), server.Failure)
    assert waiting.wait() is False  # "not yet" after timeout/4, before the silence limit
    assert isinstance(state.wait_finished().wait(), server.Failure)


def test_waiting_trainers_get_not_yet_then_ask_again() -> None:
    state, _ = _state("async", trainers=(1,), timeout=0.4)
    waiting = state.wait_finished()
    state._release_waiters(everyone=False)
    assert not waiting.done()  # too recent to answer
    since, future = state.waiters[0]
    state.waiters[0] = (since - 1.0, future)  # as if it had waited for over timeout/4
    state._release_waiters(everyone=False)
    assert waiting.wait() is False  # "not yet"
    again = state.wait_finished()
    state.trainer_done(1)
    assert again.wait() is True


def test_a_failed_trainer_fails_the_held_round_and_leaves() -> None:
    state, _ = _state("sync")
    held = state.push(1, 0, [torch.ones(2)])
    state.trainer_failed(2, "ValueError: broke")
    answer = held.wait()
    assert isinstance(answer, server.Failure)
    assert (
        answer.message == "The parameter server stopped: trainer rank 2 failed: ValueError: broke"
    )
    assert state.serve() == "trainer rank 2 failed: ValueError: broke"
    assert not state.all_left.is_set()  # trainer 1 has not heard yet
    state.trainer_failed(1, "DistributedError: the parameter server stopped")
    assert state.all_left.is_set()
    assert state.error == "trainer rank 2 failed: ValueError: broke"  # the first one stays
