"""One rank's stage of a cross-rank pipeline: :class:`Pipeline`, built by :func:`pipeline`.

One step on every rank::

    _agree: all_reduce([rows, target rows, problems])   every rank: the same batch size,
            │                                           or the same ConfigError
            ▼
    _runner(rows, training): PipelineStage + ScheduleGPipe / Schedule1F1B, cached per
            │                batch size (torch's stages learn shapes from the first
            ▼                micro-batch, and a new size would not fit their buffers)
    schedule.step(inputs on the first stage, target on the last)
            │  activations forward, gradients back (torch.distributed point-to-point)
            ▼
    PipelineResult(loss, losses, output) on the last stage; empty elsewhere
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from paralela.errors import ConfigError

__all__ = ["LossFn", "Pipeline", "PipelineResult"]

_MAX_CACHED_SCHEDULES = 8  # batch sizes x (train, predict); a few are typical

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PipelineResult:
    """What one :meth:`Pipeline.step` gives back; only the last stage has values.

    Attributes:
        loss: the batch's loss (the mean, or the sum with ``loss_reduction="sum"``, of
            the micro-batch losses), detached; ``None`` on the other stages.
        losses: the loss of each micro-batch, detached (empty on the other stages).
        output: the model's output for the whole batch, detached; ``None`` elsewhere.
    """

    loss: torch.Tensor | None = None
    losses: list[torch.Tensor] = field(default_factory=list)
    output: torch.Tensor | None = None


class Pipeline:
    """This rank's stage of a pipeline, and the schedule that runs it.

    Build it with :func:`pipeline`. Every rank calls :meth:`step` (or :meth:`predict`)
    the same number of times, in the same order; the collective calls inside must
    match across ranks.

    Attributes:
        stage_module: this rank's layers: give ``stage_module.parameters()`` to the
            optimizer. Its ``state_dict`` keys are the whole model's.
        stage_index: this rank's stage, 0 .. ``n_stages`` - 1.
        n_stages: how many stages (ranks) the pipeline has.
        is_first: this rank feeds the inputs.
        is_last: this rank computes the loss and has the outputs.
        device: where this stage runs.
        microbatches: how many micro-batches each batch is cut into.
        schedule: ``"gpipe"`` or ``"1f1b"``.
    """

    def __init__(
        self,
        stage_module: nn.Module,
        *,
        stage_index: int,
        n_stages: int,
        microbatches: int,
        schedule: str,
        loss_fn: LossFn | None,
        loss_reduction: str,
        device: torch.device,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.stage_module = stage_module.to(device)
        self.stage_index = stage_index
        self.n_stages = n_stages
        self.is_first = stage_index == 0
        self.is_last = stage_index == n_stages - 1
        self.device = device
        self.microbatches = microbatches
        self.schedule = schedule
        self.loss_fn = loss_fn
        self.loss_reduction = loss_reduction
        self.group = group
        self._schedules: dict[tuple[int, bool], Any] = {}

    def __repr__(self) -> str:
        return (
            f"Pipeline(stage {self.stage_index} of {self.n_stages}, schedule={self.schedule!r}, "
            f"microbatches={self.microbatches}, device={self.device})"
        )

    def step(
        self, inputs: torch.Tensor | None = None, target: torch.Tensor | None = None
    ) -> PipelineResult:
        """Forward and backward of one batch; the gradients land in ``stage_module``.

        Call ``optimizer.step()`` and ``optimizer.zero_grad()`` after it as usual (the
        gradients accumulate, as with ``loss.backward()``). Every rank may pass the same
        ``inputs`` and ``target``: the first stage uses only ``inputs``, the last only
        ``target``, the others neither. With a mean-reduced ``loss_fn`` the gradients
        equal those of the unsplit model on the whole batch.

        Args:
            inputs: the batch (first stage), batch along dimension 0.
            target: what ``loss_fn(output, target)`` compares with (last stage).

        Returns:
            On the last stage the loss, the micro-batch losses and the output; on the
            others an empty :class:`PipelineResult`.

        Raises:
            ConfigError: on every rank alike: no ``loss_fn`` was given, the first stage
                has no inputs, the last has no target, the target's rows differ from the
                inputs', or the batch does not split into ``microbatches`` equal parts.
            RuntimeError: from torch when another rank died (gloo: "Connection closed
                by peer") or after the process group's timeout when one hangs.
        """
        if self.loss_fn is None:
            raise ConfigError(
                "This pipeline has no loss function, so it cannot train; pass loss_fn= to "
                "pipeline(), or call predict() for a forward pass only."
            )
        batch = self._agree(inputs, target, training=True)
        runner = self._runner(batch, training=True)
        losses: list[torch.Tensor] = []
        args = (self._to_device(inputs),) if self.is_first else ()
        output = runner.step(
            *args, target=self._to_device(target) if self.is_last else None, losses=losses
        )
        if not self.is_last:
            return PipelineResult()
        detached = [loss.detach() for loss in losses]
        stacked = torch.stack(detached)
        total = stacked.mean() if self.loss_reduction == "mean" else stacked.sum()
        return PipelineResult(loss=total, losses=detached, output=output.detach())

    def predict(self, inputs: torch.Tensor | None = None) -> torch.Tensor | None:
        """Forward pass only, without gradients (evaluation, inference).

        Args:
            inputs: the batch (used by the first stage; ignored elsewhere).

        Returns:
            The output for the whole batch on the last stage, ``None`` on the others.

        Raises:
            ConfigError: on every rank alike: the first stage has no inputs, or the batch
                does not split into ``microbatches`` equal parts.
        """
        batch = self._agree(inputs, None, training=False)
        runner = self._runner(batch, training=False)
        args = (self._to_device(inputs),) if self.is_first else ()
        with torch.no_grad():
            output = runner.step(*args)
        return output if self.is_last else None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This stage's tensors, under the whole model's keys (``"2.weight"``, ...)."""
        return dict(self.stage_module.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load this stage's part of a whole-model ``state_dict`` (other keys are skipped).

        Raises:
            RuntimeError: ``strict`` and a key of this stage is missing (from torch).
        """
        own = set(self.stage_module.state_dict())
        self.stage_module.load_state_dict(
            {k: v for k, v in state_dict.items() if k in own}, strict=strict
        )

    def gather_state_dict(self, dst: int = 0) -> dict[str, torch.Tensor] | None:
        """Collect the whole model's ``state_dict`` (on CPU) on rank ``dst`` of the group.

        Every rank must call it. Returns the merged dictionary on ``dst`` (it loads into
        the unsplit model) and ``None`` on the other ranks.
        """
        mine = {k: v.detach().cpu() for k, v in self.stage_module.state_dict().items()}
        rank = dist.get_rank(self.group)
        parts: list[Any] | None = [None] * self.n_stages if rank == dst else None
        global_dst = dist.get_global_rank(self.group, dst) if self.group is not None else dst
        dist.gather_object(mine, parts, dst=global_dst, group=self.group)
        if parts is None:
            return None
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part)
        return merged

    # -- internals -------------------------------------------------------------

    def _to_device(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor.to(self.device, non_blocking=True)

    def _agree(
        self, inputs: torch.Tensor | None, target: torch.Tensor | None, *, training: bool
    ) -> int:
        """All ranks learn the batch size, or all raise the same ConfigError."""
        problems = []
        rows = target_rows = 0
        if self.is_first:
            if isinstance(inputs, torch.Tensor) and inputs.dim() > 0:
                rows = len(inputs)
            else:
                problems.append(
                    f"the first stage (rank {dist.get_rank()}) needs inputs: a tensor with "
                    "the batch along dimension 0"
                )
        if self.is_last and training:
            if isinstance(target, torch.Tensor) and target.dim() > 0:
                target_rows = len(target)
            else:
                problems.append(
                    f"the last stage (rank {dist.get_rank()}) needs target= for the loss"
                )
        counts = torch.tensor([rows, target_rows, len(problems)], device=self.device)
        dist.all_reduce(counts, group=self.group)
        rows, target_rows, n_problems = (int(c) for c in counts.tolist())
        if n_problems:
            everyone: list[Any] = [None] * self.n_stages
            dist.all_gather_object(everyone, problems, group=self.group)
            said = "; ".join(p for ps in everyone for p in ps)
            raise ConfigError(f"Pipeline step refused: {said}.")
        if training and target_rows != rows:
            raise ConfigError(
                f"The target has {target_rows} rows but the inputs have {rows}; give the "
                "last stage the target of the same batch the first stage gets."
            )
        if rows < self.microbatches or rows % self.microbatches:
            raise ConfigError(
                f"A batch of {rows} rows does not split into {self.microbatches} equal "
                f"micro-batches. Use batches whose size is a multiple of {self.microbatches} "
                "(drop the last partial batch: DataLoader(drop_last=True)), or change "
                "microbatches."
            )
        return rows

    def _runner(self, batch: int, *, training: bool) -> Any:
        key = (batch, training)
        runner = self._schedules.get(key)
        if runner is None:
            if len(self._schedules) >= _MAX_CACHED_SCHEDULES:
                self._schedules.pop(next(iter(self._schedules)))
            stage = PipelineStage(
                self.stage_module, self.stage_index, self.n_stages, self.device, group=self.group
            )
            scale = self.loss_reduction == "mean"
            if not training:
                runner = ScheduleGPipe(stage, self.microbatches, loss_fn=None)
            elif self.schedule == "gpipe":
                runner = ScheduleGPipe(
                    stage, self.microbatches, loss_fn=self.loss_fn, scale_grads=scale
                )
            else:
                runner = Schedule1F1B(
                    stage, self.microbatches, loss_fn=self.loss_fn, scale_grads=scale
                )
            self._schedules[key] = runner
        return runner
