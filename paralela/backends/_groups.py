"""Stopping process groups: SIGTERM, a grace period, then SIGKILL to what is left.

The one place paralela stops a group it started (a sweep's command trials and its
reaper, ``launch``'s ranks, ``scale``'s measured command)::

    killpg(pgid, SIGTERM) ──> every member, the leader's children included
        │  poll killpg(pgid, 0) every POLL_SECONDS: ProcessLookupError = all gone
        │  (and reap the leaders given as ``reap``: an exited one is a zombie till then)
        ▼  still there after ``grace``
    killpg(pgid, SIGKILL)

The group is watched, not its leader: a leader that exited on SIGTERM may leave a child
that ignores it (a data loader worker, a shell's background job), and that child keeps
the group, and the GPU, alive. While any member lives the group id cannot be given to
another process, so signalling it by id is safe; once the poll sees it empty, nothing
more is sent. A leader that exited stays in the group as a zombie until its parent
reaps it: whoever started it must wait for it (``Popen.wait`` in a thread), or the
group counts as alive until ``grace`` ends.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

__all__ = ["group_alive", "kill_group", "stop_group", "stop_groups"]

# How often the group is looked at during the grace period: a few syscalls per
# stopped group; a trial that went on SIGTERM frees its slot within this.
POLL_SECONDS = 0.02


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member left (a zombie counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal (setuid): still there
        return True
    return True


def kill_group(pgid: int) -> bool:
    """SIGKILL every process of group ``pgid`` at once, no grace period. Returns whether
    the signal was sent; never raises for a group that is gone or that this process may
    not signal."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_groups(
    pgids: Iterable[int], grace: float, *, reap: Iterable[subprocess.Popen[Any]] = ()
) -> set[int]:
    """SIGTERM every process of each group in ``pgids``; SIGKILL each group that still
    has a member after ``grace`` seconds, whether or not its leader has exited. One
    grace period for all of them, counted from the first SIGTERM.

    Args:
        pgids: the process groups (a process started with ``start_new_session=True``
            leads the group whose id is its pid).
        grace: seconds from SIGTERM to SIGKILL.
        reap: processes this one started that lead those groups and that no other
            thread waits for: they are polled (reaped) while the groups are watched, so
            that a leader gone on SIGTERM does not keep its group alive as a zombie.

    Blocks until every group is gone or SIGKILL was sent (at most ``grace`` seconds and
    one poll). Returns the groups that needed SIGKILL. Never raises for a group that is
    already gone or that this process may not signal.
    """
    watched: list[int] = []
    for pgid in dict.fromkeys(pgids):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass  # some member may still be ours: watch the group as for the others
        watched.append(pgid)
    leaders = list(reap)
    deadline = time.monotonic() + grace
    while True:
        for leader in leaders:
            leader.poll()
        watched = [pgid for pgid in watched if group_alive(pgid)]
        if not watched or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    return {pgid for pgid in watched if kill_group(pgid)}


def stop_group(pgid: int, grace: float, *, leader: subprocess.Popen[Any] | None = None) -> bool:
    """:func:`stop_groups` for one group; ``leader``: its leader, reaped while it is
    watched (when no other thread waits for it). Returns whether SIGKILL was needed."""
    return bool(stop_groups([pgid], grace, reap=() if leader is None else (leader,)))
