"""``paralela.data.to_tf_dataset``: a pipeline as a ``tf.data.Dataset``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from paralela.data import Pipeline, to_tf_dataset
from paralela.errors import ConfigError


def features(i: int) -> tuple[np.ndarray, np.int64]:
    return np.full(4, i, dtype=np.float32), np.int64(i % 3)


@pytest.mark.slow  # importing TensorFlow takes 5 to 10 s
def test_a_dataset_of_numpy_batches_has_the_pipeline_elements_every_epoch() -> None:
    import tensorflow as tf  # tensorflow-cpu is in the dev extra: CI has it

    pipeline = Pipeline.from_iterable(range(10)).map(features, workers=2).batch(4)
    signature = (
        tf.TensorSpec(shape=(None, 4), dtype=tf.float32),
        tf.TensorSpec(shape=(None,), dtype=tf.int64),
    )
    dataset = to_tf_dataset(pipeline, signature)
    assert isinstance(dataset, tf.data.Dataset)
    for _epoch in range(2):  # each iteration runs the pipeline anew
        batches = [(x.numpy(), y.numpy()) for x, y in dataset]
        assert [len(y) for _, y in batches] == [4, 4, 2]
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        np.testing.assert_array_equal(
            x, np.repeat(np.arange(10, dtype=np.float32), 4).reshape(10, 4)
        )
        np.testing.assert_array_equal(y, np.arange(10) % 3)
    # tf.data stages stack on top: here a map and TensorFlow's own prefetch
    doubled = dataset.map(lambda x, y: (2 * x, y)).prefetch(1)
    assert float(next(iter(doubled))[0][1, 0]) == 2.0


def test_what_is_not_a_pipeline_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"to_tf_dataset needs a Pipeline; got list"):
        to_tf_dataset([1, 2], None)  # type: ignore[arg-type]


def test_without_tensorflow_the_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from paralela.data import Pipeline, to_tf_dataset\n"
        "try:\n"
        "    to_tf_dataset(Pipeline.from_iterable([1]), None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install tensorflow" in out.stdout, out.stdout + out.stderr
