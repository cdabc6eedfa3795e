"""Checkpoints a restarted group resumes from: rank 0 writes atomically, all ranks read.

A rank killed mid-write never leaves a torn file: rank 0 writes ``path.tmp-<pid>``,
flushes it to disk and renames it over ``path`` (atomic on POSIX filesystems), then
every rank passes a barrier, so none reads an older checkpoint than the one just saved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from paralela.distributed._training import _torch, barrier, rank

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Save ``state`` (``torch.save``-able) to ``path``, atomically, from rank 0.

    Call it on every rank: rank 0 writes, then all ranks wait at a barrier. A crash
    during the write leaves the previous checkpoint in place.

    Raises:
        OSError: the directory cannot be written (raised on rank 0; the others then
            fail at the barrier).
    """
    torch = _torch()
    target = Path(path)
    if rank() == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    barrier()


def load_checkpoint(
    path: str | os.PathLike[str], *, map_location: Any = None, weights_only: bool = True
) -> dict[str, Any] | None:
    """The state saved at ``path``, or ``None`` when there is none yet (a first run).

    Args:
        path: what :func:`save_checkpoint` wrote.
        map_location: where tensors go; default this rank's device (``cpu`` without
            a GPU).
        weights_only: ``torch.load``'s safe mode (tensors, numbers, strings, lists,
            dicts); ``False`` to load arbitrary pickled objects you trust.
    """
    torch = _torch()
    target = Path(path)
    if not target.exists():
        return None
    if map_location is None:
        if torch.cuda.is_available() and torch.cuda.device_count():
            map_location = torch.device("cuda", torch.cuda.current_device())
        else:
            map_location = "cpu"
    state: dict[str, Any] = torch.load(target, map_location=map_location, weights_only=weights_only)
    return state
