"""Preflight: the ranks meet once, with a timeout, before the user's script runs.

A collective whose peers never come waits out torch's ten-minute timeout and says
nothing useful. Here rank 0 listens on the preflight port, every other rank connects
and says who it is, and rank 0 answers ``go`` when all have come, or, at the timeout,
an error that names the missing ranks and their hosts, which every waiting rank raises::

    rank 1 ──hello {rank, host, world_size, restart}──►┐
    rank 2 ──hello ───────────────────────────────────►│ rank 0 (listens on the
    ...                                                 │ preflight port)
    rank k ◄──── {"go": true} or {"error": "..."} ─────┘ one JSON line each way

Plain sockets and JSON: no torch import, so it costs milliseconds and also serves
TensorFlow. The socket closes before the script runs (the rank execs it), so the port
is free again.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from paralela.errors import RendezvousError

__all__ = ["DEFAULT_TIMEOUT", "Peer", "preflight"]

DEFAULT_TIMEOUT = 120.0  # seconds; --rendezvous-timeout (formerly --preflight-timeout)
_RETRY_S = 0.05  # between connection attempts while rank 0 is not listening yet
_ANSWER_GRACE_S = 5.0  # rank 0 answers right at its own deadline; allow for clock skew


@dataclass(frozen=True)
class Peer:
    """One rank as it introduced itself at the preflight."""

    rank: int
    host: str
    world_size: int
    restart: int


def preflight(
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    port: int,
    rank_hosts: Sequence[str] = (),
    restart: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Meet the other ranks, or raise :class:`RendezvousError` naming who is missing.

    Args:
        rank: this rank.
        world_size: how many ranks must come; 1 returns at once.
        master_addr: rank 0's host.
        port: the preflight port on that host.
        rank_hosts: every rank's expected host, for the error message.
        restart: the launch's restart attempt; ranks of different attempts never meet.
        timeout: seconds to wait for everyone.

    Raises:
        RendezvousError: someone did not come in time, two ranks claimed the same rank,
            the ranks disagree on the world size, or rank 0 cannot be reached. Raised on
            every rank that is still there, with the same message.
    """
    if world_size <= 1:
        return
    me = Peer(rank=rank, host=socket.gethostname(), world_size=world_size, restart=restart)
    if rank == 0:
        _host(me, master_addr, port, tuple(rank_hosts), timeout)
    else:
        _join(me, master_addr, port, tuple(rank_hosts), timeout)


def _where(rank: int, rank_hosts: tuple[str, ...]) -> str:
    return f"rank {rank} ({rank_hosts[rank]})" if rank < len(rank_hosts) else f"rank {rank}"


