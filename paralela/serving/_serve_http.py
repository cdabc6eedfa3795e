"""The connections of ``paralela serve``: a client that is slow to send its request is
timed out, and stalled connections cannot use up the server's file descriptors.

::

    listening socket (backlog B) ──accept──> ConnectionGuard (uvicorn's httptools protocol)
      connection made, more than max_connections open ──> the connection that has waited
          longest without a whole request (still sending one, or idle between two) is
          closed; none such (every one awaits its answer): 503 and this one is closed
      a request's headers and body must arrive within read_timeout of its first byte (of
          the connection, for the first) ──> else 408, and the connection is closed
      headers over MAX_HEADER_BYTES ──> 431, closed
      a whole request read ──> not closed for others until its answer is sent; then idle
          (uvicorn's keep-alive timeout closes it after 5 s)

    file descriptors:  soft limit >= reserve (open now, the workers') + B + max_connections

An accept burst takes at most B descriptors before the closes it causes free theirs, so
the limit is never reached and no connection waiting in the backlog is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from paralela.errors import ConfigError

__all__ = ["ConnectionLimits", "connection_limits", "guarded_protocol"]

#: The listen backlog at most: uvicorn's default. A quarter of the descriptors left when
#: they are few, so that max_connections stays at least three times one accept burst.
BACKLOG = 2048
#: Connections open at once by default, at most (the C10k mark): a model server that
#: needs more is better scaled out, and each costs a protocol object and socket buffers.
MAX_CONNECTIONS = 10_000
#: Descriptors a model worker holds in the server: its socket and its pidfd, twice while a
#: restart overlaps the worker it replaces.
FDS_PER_WORKER = 4
#: Descriptors kept spare for what opens them later: the event loop, log files, modules.
SPARE_FDS = 64
#: The most bytes of a request line and headers (h11's limit is 16 KiB, nginx's 32 KiB).
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """What the server allows its clients."""

    max_connections: int
    backlog: int
    read_timeout: float


def connection_limits(
    max_connections: int | None, read_timeout: float, workers: int
) -> ConnectionLimits:
    """The limits for a server with ``workers`` model workers, within this process's file
    descriptor limit; its soft limit is raised towards the hard one as far as they need.

    Raises:
        ConfigError: ``max_connections`` does not fit in the descriptor limit.
    """
    reserve = _open_fds() + FDS_PER_WORKER * workers + SPARE_FDS
    soft = _raise_soft_limit(reserve + BACKLOG + (max_connections or MAX_CONNECTIONS))
    available = soft - reserve
    backlog = max(1, min(BACKLOG, available // 4))
    fit = available - backlog
    asked = f"--max-connections {max_connections}"
    if max_connections is None:
        max_connections, asked = min(MAX_CONNECTIONS, fit), "a connection"
    if not 1 <= max_connections <= fit:
        raise ConfigError(
            f"this process may open {soft} files (ulimit -n): {reserve} are kept for the "
            f"server and its workers and {backlog} for connections being accepted, which "
            f"leaves {max(fit, 0)} for open connections; {asked} cannot fit. Raise the limit "
            "(ulimit -n) or lower --max-connections."
        )
    return ConnectionLimits(max_connections, backlog, read_timeout)


def _open_fds() -> int:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return SPARE_FDS  # no way to count them here: assume as many again as spare


def _raise_soft_limit(wanted: int) -> int:
    """Raise the soft limit of open files to ``wanted`` (at most the hard limit, as Go's
    runtime does at start); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # not allowed here: live within the soft limit
            pass
    return int(min(soft, wanted)) if soft == resource.RLIM_INFINITY else int(soft)


def _raw(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole response, written on the socket without uvicorn, then the socket closed."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, with ``limits`` applied to every connection of one
    server (a class per server: the connections it may close are the server's own)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class ConnectionGuard(_Guard, HttpToolsProtocol):
        _limits = limits
        _closable: ClassVar[collections.OrderedDict[_Guard, None]] = collections.OrderedDict()

    return ConnectionGuard


if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
else:
    _Protocol = object  # uvicorn is imported when a server starts: guarded_protocol adds it


class _Guard(_Protocol):
    """The limits, as overrides of uvicorn's protocol (its next class in the MRO)."""

    _limits: ClassVar[ConnectionLimits]
    # The server's connections without a whole request (still sending one, or idle
    # between two), by how long they have been so, oldest first: those that may be closed.
    _closable: ClassVar[collections.OrderedDict[_Guard, None]]
    _timer: asyncio.TimerHandle | None = None
    _header_bytes = 0  # of the request being read, until its headers end
    _headers_done = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self._limits
        if len(self.connections) > limits.max_connections and not self._close_oldest():
            self._refuse(
                503,
                "Service Unavailable",
                f"the server has {limits.max_connections} connections open, each "
                "waiting for its answer (its max_connections); retry",
                "retry-after: 1\r\n",
            )
            return
        self._waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._closable.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._headers_done:
            self._header_bytes += len(data)
        super().data_received(data)
        if not self._headers_done and self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(
                431,
                "Request Header Fields Too Large",
                f"the request line and headers are larger than {MAX_HEADER_BYTES} bytes",
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # the next request on a kept-alive connection
            self._waiting()

    def on_headers_complete(self) -> None:
        self._headers_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._stop_timer()  # a whole request: it waits for its answer now
        self._closable.pop(self, None)
        self._headers_done = False  # the next request's are to come
        self._header_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._timer is None and not self.transport.is_closing():
            self._closable[self] = None  # idle: may be closed for a new client

    def _close_oldest(self) -> bool:
        """Close the connection that has waited longest without a whole request."""
        closable = self._closable
        while closable:
            oldest, _ = closable.popitem(last=False)
            oldest._stop_timer()
            if not oldest.transport.is_closing():
                oldest.transport.close()
                return True
        return False

    def _waiting(self) -> None:
        self._closable[self] = None
        self._closable.move_to_end(self)
        self._stop_timer()
        self._timer = self.loop.call_later(self._limits.read_timeout, self._timed_out)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._closable.pop(self, None)
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # the app answered already: nothing to add
            return
        self._refuse(
            408,
            "Request Timeout",
            f"the request did not arrive within {self._limits.read_timeout:g} s (the "
            "server's --read-timeout); send its headers and body at once",
        )

    def _refuse(self, status: int, reason: str, message: str, extra: str = "") -> None:
        self._stop_timer()
        self._closable.pop(self, None)
        if not self.transport.is_closing():
            self.transport.write(_raw(status, reason, message, extra))
            self.transport.close()


def is_loopback(address: Any) -> bool:
    """Whether a bound socket address reaches this machine only."""
    import ipaddress

    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except (ValueError, IndexError, TypeError):
        return False
