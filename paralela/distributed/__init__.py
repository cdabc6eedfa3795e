"""Distributed training: ``launch`` the ranks, then train with a strategy.

- :func:`launch` (``paralela launch``) starts the ranks of a program on this machine
  or inside a Slurm job step, with the rendezvous variables, one GPU per rank, thread
  limits, ``TF_CONFIG``, a preflight meeting, per-rank logs and restarts.
- In the ranks (PyTorch): :func:`init` joins the process group; all-reduce data
  parallelism with :func:`data_parallel` and :func:`shard`; a parameter server with
  :func:`parameter_server`; pipelines (model parallelism) with :func:`pipeline` and
  :func:`place_stages`; :func:`save_checkpoint` / :func:`load_checkpoint` so that a
  restarted group resumes.

Importing this package imports nothing else: each name loads its module on first use
(a rank's bootstrap, ``paralela.distributed._bootstrap``, starts in milliseconds), and
the torch helpers load torch only then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.distributed._checkpoint import load_checkpoint, save_checkpoint
    from paralela.distributed._env import RankSpec, slurm_spec, tf_config
    from paralela.distributed._launch_slurm import SlurmLaunchResult, submit_launch
    from paralela.distributed._launcher import LaunchResult, in_slurm_step, launch
    from paralela.distributed._pipeline import (
        Pipeline,
        PipelineResult,
        PlacedPipeline,
        pipeline,
        place_stages,
        split_stages,
    )
    from paralela.distributed._ps import ParameterServer, ParameterServerStats, parameter_server
    from paralela.distributed._training import (
        DistContext,
        ShardedLoader,
        barrier,
        data_parallel,
        init,
        is_main,
        rank,
        shard,
        world_size,
    )

# Every name is loaded on first use (the torch helpers load torch then).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("RankSpec", "slurm_spec", "tf_config"), "paralela.distributed._env"),
    **dict.fromkeys(("LaunchResult", "in_slurm_step", "launch"), "paralela.distributed._launcher"),
    **dict.fromkeys(("SlurmLaunchResult", "submit_launch"), "paralela.distributed._launch_slurm"),
    "save_checkpoint": "paralela.distributed._checkpoint",
    "load_checkpoint": "paralela.distributed._checkpoint",
    "init": "paralela.distributed._training",
    "DistContext": "paralela.distributed._training",
    "data_parallel": "paralela.distributed._training",
    "shard": "paralela.distributed._training",
    "ShardedLoader": "paralela.distributed._training",
    "rank": "paralela.distributed._training",
    "world_size": "paralela.distributed._training",
    "is_main": "paralela.distributed._training",
    "barrier": "paralela.distributed._training",
    **dict.fromkeys(
        ("parameter_server", "ParameterServer", "ParameterServerStats"),
        "paralela.distributed._ps",
    ),
    **dict.fromkeys(
        (
            "pipeline",
            "Pipeline",
            "PipelineResult",
            "split_stages",
            "place_stages",
            "PlacedPipeline",
        ),
        "paralela.distributed._pipeline",
    ),
}

__all__ = [
    # launching
    "launch",
    "LaunchResult",
    "RankSpec",
    "in_slurm_step",
    "submit_launch",
    "SlurmLaunchResult",
    "slurm_spec",
    "tf_config",
    # in the ranks
    "init",
    "DistContext",
    "rank",
    "world_size",
    "is_main",
    "barrier",
    # all-reduce
    "data_parallel",
    "shard",
    "ShardedLoader",
    # parameter server
    "parameter_server",
    "ParameterServer",
    "ParameterServerStats",
    # pipeline (model parallelism)
    "pipeline",
    "Pipeline",
    "PipelineResult",
    "split_stages",
    "place_stages",
    "PlacedPipeline",
    # checkpoints
    "save_checkpoint",
    "load_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
