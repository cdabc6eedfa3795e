"""The first code of every rank: die with the launcher, meet the others, then exec the
user's program in this same process (same pid, so the launcher keeps watching it).

Started by the launcher as ``python -c "<BOOTSTRAP>" program args...`` with the rank's
environment already set (see :mod:`paralela.distributed._env`).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

from paralela.distributed._rendezvous import DEFAULT_TIMEOUT, preflight
from paralela.errors import RendezvousError

__all__ = ["BOOTSTRAP", "EXIT_PREFLIGHT", "main"]

BOOTSTRAP = "from paralela.distributed._bootstrap import main; main()"

#: Exit code of a rank whose preflight rendezvous failed (the message is on its stderr).
EXIT_PREFLIGHT = 97

_PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> None:
    """Ask the kernel to SIGKILL this rank when its launcher dies (kept across exec).

    The ranks run in their own sessions (so that the launcher can stop each one's whole
    process group), which a Ctrl-C or a SIGKILL of the launcher would not reach.
    """
    launcher = os.environ.get("PARALELA_LAUNCHER_PID")
    if not launcher or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(launcher):  # it died before the line above took effect
        os._exit(128 + signal.SIGKILL)
    _start_watchdog(int(launcher))


def _start_watchdog(launcher: int) -> None:
    """Leave a process behind that takes this rank's children along if the launcher dies.

    The kernel's death signal ends the rank, not what the rank started (data loader
    workers, a ``sleep``). The watchdog, a grandchild handed to init so that the program
    never sees it as a child, waits on the launcher's pidfd; when the launcher is gone it
    kills the rank's descendants (as a map worker that lost its driver does) and the
    rank's process group, itself included. The launcher's own stop kills it with the group.
    """
    rank = os.getpid()
    try:
        launcher_fd = os.pidfd_open(launcher)
    except (AttributeError, OSError):  # no pidfds (Linux < 5.3): the death signal only
        return
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                _watch(launcher_fd, rank)
        finally:
            os._exit(0)
    os.close(launcher_fd)
    os.waitpid(child, 0)


def _watch(launcher_fd: int, rank: int) -> None:
    # Let go of the rank's output pipe, or the launcher would wait for it to close.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, launcher_fd)
    os.closerange(launcher_fd + 1, 65536)
    select.select([launcher_fd], [], [])  # readable once the launcher has exited
    from paralela.backends import kill_descendants, kill_group

    kill_descendants(rank, itself=True)
    kill_group(rank)  # what left the rank's tree but not its group


def main(argv: list[str] | None = None) -> None:
    """Run the preflight rendezvous, then replace this process with ``argv``."""
    argv = sys.argv[1:] if argv is None else argv
    _die_with_launcher()
    env = os.environ
    try:
        preflight(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            master_addr=env["MASTER_ADDR"],
            port=int(env["PARALELA_PREFLIGHT_PORT"]),
            rank_hosts=[h for h in env.get("PARALELA_RANK_HOSTS", "").split(",") if h],
            restart=int(env.get("PARALELA_RESTART_COUNT", "0")),
            timeout=float(env.get("PARALELA_PREFLIGHT_TIMEOUT", DEFAULT_TIMEOUT)),
        )
    except RendezvousError as exc:
        print(f"paralela launch: rank {env['RANK']}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_PREFLIGHT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["PARALELA_RANK_PID"] = str(os.getpid())  # the rank, not what it starts
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"paralela launch: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
