"""Checkpoints a restarted group resumes from: rank 0 writes atomically, all ranks read.

A rank killed mid-write never leaves a torn file: rank 0 writes a temp file of a random
name next to ``path`` (created with ``O_EXCL | O_NOFOLLOW``, :func:`paralela._files.replacing`),
flushes it to disk and renames it over ``path`` (atomic on POSIX filesystems), then
every rank passes a barrier, so none reads an older checkpoint than the one just saved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from paralela._files import make_dirs, replacing
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
        make_dirs(target.parent)
        with replacing(target) as fh:
            torch.save(state, fh)
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
