"""Pipeline (model) parallelism across ranks, over ``torch.distributed.pipelining``.

Each rank holds one stage of a Sequential. A batch is cut into micro-batches; the
activations travel forward from rank to rank and the gradients travel back::

    rank 0 (stage 0)            rank 1 (stage 1)
    inputs ─► layers 0..k ─act─► layers k+1..n ─► loss_fn(output, target)
              grads  ◄──────grad── backward    ◄─┘

    GPipe : F0 F1 F2 F3 .. .. B3 B2 B1 B0    all forwards, then all backwards
    1F1B  : F0 F1 .. B0 F2 B1 F3 B2 .. B3    one forward, one backward (less memory)

Before every step the ranks agree on the batch size with one small all-reduce (the
middle stages see neither inputs nor targets), and every rank raises the same
:class:`~paralela.errors.ConfigError` when the batch does not fit, instead of one rank
failing and the others waiting forever. torch's stages learn the shapes from the first
micro-batch, so one stage and schedule is built per batch size and kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from paralela.distributed._pipeline_local import PlacedPipeline, place_stages
from paralela.distributed._pipeline_rank import LossFn, Pipeline, PipelineResult
from paralela.distributed._pipeline_split import split_stages, stages_from_modules
from paralela.distributed._training import init
from paralela.errors import ConfigError

# The public names of the pipeline strategy, from the modules that hold them.
__all__ = [
    "SCHEDULES",
    "Pipeline",
    "PipelineResult",
    "PlacedPipeline",
    "pipeline",
    "place_stages",
    "split_stages",
]

SCHEDULES = ("gpipe", "1f1b")
_REDUCTIONS = ("mean", "sum")


def pipeline(
    model: nn.Sequential | Sequence[nn.Module],
    *,
    microbatches: int,
    schedule: str = "1f1b",
    loss_fn: LossFn | None = None,
    loss_reduction: str = "mean",
    balance: Sequence[int] | None = None,
    device: str | torch.device | None = None,
    group: dist.ProcessGroup | None = None,
) -> Pipeline:
    """This rank's stage of ``model``, ready to train with a pipeline schedule.

    Every rank builds the same ``model`` (same seed, or load the same weights), then
    calls ``pipeline`` with the same arguments; rank ``r`` of the group keeps stage
    ``r``. Start the script with ``paralela launch --nproc N`` (or torchrun, or srun
    under Slurm). When no process group exists yet it joins the launch's with
    :func:`paralela.distributed.init` (NCCL on GPU ranks unless ``device`` is the CPU,
    else gloo); run as a plain ``python script.py`` that is a group of one, and the
    whole model is one stage.

    Args:
        model: an ``nn.Sequential`` to cut into one stage per rank, or a list of
            modules, one per stage (for models that are not a Sequential; each takes
            the previous one's output as its single input).
        microbatches: how many micro-batches each batch is cut into; every batch must
            have a multiple of it as rows. More micro-batches make the idle bubble
            ``(stages - 1) / (microbatches + stages - 1)`` smaller.
        schedule: ``"1f1b"`` (one forward, one backward: activations of at most
            ``n_stages`` micro-batches live at once; needs ``microbatches >= n_stages``)
            or ``"gpipe"`` (all forwards, then all backwards). Both give the same gradients.
        loss_fn: ``loss_fn(output, target)`` for a micro-batch, computed on the last
            stage; ``None`` for an inference-only pipeline (:meth:`Pipeline.predict`).
        loss_reduction: ``"mean"`` when ``loss_fn`` averages over rows (the default, as
            ``cross_entropy``): the gradients are divided by ``microbatches`` so they
            equal the whole batch's; ``"sum"`` when it sums.
        balance: layers per stage for a Sequential (see :func:`split_stages`); by
            default the parameters are balanced.
        device: where this rank's stage runs; default ``cuda:LOCAL_RANK`` with NCCL,
            else the CPU.
        group: the process group of the pipeline's ranks (default: all ranks), e.g. one
            of several pipelines that run side by side.

    Returns:
        A :class:`Pipeline` for this rank.

    Raises:
        ConfigError: an unknown schedule or loss reduction, ``microbatches`` below 1 (or
            below the number of stages for 1F1B), a number of stages other than the
            number of ranks, more stages than layers, or a ``balance`` that does not fit.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"Unknown pipeline schedule {schedule!r}; valid schedules are: {', '.join(SCHEDULES)}."
        )
    if loss_reduction not in _REDUCTIONS:
        raise ConfigError(
            f"Unknown loss_reduction {loss_reduction!r}; valid ones are: {', '.join(_REDUCTIONS)}."
        )
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigError(f"microbatches must be a whole number >= 1, got {microbatches!r}.")
    if isinstance(model, nn.Module) and not isinstance(model, nn.Sequential):
        raise ConfigError(
            f"pipeline() needs an nn.Sequential or a list of stage modules, got a "
            f"{type(model).__name__}; wrap the layers in nn.Sequential, or pass one module "
            "per stage."
        )
    given: list[nn.Sequential] | None = None  # stages the caller made, if any
    if not isinstance(model, nn.Sequential):
        if balance is not None:
            raise ConfigError(
                "balance= applies to an nn.Sequential; a list of modules is already one per stage."
            )
        given = stages_from_modules(list(model))
    wanted = torch.device(device) if device is not None else None
    _join_group(wanted)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    n_stages = len(given) if given is not None else len(balance or ()) or world
    if n_stages != world:
        raise ConfigError(
            f"A pipeline of {n_stages} stages needs {n_stages} ranks (each rank holds one "
            f"stage), but the process group has {world}. Start {n_stages} ranks (paralela "
            f"launch --nproc {n_stages} script.py), or make {world} stages."
        )
    if given is None:  # then model is a Sequential (checked above)
        given = split_stages(cast(nn.Sequential, model), world, balance=balance)
    if schedule == "1f1b" and microbatches < world:
        raise ConfigError(
            f"The 1F1B schedule needs at least as many micro-batches as stages ({world}), "
            f"got microbatches={microbatches}; raise it, or use schedule='gpipe'."
        )
    return Pipeline(
        given[rank],
        stage_index=rank,
        n_stages=world,
        microbatches=microbatches,
        schedule=schedule,
        loss_fn=loss_fn,
        loss_reduction=loss_reduction,
        device=wanted if wanted is not None else _default_device(),
        group=group,
    )


def _join_group(device: torch.device | None) -> None:
    """Join the process group of the launch (:func:`paralela.distributed.init`), if needed.

    A CPU ``device`` asks for gloo: NCCL cannot carry CPU tensors between stages.
    """
    if not dist.is_initialized():
        init(backend="gloo" if device is not None and device.type == "cpu" else None)


def _default_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
