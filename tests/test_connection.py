"""The driver-worker pipe (paralela.backends._connection): multiprocessing.connection's
framing and behaviour, on a real socket pair, and wire-compatible with it."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection as MPConnection

import pytest

from paralela.backends._connection import Connection, wait

pytestmark = pytest.mark.timeout(60)


def pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


@pytest.mark.parametrize("size", [0, 1, 16384, 16385, 3 << 20])
def test_a_message_arrives_whole_whatever_its_size(size: int) -> None:
    ours, theirs = pair()
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    sender = threading.Thread(target=ours.send_bytes, args=(data,))
    sender.start()  # 3 MiB is more than a socket buffer: the reader must drain it
    assert theirs.recv_bytes() == data
    sender.join()
    ours.close()
    theirs.close()


def test_it_speaks_multiprocessing_connections_framing() -> None:
    a, b = socket.socketpair()
    ours, theirs = Connection(a.detach()), MPConnection(b.detach())
    ours.send_bytes(b"to multiprocessing")
    assert theirs.recv_bytes() == b"to multiprocessing"
    theirs.send_bytes(b"from multiprocessing")
    assert ours.recv_bytes() == b"from multiprocessing"
    ours.close()
    theirs.close()


def test_the_end_of_the_stream_is_eoferror_and_a_cut_message_oserror() -> None:
    ours, theirs = pair()
    ours.close()
    with pytest.raises(EOFError):
        theirs.recv_bytes()
    a, b = socket.socketpair()
    cut = Connection(b.detach())
    a.sendall((10).to_bytes(4, "big") + b"half")  # 4 of 10 bytes, then the end
    a.close()
    with pytest.raises(OSError, match="end of file during message"):
        cut.recv_bytes()
    cut.close()
    with pytest.raises(OSError, match="closed"):
        cut.recv_bytes()


def test_wait_reports_what_can_be_read_and_poll_does_not_block() -> None:
    ours, theirs = pair()
    assert not theirs.poll(0)
    assert wait([theirs], 0.01) == []
    ours.send_bytes(b"ping")
    assert wait([theirs], 5) == [theirs]
    assert theirs.poll(0)
    assert theirs.recv_bytes() == b"ping"
    r, w = socket.socketpair()
    w.send(b"!")
    assert wait([theirs, r.fileno()], 5) == [r.fileno()]  # plain descriptors too
    ours.close()
    assert theirs.poll(0)  # end of file counts as readable
    theirs.close()
    r.close()
    w.close()
