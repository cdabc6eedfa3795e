"""``paralela.data.Pipeline``: every stage against a serial run, both kinds of map on
I/O- and CPU-bound functions, and what a run measures."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paralela.data import Pipeline, default_collate
from paralela.errors import ConfigError
from tests.data_helpers import cpu_work, lines_of, read_file, slow_io, square


def test_a_thread_map_equals_the_serial_loop_in_input_order() -> None:
    pipeline = Pipeline.from_iterable(range(200)).map(square, workers=8)
    assert list(pipeline) == [square(i) for i in range(200)]


def test_a_process_map_equals_the_serial_loop_in_input_order() -> None:
    pipeline = Pipeline.from_iterable(range(100)).map(cpu_work, kind="process", workers=2)
    assert list(pipeline) == [cpu_work(i) for i in range(100)]


def test_lambdas_travel_to_process_workers() -> None:
    pipeline = Pipeline.from_iterable(range(20)).map(lambda x: x + 1, kind="process")
    assert list(pipeline) == list(range(1, 21))


def test_numpy_arrays_go_through_process_stages_intact() -> None:
    arrays = [np.arange(i, i + 50_000, dtype=np.float32) for i in range(6)]
    pipeline = Pipeline.from_iterable(arrays).map(np.sqrt, kind="process", workers=2)
    for got, array in zip(pipeline, arrays, strict=True):
        np.testing.assert_array_equal(got, np.sqrt(array))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_io_bound_map_overlaps_its_waits(kind: str) -> None:
    pipeline = Pipeline.from_iterable(range(60)).map(slow_io, kind=kind, workers=2 if kind ==
                                                     "process" else 6)  # fmt: skip
    assert list(pipeline) == list(range(60))
    stats = pipeline.stats()
    # 60 x 10 ms of sleep: serially 0.6 s; the workers wait at once
    busy = stats.stages[1].busy_seconds
    assert busy == pytest.approx(0.6, rel=0.5)
    assert stats.stages[1].cpu_share < 0.3, "sleeping uses no CPU"


def test_files_are_read_in_order(tmp_path: Path) -> None:
    for i in range(12):
        (tmp_path / f"part-{i:02d}.txt").write_bytes(bytes([i]) * (i + 1))
    (tmp_path / ".hidden").write_text("skipped")
    pipeline = Pipeline.from_files(tmp_path).map(read_file)
    assert list(pipeline) == [bytes([i]) * (i + 1) for i in range(12)]
    assert list(Pipeline.from_files(str(tmp_path / "part-0*.txt"))) == [
        str(tmp_path / f"part-{i:02d}.txt") for i in range(10)
    ]


def test_files_that_match_nothing_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="matches no file"):
        Pipeline.from_files(str(tmp_path / "*.rec"))


def test_interleave_hands_out_records_of_several_files_in_turn(tmp_path: Path) -> None:
    paths = []
    for name, count in (("a", 3), ("b", 1), ("c", 4), ("d", 2)):
        path = tmp_path / f"{name}.txt"
        path.write_text("".join(f"{name}{i}\n" for i in range(count)))
        paths.append(str(path))
    for parallel in (False, True):
        pipeline = Pipeline.from_iterable(paths).interleave(
            lines_of, cycle_length=2, parallel=parallel
        )
        # a and b open; b ends and c takes its place, from b's next turn; then a ends...
        assert list(pipeline) == ["a0", "b0", "a1", "a2", "c0", "c1", "d0", "c2", "d1", "c3"]


@pytest.mark.parametrize("parallel", [False, True])
def test_interleave_as_tf_data_documents_it(parallel: bool) -> None:
    # tf.data.Dataset.interleave's docstring: Dataset.range(1, 6).interleave(
    #     lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    pipeline = Pipeline.from_iterable(range(1, 6)).interleave(
        lambda x: [x] * 6, cycle_length=2, block_length=4, parallel=parallel
    )
    assert list(pipeline) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                              3, 3, 4, 4, 5, 5, 5, 5, 5, 5]  # fmt: skip
    # ... and its flat_map-like use: cycle_length=1 reads one source after another
    flat = Pipeline.from_iterable([[1, 2], [], [3]]).interleave(iter, cycle_length=1)
    assert list(flat) == [1, 2, 3]


def test_interleave_unordered_gives_every_record() -> None:
    sources = [[f"{s}{i}" for i in range(20)] for s in "abcdef"]
    pipeline = Pipeline.from_iterable(sources).interleave(iter, cycle_length=3, deterministic=False)
    assert sorted(pipeline) == sorted(x for source in sources for x in source)


def test_filter_shuffle_batch_take() -> None:
    pipeline = (
        Pipeline.from_iterable(range(100))
        .filter(lambda x: x % 3 == 0)
        .shuffle(10, seed=4)
        .batch(8)
        .take(3)
    )
    first = list(pipeline)
    assert first != list(pipeline), "a new order every epoch"
    rebuilt = (
        Pipeline.from_iterable(range(100))
        .filter(lambda x: x % 3 == 0)
        .shuffle(10, seed=4)
        .batch(8)
        .take(3)
    )
    assert list(rebuilt) == first, "a seeded shuffle: the same orders in every program run"
    assert len(first) == 3
    assert all(len(batch) == 8 for batch in first)
    flat = [x for batch in first for x in batch]
    assert all(x % 3 == 0 for x in flat)
    assert flat != sorted(flat)
    everything = [x for b in Pipeline.from_iterable(range(100)).shuffle(10, seed=4).batch(7)
                  for x in b]  # fmt: skip
    assert sorted(everything) == list(range(100))


def test_a_seeded_shuffle_draws_a_new_order_every_epoch_and_set_epoch_replays_one() -> None:
    # docs/data.md's loop: one pipeline, iterated once per epoch. The same order every
    # epoch would be a silent correctness bug for training.
    pipeline = Pipeline.from_iterable(range(50)).shuffle(50, seed=0)
    orders = [list(pipeline) for _ in range(3)]
    assert len({tuple(order) for order in orders}) == 3
    assert all(sorted(order) == list(range(50)) for order in orders)
    resumed = Pipeline.from_iterable(range(50)).shuffle(50, seed=0)
    resumed.set_epoch(2)  # a training resumed at epoch 2 sees epoch 2's order
    assert list(resumed) == orders[2]
    with pytest.raises(ConfigError, match="epoch must be an integer of at least 0"):
        resumed.set_epoch(-1)


def test_each_pass_of_a_repeat_is_shuffled_anew() -> None:
    passes = list(Pipeline.from_iterable(range(20)).shuffle(20, seed=1).batch(20).repeat(2))
    assert passes[0] != passes[1]
    assert sorted(passes[0]) == sorted(passes[1]) == list(range(20))


def test_the_length_is_known_through_the_steps_that_keep_it() -> None:
    source = Pipeline.from_iterable(range(10))
    assert source.map(square).shuffle(4).prefetch().length() == 10
    assert source.batch(4).length() == 3
    assert source.batch(4, drop_last=True).length() == 2
    assert source.take(3).repeat(2).cache().length() == 6
    assert Pipeline.from_map_style([5, 6, 7]).length() == 3
    with pytest.raises(TypeError, match=r"filter\(.*<lambda>\) has no known length"):
        source.filter(lambda x: x > 2).length()
    with pytest.raises(TypeError, match=r"repeat\(None\) repeats forever"):
        source.repeat().length()
    with pytest.raises(TypeError, match=r"from_iterable\(generator\) has no known length"):
        Pipeline.from_iterable(x for x in range(3)).length()


def test_shuffle_without_a_seed_differs_between_runs() -> None:
    pipeline = Pipeline.from_iterable(range(200)).shuffle(200, seed=None)
    assert list(pipeline) != list(pipeline)


def test_batch_drop_last_and_the_default_collate() -> None:
    assert list(Pipeline.from_iterable(range(10)).batch(4, drop_last=True)) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    pairs = [(np.ones(3) * i, i) for i in range(4)]
    (features, labels), = list(Pipeline.from_iterable(pairs).batch(4))  # fmt: skip
    assert features.shape == (4, 3)
    assert labels == [0, 1, 2, 3]
    dicts = default_collate([{"x": np.zeros(2), "y": 1}, {"x": np.ones(2), "y": 2}])
    assert dicts["x"].shape == (2, 2)
    assert dicts["y"] == [1, 2]


def test_repeat_runs_the_source_again() -> None:
    assert list(Pipeline.from_iterable(range(3)).map(square).repeat(3)) == [0, 1, 4] * 3
    endless = iter(Pipeline.from_iterable([1, 2]).repeat())
    assert [next(endless) for _ in range(7)] == [1, 2, 1, 2, 1, 2, 1]
    endless.close()
    assert list(Pipeline.from_iterable([]).repeat()) == []


def test_cache_in_memory_runs_the_stages_above_once() -> None:
    calls: list[int] = []

    def counted(x: int) -> int:
        calls.append(x)
        return x

    pipeline = Pipeline.from_iterable(range(5)).map(counted, workers=1).cache().repeat(3)
    assert list(pipeline) == list(range(5)) * 3
    assert sorted(calls) == list(range(5))


def test_cache_in_a_file_serves_later_runs_and_a_broken_run_keeps_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache.pkl"
    pipeline = Pipeline.from_iterable(range(6)).map(square, workers=1).cache(path)
    for x in pipeline:  # stopped early: nothing cached
        if x == 4:
            break
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []
    assert list(pipeline) == [0, 1, 4, 9, 16, 25]
    assert path.exists()
    again = Pipeline.from_iterable(range(6)).map(square, workers=1).cache(path)
    assert list(again) == [0, 1, 4, 9, 16, 25]
    stages = [s.name for s in again.stats().stages]
    assert stages == [f"cache({path})"], "read from the file: the map was never built"


def test_from_map_style_reads_every_index() -> None:
    class Squares:
        def __len__(self) -> int:
            return 30

        def __getitem__(self, i: int) -> int:
            return i * i

    assert list(Pipeline.from_map_style(Squares())) == [i * i for i in range(30)]
    with pytest.raises(ConfigError, match="__len__ and __getitem__"):
        Pipeline.from_map_style(iter([]))


def test_unordered_maps_give_the_same_elements() -> None:
    delays = list(range(40))
    random.Random(1).shuffle(delays)
    pipeline = Pipeline.from_iterable(delays).map(square, workers=4, deterministic=False)
    assert sorted(pipeline) == sorted(square(d) for d in delays)
    loose = Pipeline.from_iterable(range(50)).map(slow_io).with_options(deterministic=False)
    assert sorted(loose) == list(range(50))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda p: p.map(square, kind="gpu"), "kind must be 'thread' or 'process'"),
        (lambda p: p.map(square, workers=0), "workers must be 'auto' or a positive integer"),
        (lambda p: p.batch(0), "size must be an integer of at least 1"),
        (lambda p: p.shuffle(-1), "buffer must be an integer of at least 1"),
        (lambda p: p.interleave(iter, cycle_length=0), "cycle_length"),
        (lambda p: p.with_options(cpus=0), "cpus must be"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(build: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(Pipeline.from_iterable(range(3)))


def test_stats_name_the_bottleneck_and_the_workers_chosen() -> None:
    pipeline = (
        Pipeline.from_iterable(range(80))
        .map(slow_io, workers=2)  # 10 ms a piece on 2 threads: the slow stage
        .map(square, workers=4)
        .batch(10)
    )
    assert len(list(pipeline)) == 8
    stats = pipeline.stats()
    assert [s.name for s in stats.stages] == [
        "from_iterable(range)",
        "map(slow_io)",
        "map(square)",
        "batch(10)",
    ]
    assert stats.stages[1].elements == 80
    assert stats.stages[3].elements == 8
    assert stats.bottleneck is not None
    assert stats.bottleneck.name == "map(slow_io)"
    text = str(stats)
    assert "bottleneck: map(slow_io)" in text
    assert stats.stall_seconds > 0.2
    assert 0 <= stats.consumer_busy < 0.5
    assert stats.to_dict()["bottleneck"] == "map(slow_io)"


def test_stats_before_any_run_is_an_error() -> None:
    with pytest.raises(ConfigError, match="iterate the pipeline first"):
        Pipeline.from_iterable([1]).stats()


def test_the_pipeline_describes_its_stages() -> None:
    pipeline = Pipeline.from_iterable([1]).map(square).batch(2).prefetch()
    assert repr(pipeline) == "Pipeline(from_iterable(list) | map(square) | batch(2) | prefetch(2))"


def test_a_prefetch_is_never_named_the_bottleneck_in_place_of_the_stage_above() -> None:
    pipeline = Pipeline.from_iterable(range(60)).map(slow_io, workers=1).prefetch(2)
    assert len(list(pipeline)) == 60
    stats = pipeline.stats()
    assert stats.stages[2].wait_seconds > 0  # the consumer waited on the prefetch...
    assert stats.bottleneck is not None
    assert stats.bottleneck.name == "map(slow_io)"  # ...which waited on the map


def test_the_tuner_grows_a_stage_when_most_of_a_worker_fits() -> None:
    import time

    from paralela.data._stats import StageStats
    from paralela.data._tuner import INTERVAL, Tuner

    tuner = Tuner(2)
    tuner.consumer_share = 0.05  # a consumer that mostly waits on a GPU
    decode = StageStats("map(decode)", "process")
    decode.set_workers(1)
    decode.cpu_seconds = decode.busy_seconds = 1.0  # a whole CPU per worker
    tuned = tuner.register(decode, maximum=2)
    time.sleep(INTERVAL * 1.2)
    decode.wait_seconds = 1.0  # the stage below waited on it all along
    assert tuner.tick(tuned, ready=0) == 2  # 0.95 of a CPU left: one more worker
    tuner_full = Tuner(1)
    alone = StageStats("map(decode)", "process")
    alone.set_workers(1)
    alone.cpu_seconds = alone.busy_seconds = 1.0
    tuned_alone = tuner_full.register(alone, maximum=4)
    time.sleep(INTERVAL * 1.2)
    alone.wait_seconds = 1.0
    assert tuner_full.tick(tuned_alone, ready=0) == 1  # no CPU left in a budget of one


def test_a_pipeline_that_ran_can_be_pickled() -> None:
    import cloudpickle as pickle  # its steps are closures, as spawned workers receive them

    pipeline = Pipeline.from_iterable(range(3)).batch(2)
    assert list(pipeline) == [[0, 1], [2]]
    copy = pickle.loads(pickle.dumps(pipeline))
    assert list(copy) == [[0, 1], [2]]
