"""Input pipelines that keep the accelerator fed: ``paralela.data.Pipeline``.

::

    Pipeline.from_files(...) / from_iterable(...) / from_map_style(...)
      .interleave(fn, cycle_length)  .map(fn, workers="auto", kind="thread"|"process")
      .filter(p)  .shuffle(n, seed)  .batch(n)  .prefetch(n)  .take(n)  .repeat()  .cache()
    for element in pipeline: ...        pipeline.stats(): per stage, and the bottleneck

Adapters: :class:`TorchIterable` (a torch ``IterableDataset`` sharded by rank and by
DataLoader worker) and :func:`to_tf_dataset`.
"""

from paralela.data._inline import default_collate
from paralela.data._pipeline import Pipeline, PipelineIterator
from paralela.data._stats import PipelineStats, StageStats

__all__ = ["Pipeline", "PipelineIterator", "PipelineStats", "StageStats", "default_collate"]
