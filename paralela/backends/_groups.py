"""Stopping a process group: SIGTERM, a grace period, then SIGKILL to what is left.

::

    killpg(pgid, SIGTERM) ──> every member, the leader's children included
        │  poll killpg(pgid, 0) every POLL_SECONDS: ProcessLookupError = all gone
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

__all__ = ["group_alive", "stop_group"]

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


def stop_group(pgid: int, grace: float) -> bool:
    """SIGTERM every process of group ``pgid``; SIGKILL the group if any member is still
    there after ``grace`` seconds, whether or not its leader has exited.

    Blocks until the group is gone or SIGKILL was sent (at most ``grace`` seconds and one
    poll). Returns whether SIGKILL was needed. Never raises for a group that is already
    gone or that this process may not signal.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # some member may still be ours: watch the group as for the others
    deadline = time.monotonic() + grace
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        time.sleep(POLL_SECONDS)
    return False
