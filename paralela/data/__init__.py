"""Input pipelines that keep the accelerator fed: ``paralela.data.Pipeline``.

::

    Pipeline.from_files(...) / from_iterable(...) / from_map_style(...)
      .interleave(fn, cycle_length)  .map(fn, workers="auto", kind="thread"|"process")
      .filter(p)  .shuffle(n, seed)  .batch(n)  .prefetch(n)  .take(n)  .repeat()  .cache()
    for element in pipeline: ...        pipeline.stats(): per stage, and the bottleneck
    (each run an epoch: shuffles draw anew; set_epoch(e))   pipeline.length(): when known

Adapters: :class:`TorchIterable` (a torch ``IterableDataset`` sharded by rank and by
DataLoader worker) and :func:`to_tf_dataset`.
"""

from paralela.data._inline import default_collate
from paralela.data._pipeline import Pipeline
from paralela.data._run import PipelineIterator
from paralela.data._stats import PipelineStats, StageStats

__all__ = ["Pipeline", "PipelineIterator", "PipelineStats", "StageStats", "default_collate"]

# The adapters import torch or TensorFlow: loaded on first use, so that importing
# paralela.data stays cheap.
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paralela.data._tf import to_tf_dataset
    from paralela.data._torch import TorchIterable

__all__ += ["TorchIterable", "to_tf_dataset"]
_ADAPTERS = {"TorchIterable": "paralela.data._torch", "to_tf_dataset": "paralela.data._tf"}


def __getattr__(name: str) -> object:
    if name in _ADAPTERS:
        import importlib

        return getattr(importlib.import_module(_ADAPTERS[name]), name)
    raise AttributeError(f"module 'paralela.data' has no attribute {name!r}")