def _host(
    me: Peer, master_addr: str, port: int, rank_hosts: tuple[str, ...], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    bind_addr = "127.0.0.1" if master_addr in ("127.0.0.1", "localhost") else ""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((bind_addr, port))
    except OSError as exc:
        server.close()
        raise RendezvousError(
            f"Rank 0 cannot listen on port {port} for the preflight rendezvous: {exc}. "
            "Another job on this host may hold it; launch again (local launches pick new "
            "ports), or under Slurm resubmit (the ports follow the job id)."
        ) from exc
    server.listen(max(16, me.world_size))
    peers: dict[int, tuple[socket.socket, Peer]] = {}
    try:
        problem = _gather(server, me, peers, deadline)
        if problem is None and len(peers) < me.world_size - 1:
            missing = [r for r in range(1, me.world_size) if r not in peers]
            problem = _missing_message(missing, me, master_addr, port, rank_hosts, timeout)
        answer = {"error": problem} if problem else {"go": True}
        line = (json.dumps(answer) + "\n").encode()
        for conn, _ in peers.values():
            with contextlib.suppress(OSError):
                conn.sendall(line)
        if problem:
            raise RendezvousError(problem)
    finally:
        for conn, _ in peers.values():
            conn.close()
        server.close()


def _gather(
    server: socket.socket, me: Peer, peers: dict[int, tuple[socket.socket, Peer]], deadline: float
) -> str | None:
    """Accept hellos until every rank came or the deadline passed; a message on conflict."""
    while len(peers) < me.world_size - 1:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        server.settimeout(remaining)
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return None
        conn.settimeout(max(0.1, min(remaining, 10.0)))
        try:
            data = conn.makefile("rb").readline()
            peer = Peer(**json.loads(data))
        except (OSError, ValueError, TypeError):
            conn.close()  # not one of ours (a port scanner, a stale client): ignore it
            continue
        if peer.restart != me.restart:
            conn.close()  # a straggler of another attempt: it will fail on its own
            continue
        if peer.world_size != me.world_size:
            peers[peer.rank] = (conn, peer)
            return (
                f"Rank {peer.rank} on {peer.host} expects {peer.world_size} ranks, rank 0 on "
                f"{me.host} expects {me.world_size}: the ranks were started with different "
                "WORLD_SIZE / --nproc / SLURM_NTASKS. Start them from one launch."
            )
        if peer.rank in peers or not 0 < peer.rank < me.world_size:
            other = peers.get(peer.rank)
            peers[-len(peers) - 1] = (conn, peer)
            where = f" and {other[1].host}" if other else ""
            return (
                f"Two processes claim rank {peer.rank} (on {peer.host}{where}), or it is "
                f"outside 1..{me.world_size - 1}: each rank needs its own RANK. Start the "
                "ranks from one launch (srun paralela launch ..., or --nproc N)."
            )
        peers[peer.rank] = (conn, peer)
    return None


def _missing_message(
    missing: list[int],
    me: Peer,
    master_addr: str,
    port: int,
    rank_hosts: tuple[str, ...],
    timeout: float,
) -> str:
    names = ", ".join(_where(r, rank_hosts) for r in missing)
    came = me.world_size - len(missing)
    return (
        f"{len(missing)} of {me.world_size} rank(s) did not reach the preflight rendezvous "
        f"at {master_addr}:{port} within {timeout:g} s: {names}; {came} came. "
        "Likely causes: those ranks failed to start (see their logs), their hosts cannot "
        f"reach {master_addr}:{port} (firewall, wrong network interface), or they were "
        "started with a different world size. Nothing ran; raise --rendezvous-timeout if "
        "they are only slow to start."
    )


def _join(
    me: Peer, master_addr: str, port: int, rank_hosts: tuple[str, ...], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    conn = _connect(master_addr, port, deadline)
    if conn is None:
        raise RendezvousError(
            f"Rank {me.rank} on {me.host} could not reach {_where(0, rank_hosts)} at "
            f"{master_addr}:{port} for the preflight rendezvous within {timeout:g} s. "
            "Likely causes: rank 0 failed to start (see its log), or this host cannot reach "
            f"{master_addr} (firewall, wrong network interface, a wrong MASTER_ADDR)."
        )
    with conn:
        hello = {
            "rank": me.rank,
            "host": me.host,
            "world_size": me.world_size,
            "restart": me.restart,
        }
        try:
            conn.sendall((json.dumps(hello) + "\n").encode())
            conn.settimeout(max(0.1, deadline - time.monotonic()) + _ANSWER_GRACE_S)
            line = conn.makefile("rb").readline()
        except OSError as exc:
            line = b""
            reason = str(exc)
        else:
            reason = "it closed the connection without an answer"
        if not line:
            raise RendezvousError(
                f"Rank {me.rank} on {me.host} reached rank 0 at {master_addr}:{port}, but got "
                f"no answer to the preflight rendezvous ({reason}): rank 0 probably died; "
                "see its log."
            )
        answer = json.loads(line)
        if "error" in answer:
            raise RendezvousError(str(answer["error"]))


def _connect(master_addr: str, port: int, deadline: float) -> socket.socket | None:
    """Connect to rank 0, retrying while it is not listening yet; ``None`` at the deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return socket.create_connection((master_addr, port), timeout=min(remaining, 2.0))
        except OSError:
            time.sleep(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
