"""Pipeline stages on several devices of one process (model parallelism without ranks).

:func:`place_stages` moves each stage of a Sequential to its device and returns a
module whose forward cuts the batch into micro-batches and sends them through the
stages in a wavefront, GPipe's fill: at clock ``t`` stage ``j`` runs micro-batch
``t - j``. CUDA kernels are queued without waiting, so while stage 1 works on
micro-batch 0, stage 0 already works on micro-batch 1::

    clock      0     1     2     3     4
    cuda:0    F0    F1    F2    F3
    cuda:1          F0    F1    F2    F3          (backward: autograd, in reverse)

Autograd carries the gradients back across devices by itself. The outputs are
concatenated on the last device; a loss over them gives the same gradients as the
unsplit model (up to float rounding), except for layers that mix the rows of a batch
(BatchNorm sees micro-batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from paralela.distributed._pipeline_split import split_stages
from paralela.errors import ConfigError

__all__ = ["PlacedPipeline", "place_stages"]


class PlacedPipeline(nn.Module):
    """Stages of a Sequential, each on its device, run as a micro-batched pipeline.

    The layers are registered under their original names, so ``state_dict()`` has the
    unsplit model's keys (tensors on the stages' devices) and loads back into it. Do
    not move it with ``.to(device)``: that would put every stage on one device.

    Attributes:
        devices: the device of each stage.
        stages: the stage modules (the same layer objects), in order.
        microbatches: how many micro-batches a batch is cut into.
    """

    def __init__(
        self,
        stages: Sequence[nn.Sequential],
        devices: Sequence[torch.device],
        *,
        microbatches: int,
    ) -> None:
        super().__init__()
        if len(stages) != len(devices):
            raise ConfigError(f"{len(stages)} stages but {len(devices)} devices; give one each.")
        _check_microbatches(microbatches)
        self.devices = tuple(devices)
        self.microbatches = microbatches
        for stage, device in zip(stages, devices, strict=True):
            stage.to(device)
            for name, layer in stage.named_children():
                self.add_module(name, layer)
        # A plain list: the layers are registered above, under their own names.
        self.stages: list[nn.Sequential] = list(stages)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run the batch through the stages in micro-batches; the output is on the last device.

        The batch is cut along dimension 0 into ``microbatches`` nearly equal parts
        (``torch.tensor_split``); a batch with fewer rows runs as one micro-batch per row.

        Raises:
            ConfigError: ``inputs`` is not a tensor or has no rows.
        """
        if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0 or len(inputs) == 0:
            raise ConfigError(
                "PlacedPipeline takes one tensor with the batch along dimension 0 and at "
                f"least one row; got {_describe(inputs)}."
            )
        chunks = list(inputs.tensor_split(min(self.microbatches, len(inputs))))
        n_chunks, n_stages = len(chunks), len(self.stages)
        for clock in range(n_chunks + n_stages - 1):
            # Later stages first: each queues its work on what the clock before produced.
            for j in reversed(range(max(0, clock - n_chunks + 1), min(n_stages, clock + 1))):
                i = clock - j
                moved = chunks[i].to(self.devices[j], non_blocking=True)
                chunks[i] = self.stages[j](moved)
        return torch.cat(chunks)

    def extra_repr(self) -> str:
        names = [",".join(name for name, _ in s.named_children()) for s in self.stages]
        placed = "; ".join(f"[{n}] on {d}" for n, d in zip(names, self.devices, strict=True))
        return f"microbatches={self.microbatches}, stages: {placed}"


def place_stages(
    model: nn.Sequential,
    devices: Sequence[str | torch.device],
    *,
    microbatches: int = 1,
    balance: Sequence[int] | None = None,
) -> PlacedPipeline:
    """Put the stages of ``model`` on ``devices`` of this process and pipeline micro-batches.

    For a model too big for one GPU in a single process (no ranks, no launcher):
    ``place_stages(model, ["cuda:0", "cuda:1"], microbatches=4)``. The layers of
    ``model`` are moved to their devices in place. Train the returned module as the
    model itself: the optimizer can take ``model.parameters()`` or its parameters.

    Args:
        model: an ``nn.Sequential``.
        devices: one device per stage (``"cuda:0"``, ``"cpu"``, ...); a device may repeat.
        microbatches: how many micro-batches each batch is cut into; more keeps the
            devices busier (the idle "bubble" is ``(stages - 1) / (microbatches +
            stages - 1)`` of the time) at the price of smaller kernels.
        balance: layers per stage, as in :func:`split_stages`; by default the
            parameters are balanced.

    Returns:
        A :class:`PlacedPipeline` whose forward takes the batch on any device and
        returns the output on the last stage's device.

    Raises:
        ConfigError: no devices, an unknown or absent device, ``microbatches`` below 1,
            more devices than layers, or a ``balance`` that does not fit.
    """
    if not devices:
        raise ConfigError("place_stages needs at least one device, e.g. ['cuda:0', 'cuda:1'].")
    _check_microbatches(microbatches)
    resolved = [_device(d) for d in devices]
    stages = split_stages(model, len(resolved), balance=balance)
    return PlacedPipeline(stages, resolved, microbatches=microbatches)


def _check_microbatches(microbatches: int) -> None:
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigError(f"microbatches must be a whole number >= 1, got {microbatches!r}.")


def _device(spec: str | torch.device) -> torch.device:
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"{spec!r} is not a device; use 'cpu', 'cuda:0', 'cuda:1', ... ({exc})"
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ConfigError(
                f"Device {spec!r} is not present: this process sees {count} CUDA device(s) "
                "(check CUDA_VISIBLE_DEVICES), so use cuda:0 .. cuda:N-1, or 'cpu'."
            )
    return device


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
