"""``paralela.data.TorchIterable``: parts by rank and DataLoader worker, disjoint and
complete, cut at the source; and a real DDP run under ``paralela launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

from paralela.data import Pipeline, TorchIterable
from paralela.data._torch import shard_pipeline
from paralela.errors import ConfigError, MissingExtraError

SCRIPTS = Path(__file__).parent / "data_scripts"
SOURCE = 103  # not a multiple of the 4 parts: they differ by one element


@pytest.fixture
def no_ranks(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def tag_with_worker(x: int) -> tuple[int, int]:
    info = get_worker_info()  # a process-wide global of the loader worker: threads see it
    return x, -1 if info is None else info.id


def test_two_ranks_by_two_loader_workers_get_disjoint_parts_that_make_the_source(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline.from_iterable(range(SOURCE)).map(tag_with_worker, workers=2)
    parts: dict[tuple[int, int], list[int]] = {}
    for rank in range(2):
        no_ranks.setenv("RANK", str(rank))
        no_ranks.setenv("WORLD_SIZE", "2")
        loader = DataLoader(TorchIterable(pipeline), batch_size=None, num_workers=2)
        for x, worker in loader:
            parts.setdefault((rank, worker), []).append(x)
    assert sorted(parts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for (rank, worker), elements in parts.items():
        # element i goes to the pair with i % (2 * 2) == rank * 2 + worker, in order
        assert elements == list(range(rank * 2 + worker, SOURCE, 4))
    everything = [x for elements in parts.values() for x in elements]
    assert sorted(everything) == list(range(SOURCE))  # complete, and nothing twice


def test_the_source_is_cut_before_the_stages_that_cost(no_ranks: pytest.MonkeyPatch) -> None:
    no_ranks.setenv("RANK", "1")
    no_ranks.setenv("WORLD_SIZE", "4")
    calls: list[int] = []
    pipeline = Pipeline.from_iterable(range(40)).map(calls.append, workers=1)
    run = iter(TorchIterable(pipeline))
    assert len(list(run)) == 10
    assert sorted(calls) == list(range(1, 40, 4))  # the map saw only this rank's part
    stats = run.stats()  # type: ignore[attr-defined]
    assert stats.stages[0].name == "from_iterable(range)[1::4]"
    assert [s.elements for s in stats.stages] == [10, 10]


def test_without_a_launcher_or_process_group_it_is_the_whole_pipeline(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline.from_iterable(range(10)).batch(4)
    got = list(DataLoader(TorchIterable(pipeline), batch_size=None))
    assert [b for batch in got for b in batch] == list(range(10))


def test_a_pipeline_function_gets_the_epoch(no_ranks: pytest.MonkeyPatch) -> None:
    base = Pipeline.from_iterable(range(50))
    dataset = TorchIterable(lambda epoch: base.shuffle(50, seed=epoch))
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        orders.append([int(x) for x in loader])
    assert orders[0] != orders[1]  # reshuffled
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(50))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pipeline_built_once_is_shuffled_anew_every_epoch(
    no_ranks: pytest.MonkeyPatch, workers: int
) -> None:
    # DataLoader(shuffle=True) draws a new order every epoch: a loop that switches to
    # TorchIterable must not silently train on the same order each epoch.
    dataset = TorchIterable(Pipeline.from_iterable(range(40)).shuffle(40))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    torch.manual_seed(0)
    orders = [[int(x) for x in loader] for _ in range(3)]  # no set_epoch: as mnist's loop
    assert len({tuple(order) for order in orders}) == 3
    assert all(sorted(order) == list(range(40)) for order in orders)
    torch.manual_seed(0)  # the loader's seeds come from torch's generator: reproducible
    assert [[int(x) for x in loader] for _ in range(3)] == orders
    replayed = []
    for epoch in (1, 2, 1):  # set_epoch: epoch e's order, however often it runs
        dataset.set_epoch(epoch)
        replayed.append([int(x) for x in loader])
    assert replayed[0] == replayed[2] != replayed[1]


def test_batches_of_numbers_and_arrays_are_torch_tensors(no_ranks: pytest.MonkeyPatch) -> None:
    images = [(np.full((1, 8, 8), i, dtype=np.float32), i) for i in range(10)]
    pipeline = Pipeline.from_iterable(images).batch(4)
    loader = DataLoader(TorchIterable(pipeline), batch_size=None, num_workers=1)
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    data, target = batches[0]
    data, target = data.to("cpu"), target.to("cpu")  # as a DataLoader loop does
    assert data.shape == (4, 1, 8, 8)
    assert data.dtype == torch.float32
    assert target.dtype == torch.int64
    assert target.tolist() == [0, 1, 2, 3]
    _, labels = next(iter(pipeline))
    assert isinstance(labels, list), "iterated directly: paralela's own collate"
    custom = Pipeline.from_iterable(range(4)).batch(2, collate=lambda b: "+".join(map(str, b)))
    assert list(DataLoader(TorchIterable(custom), batch_size=None)) == ["0+1", "2+3"]


def test_len_is_the_ranks_part_when_the_source_has_a_length(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline.from_map_style(list(range(SOURCE))).map(float)
    assert len(TorchIterable(pipeline)) == SOURCE
    assert len(DataLoader(TorchIterable(pipeline), batch_size=10)) == 11  # ceil(103 / 10)
    no_ranks.setenv("WORLD_SIZE", "2")
    for rank, part in ((0, 52), (1, 51)):
        no_ranks.setenv("RANK", str(rank))
        dataset = TorchIterable(pipeline.batch(8))
        assert len(dataset) == -(-part // 8)
        assert len(list(DataLoader(dataset, batch_size=None))) == len(dataset)
    with pytest.raises(TypeError, match=r"filter\(.*\) has no known length"):
        len(DataLoader(TorchIterable(pipeline.filter(bool)), batch_size=None))


def test_spawned_workers_get_their_part_of_an_iterated_cached_pipeline(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline.from_iterable(range(30)).map(lambda x: x * 10).cache()
    assert len(list(pipeline)) == 30  # iterated (a weakref to its run), and its cache full
    loader = DataLoader(
        TorchIterable(pipeline), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    got = [int(x) for x in loader]
    assert sorted(got) == [x * 10 for x in range(30)]  # each part once: not the full cache


def test_an_in_memory_cache_keeps_each_part_apart(no_ranks: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    pipeline = Pipeline.from_iterable(range(12)).map(calls.append, workers=1).cache()
    first, second = shard_pipeline(pipeline, 3, 0), shard_pipeline(pipeline, 3, 1)
    assert len(list(first)) == len(list(first)) == 4  # the second epoch reads the cache
    assert len(list(second)) == 4
    assert sorted(calls) == [0, 1, 3, 4, 6, 7, 9, 10]


def test_a_file_cache_split_into_parts_is_refused(
    tmp_path: Path, no_ranks: pytest.MonkeyPatch
) -> None:
    no_ranks.setenv("RANK", "0")
    no_ranks.setenv("WORLD_SIZE", "2")
    pipeline = Pipeline.from_iterable(range(4)).cache(tmp_path / "cache.pkl")
    with pytest.raises(ConfigError, match=r"every part would write the same file"):
        iter(TorchIterable(pipeline))


def test_the_cpu_budget_is_shared_by_the_local_ranks_and_loader_workers(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    from paralela.backends import usable_cpus

    no_ranks.setenv("LOCAL_WORLD_SIZE", "2")
    run = iter(TorchIterable(Pipeline.from_iterable(range(3))))
    assert run.stats().cpus == max(1, usable_cpus() // 2)  # type: ignore[attr-defined]
    fixed = iter(TorchIterable(Pipeline.from_iterable(range(3)).with_options(cpus=5)))
    assert fixed.stats().cpus == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("rank", "world", "message"),
    [("x", "2", r"RANK='x' is not a whole number"), ("2", "2", r"range\(WORLD_SIZE\)")],
)
def test_a_malformed_rank_is_refused(
    no_ranks: pytest.MonkeyPatch, rank: str, world: str, message: str
) -> None:
    no_ranks.setenv("RANK", rank)
    no_ranks.setenv("WORLD_SIZE", world)
    with pytest.raises(ConfigError, match=message):
        iter(TorchIterable(Pipeline.from_iterable(range(3))))


def test_what_is_not_a_pipeline_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"a Pipeline or a function"):
        TorchIterable([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"returned list, not a Pipeline"):
        iter(TorchIterable(lambda epoch: [1, 2, 3]))  # type: ignore[arg-type,return-value]


def fail_on_5(x: int) -> int:
    if x == 5:
        raise ValueError("bad element 5")
    return x


def test_a_stage_error_in_a_loader_worker_reaches_the_training_loop(
    no_ranks: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline.from_iterable(range(20)).map(fail_on_5, workers=1)
    loader = DataLoader(TorchIterable(pipeline), batch_size=None, num_workers=2)
    with pytest.raises(ValueError, match=r"bad element 5"):
        list(loader)


def test_without_torch_the_adapter_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import paralela.data\n"
        "try:\n"
        "    paralela.data.TorchIterable\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith(MissingExtraError.__name__), out.stdout + out.stderr
    assert "pip install 'paralela[torch]'" in out.stdout


def test_ddp_under_paralela_launch_trains_from_a_pipeline(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "paralela", "launch", "--nproc", "2",
            str(SCRIPTS / "ddp_pipeline.py"), str(tmp_path),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ranks: list[dict[str, Any]] = [
        json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)
    ]
    first, second = (set(r["seen"]) for r in ranks)
    assert len(first) == len(second) == 704  # each rank saw half of the 1,408 images
    assert not first & second  # ... a disjoint half
    assert first | second == set(range(1408))
    assert ranks[0]["steps"] == ranks[1]["steps"] == 22
    for rank in ranks:
        losses = rank["losses"]
        assert losses[-1] < 0.5 * losses[0], losses  # it learned
