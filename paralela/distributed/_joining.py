"""Watch the ranks join torch's process group, and name the one that left or stalled.

Each rank's ``sitecustomize`` (:mod:`paralela.distributed._site`) writes ``entered`` to
its join file when the program calls ``init_process_group`` and ``joined`` when that
returns. Until every rank has joined, a rank that ended without joining while another
waits inside ``init_process_group`` is a rendezvous failure (torch's store would wait
30 minutes for it), and so is a wait with no rank entering or joining for longer than
the rendezvous timeout. A program that never calls ``init_process_group`` (a plain
script, TensorFlow) writes nothing and is never stopped by this.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paralela.distributed._group import RankProcess

__all__ = ["JoinWatch", "join_file"]

POLL_S = 0.1  # how often the join files are read while the group is not complete


def join_file(log_dir: Path, rank: int, restart: int) -> Path:
    """Where a rank of this attempt says it entered or joined the process group."""
    return log_dir / "joins" / f"attempt-{restart}" / f"rank-{rank}"


class JoinWatch:
    """The join state of one attempt's ranks (only the ranks this launcher started)."""

    def __init__(self, ranks: Sequence[RankProcess], timeout: float) -> None:
        self._ranks = list(ranks)
        self._timeout = timeout
        self._states = dict.fromkeys(range(len(self._ranks)), "")
        self._progress = time.monotonic()
        self.complete = False

    def check(self) -> str | None:
        """A message if the group cannot complete any more, else ``None``."""
        if self.complete:
            return None
        now = time.monotonic()
        for i, rank in enumerate(self._ranks):
            state = _read(rank.join_file)
            if state and state != self._states[i]:
                self._states[i], self._progress = state, now
        if all(s == "joined" for s in self._states.values()):
            self.complete = True
            return None
        waiting = [
            r
            for i, r in enumerate(self._ranks)
            if self._states[i] == "entered" and r.returncode is None
        ]
        if not waiting:
            return None
        left = [
            r
            for i, r in enumerate(self._ranks)
            if r.returncode == 0 and self._states[i] != "joined"
        ]
        if left:
            return _left_message(left, waiting)
        if now - self._progress > self._timeout:
            missing = [r for i, r in enumerate(self._ranks) if self._states[i] == ""]
            return _stall_message(missing, waiting, self._timeout)
        return None


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _name(rank: RankProcess) -> str:
    spec = rank.spec
    return f"rank {spec.rank} (pid {rank.proc.pid} on {spec.rank_hosts[spec.rank]})"


def _names(ranks: Sequence[RankProcess]) -> str:
    return ", ".join(f"rank {r.spec.rank}" for r in ranks)


def _left_message(left: Sequence[RankProcess], waiting: Sequence[RankProcess]) -> str:
    who = "; ".join(
        f"{_name(r)} exited with code 0 before joining the process group (its log: {r.log_path})"
        for r in left
    )
    return (
        f"{who[0].upper()}{who[1:]}, while {_names(waiting)} waited for it in "
        "init_process_group; every rank was stopped. Every rank must call "
        "init_process_group: check why it ended early (its log), e.g. a condition that "
        "skips the training on some ranks."
    )


def _stall_message(
    missing: Sequence[RankProcess], waiting: Sequence[RankProcess], timeout: float
) -> str:
    if missing:
        who = "; ".join(
            f"{_name(r)} has not called init_process_group (its log: {r.log_path})" for r in missing
        )
    else:
        who = "every rank here entered it: a rank on another node did not come"
    return (
        f"The process group did not complete within {timeout:g} s: {who}. "
        f"{_names(waiting)} waited in init_process_group; every rank was stopped. If "
        "those ranks only do long work before init_process_group, raise "
        "--rendezvous-timeout (rendezvous_timeout=)."
    )
