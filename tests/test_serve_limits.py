"""Slow and stalled clients against a real ``paralela serve``: requests whose headers or
body never finish are timed out (408), and thousands of stalled connections neither use
up the server's file descriptors nor keep real clients out."""

from __future__ import annotations

import functools
import resource
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import paralela
from tests.serve_helpers import Server, serving, start, wait_ready

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: Headers that never end: a slowloris client.
STALLED = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _closed_by_server(sock: socket.socket, within: float) -> bytes:
    """What the server sent before it closed ``sock`` (fails if it is still open after
    ``within`` seconds)."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the connection was still open after {within} s") from None
    return received


def _closed_now(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def fds() -> Iterator[int]:
    """This test process's soft file descriptor limit raised to the hard one (it holds
    thousands of sockets); how many it may open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = hard if hard != resource.RLIM_INFINITY else 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    try:
        yield raised
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_headers_or_a_body_that_never_finish_are_timed_out_with_408() -> None:
    with serving("serve_helpers:Echo", "--workers", "1", "--read-timeout", "2") as server:
        address = _address(server)
        silent = socket.create_connection(address)  # connects, sends nothing
        headers = socket.create_connection(address)
        headers.sendall(STALLED)
        body = socket.create_connection(address)
        body.sendall(STALLED + b"Content-Length: 100\r\n\r\n" + b'{"input": ')
        started = time.monotonic()
        try:
            assert _closed_by_server(headers, 30).startswith(b"HTTP/1.1 408 ")
            answer = _closed_by_server(body, 30)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"within 2 s" in answer
            _closed_by_server(silent, 30)
            assert time.monotonic() - started < 15
        finally:
            for sock in (silent, headers, body):
                sock.close()
        assert httpx.post(f"{server.url}/predict", json={"input": 1}, timeout=30).status_code == 200
        assert "Traceback" not in server.stderr


@pytest.mark.slow
def test_thousands_of_stalled_connections_do_not_keep_real_clients_out(fds: int) -> None:
    # The server may open 512 file descriptors; 2,000 stalled connections (each with
    # headers that never end, and no read timeout to save it) would take them all.
    stalled_total, wave = 2000, 100
    assert fds > stalled_total + 200, f"this test opens {stalled_total} sockets; limit {fds}"
    server = wait_ready(start("serve_helpers:Echo", "--workers", "1", "--read-timeout", "600",
                              nofile=512))  # fmt: skip
    stalled: list[socket.socket] = []
    try:
        address = _address(server)
        with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as http:
            for k in range(stalled_total // wave):
                for _ in range(wave):
                    sock = socket.create_connection(address, timeout=30)
                    sock.sendall(STALLED)
                    stalled.append(sock)
                health = http.get(f"{server.url}/health")  # a new connection each time
                assert health.status_code == 200, health.text
                answer = http.post(f"{server.url}/predict", json={"input": k})
                assert answer.status_code == 200, answer.text
                assert answer.json()["output"]["x"] == k
            with socket.create_connection(address) as huge:  # headers that never end, at once
                huge.sendall(STALLED + b"X-Padding: " + b"x" * 70_000 + b"\r\n")
                assert _closed_by_server(huge, 30).startswith(b"HTTP/1.1 431 ")
        # the server closed the stalled connections that waited longest, for the new ones
        closed = sum(_closed_now(sock) for sock in stalled)
        assert stalled_total - 512 < closed < stalled_total, closed
        assert "Traceback" not in server.stderr, server.stderr
        assert "out of system resource" not in server.stderr, server.stderr
    finally:
        for sock in stalled:
            sock.close()
        server.stop()


def test_serve_from_python_warns_when_it_listens_beyond_this_machine_without_a_token(
    fds: int,
) -> None:
    from paralela.errors import ConfigError
    from paralela.serving import ExposedServerWarning
    from tests.serve_helpers import Echo

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        with (
            pytest.warns(ExposedServerWarning, match="listening on 0.0.0.0 with no token"),
            pytest.raises(ConfigError, match="cannot listen"),
        ):
            paralela.serve(Echo, host="0.0.0.0", port=taken.getsockname()[1], workers=1)


def test_max_connections_must_fit_in_the_file_descriptor_limit(fds: int) -> None:
    from paralela.errors import ConfigError
    from paralela.serving._serve_http import BACKLOG, MAX_CONNECTIONS, connection_limits

    limits = connection_limits(None, 30.0, 2)
    assert limits.max_connections <= MAX_CONNECTIONS
    assert limits.backlog <= BACKLOG
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert limits.max_connections + limits.backlog < soft
    with pytest.raises(ConfigError, match=r"ulimit -n.*--max-connections"):
        connection_limits(soft, 30.0, 2)


def test_past_max_connections_with_every_one_awaiting_its_answer_a_new_one_gets_503() -> None:
    """uvicorn's protocol with the limits, on a real socket, before an app that holds each
    request until told: two connections whose requests it holds, a third is refused."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from paralela.serving._serve_http import ConnectionLimits, guarded_protocol

    async def scenario() -> bytes:
        arrived: asyncio.Queue[None] = asyncio.Queue()
        release = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            await arrived.put(None)
            await release.wait()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"4")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b"done"})

        config = uvicorn.Config(app, http=guarded_protocol(ConnectionLimits(2, 16, 30.0)))
        config.load()
        state = ServerState()
        protocol = functools.partial(config.http_protocol_class, config=config,
                                     server_state=state, app_state={})  # fmt: skip
        loop = asyncio.get_running_loop()
        server = await loop.create_server(protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        request = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await asyncio.wait_for(arrived.get(), 30)  # the app holds this one's request
            held.append((reader, writer))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        refused = await asyncio.wait_for(reader.read(), 30)  # up to the server's close
        writer.close()
        release.set()
        for held_reader, held_writer in held:
            assert (await asyncio.wait_for(held_reader.read(4096), 30)).endswith(b"done")
            held_writer.close()
        server.close()
        await server.wait_closed()
        return refused

    refused = asyncio.run(scenario())
    assert refused.startswith(b"HTTP/1.1 503 "), refused
    assert b"retry-after: 1" in refused
    assert b"2 connections open" in refused
