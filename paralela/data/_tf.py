"""``to_tf_dataset``: a pipeline as a ``tf.data.Dataset``, through
``tf.data.Dataset.from_generator``."""

from __future__ import annotations

from typing import Any

from paralela.data._pipeline import Pipeline
from paralela.errors import ConfigError

__all__ = ["to_tf_dataset"]


def to_tf_dataset(pipeline: Pipeline, output_signature: Any) -> Any:
    """A ``tf.data.Dataset`` whose elements are the pipeline's.

    Each iteration of the dataset (each epoch of ``model.fit``) runs the pipeline anew,
    in the thread TensorFlow pulls from; stack ``.prefetch`` on the dataset to overlap
    the two.

    Args:
        pipeline: the pipeline; its elements must match ``output_signature``.
        output_signature: as ``tf.data.Dataset.from_generator``'s: a ``tf.TensorSpec``
            or a nest of them (a tuple for ``(features, label)`` elements), e.g.
            ``(tf.TensorSpec((None, 64), tf.float32), tf.TensorSpec((None,), tf.int64))``.

    Failure and shutdown: an error in a stage reaches TensorFlow, which raises it as
    ``InvalidArgumentError`` (or similar) with the original message; an iteration left
    early closes the run when TensorFlow drops the generator.

    Raises:
        ConfigError: ``pipeline`` is not a Pipeline.
        ImportError: TensorFlow is not installed (paralela has no extra for it: install
            ``tensorflow`` or ``tensorflow-cpu`` yourself).
    """
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"to_tf_dataset needs a Pipeline; got {type(pipeline).__name__}.")
    try:
        import tensorflow as tf  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ImportError(
            "paralela.data.to_tf_dataset needs TensorFlow, which is not installed. Install "
            "it with: pip install tensorflow (or tensorflow-cpu on machines without a GPU)"
        ) from exc
    return tf.data.Dataset.from_generator(lambda: iter(pipeline), output_signature=output_signature)
