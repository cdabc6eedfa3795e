"""The training step of ``paralela demo``: 2 ranks train the digits MLP with all-reduce.

``run_ddp_demo`` starts the ranks with :func:`paralela.distributed.launch` (a
preflight rendezvous, per-rank logs, one GPU per rank where there are enough GPUs,
else CPU ranks); each rank runs :mod:`paralela.demos._ddp_rank`: the digits MLP of
:mod:`paralela.demos._digits`, wrapped in DDP, on its shard of each epoch. Rank 0
writes the validation accuracy and loss as JSON.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DdpDemoResult", "run_ddp_demo"]

DEFAULT_RANKS = 2
EPOCHS = 8
BATCH_PER_RANK = 32
LEARNING_RATE = 0.05


@dataclass(frozen=True)
class DdpDemoResult:
    """What the training step measured.

    Attributes:
        ranks: processes that trained together.
        epochs: passes over the training set.
        accuracy: validation accuracy of the trained model (rank 0's copy).
        val_loss: its validation loss.
        wall_seconds: the launch, from start to the last rank's exit.
        log_dir: where each rank's log is.
    """

    ranks: int
    epochs: int
    accuracy: float
    val_loss: float
    wall_seconds: float
    log_dir: Path


def run_ddp_demo(
    ranks: int = DEFAULT_RANKS, epochs: int = EPOCHS, log_dir: Path | None = None
) -> DdpDemoResult:
    """Launch ``ranks`` processes that train the digits MLP together; wait for them.

    ``log_dir`` gets the ranks' logs and ``launch.json``; default: a fresh temporary
    directory, which is kept (the result names it). Nothing else is left behind: the
    ranks' result file goes to a temporary directory removed on return.

    Raises:
        RankFailedError / RendezvousError: a rank died or did not start (the message
            names it and shows its log's tail).
        MissingExtraError: torch or scikit-learn is missing.
    """
    import importlib.util
    import io

    from paralela.distributed import launch
    from paralela.errors import MissingExtraError
    from paralela.resources import detect

    for module, extra in (("torch", "torch"), ("sklearn", "examples")):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, extra, "The training step of the demo")
    gpus_per_rank = 1 if len(detect().gpus) >= ranks else 0
    logs = log_dir or Path(tempfile.mkdtemp(prefix="paralela-demo-ddp-logs-"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="paralela-demo-ddp-") as work:
        out = Path(work) / "result.json"
        result = launch(
            ["paralela.demos._ddp_rank", "--epochs", str(epochs), "--out", str(out)],
            module=True,
            nproc=ranks,
            gpus_per_rank=gpus_per_rank,
            log_dir=logs,
            console=io.BytesIO(),  # the demo prints a table; the ranks' lines are in the logs
        )
        data = json.loads(out.read_text())
    return DdpDemoResult(
        ranks=result.world_size,
        epochs=epochs,
        accuracy=data["accuracy"],
        val_loss=data["val_loss"],
        wall_seconds=time.monotonic() - started,
        log_dir=result.log_dir,
    )
