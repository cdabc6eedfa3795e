"""The byte-message pipe between the processes backend's driver and its workers.

::

    send_bytes(b) ──> [4-byte big-endian length | b]   (-1, then an 8-byte length, past 2 GiB)
    recv_bytes()  <── the same framing, read to the end of the message

The framing is ``multiprocessing.connection.Connection``'s, over the same blocking Unix
socket, with the same behaviour (end of file: ``EOFError``; a peer gone: ``OSError``).
It lives here because importing ``multiprocessing.connection`` pulls in
``multiprocessing``, ``tempfile``, ``shutil``, ``subprocess`` and more: a fifth of a
worker's start-up before its first task (``bench/bench_map.py`` workload d), paid by
the driver too. :func:`wait` is ``multiprocessing.connection.wait`` for Linux
(``poll``): any event (data, end of file, an error) makes an object ready.
"""

from __future__ import annotations

import os
import select
from collections.abc import Sequence

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Connection", "wait"]

_BIG = 0x7FFFFFFF  # longer messages carry -1 and an 8-byte length


class Connection:
    """One end of a message pipe over a connected socket's file descriptor ``fd``
    (owned from now on: :meth:`close` closes it)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        if self._fd < 0:
            raise OSError("the connection is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self, _close: Any = os.close) -> None:
        # As multiprocessing's: an end dropped is closed (os.close bound now, as module
        # globals may be gone when this runs at interpreter exit).
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close(fd)

    def send_bytes(self, data: bytes) -> None:
        """Send one message (blocks until the socket took all of it)."""
        n = len(data)
        if n > _BIG:
            self._write((-1).to_bytes(4, "big", signed=True) + n.to_bytes(8, "big"))
            self._write(data)
        elif n > 16384:  # large: two writes cost less than a copy
            self._write(n.to_bytes(4, "big"))
            self._write(data)
        else:
            self._write(n.to_bytes(4, "big") + data)

    def recv_bytes(self) -> bytes:
        """The next whole message. Raises ``EOFError`` at the end of the stream,
        ``OSError`` when it ends inside a message."""
        size = int.from_bytes(self._read(4, True), "big", signed=True)
        if size == -1:
            size = int.from_bytes(self._read(8, False), "big")
        return self._read(size, False)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether something can be read (a message or the end of the stream) within
        ``timeout`` seconds."""
        return bool(wait([self], timeout))

    def _write(self, data: bytes) -> None:
        fd = self.fileno()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _read(self, size: int, at_start: bool) -> bytes:
        fd = self.fileno()
        first = os.read(fd, size) if size else b""
        if len(first) == size:
            return first  # the usual case: one read
        if not first and at_start:
            raise EOFError
        parts = [first]
        remaining = size - len(first)
        while remaining:
            part = os.read(fd, min(remaining, 1 << 24))
            if not part:
                raise OSError("got end of file during message")
            parts.append(part)
            remaining -= len(part)
        return b"".join(parts)


def wait(objects: Sequence[Any], timeout: float | None = None) -> list[Any]:
    """The ``objects`` (file descriptors, or objects with ``fileno()``) that are ready
    to read, or have an error or end of file, within ``timeout`` seconds (``None``:
    block until one is)."""
    poller = select.poll()
    by_fd: dict[int, Any] = {}
    for obj in objects:
        fd = obj if isinstance(obj, int) else obj.fileno()
        by_fd[fd] = obj
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return [by_fd[fd] for fd, _ in poller.poll(ms)]
