"""``paralela serve``'s command line and ``paralela.serve`` from a script: bad options
exit 2 saying what to change, a class of the script's ``__main__`` is served, a hung
worker is replaced."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.serve_helpers import TESTS, serving, start

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "serve", *args],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve_helpers:Echo", "--max-batch", "64", "--max-queue", "8"], "max_queue (8)"),
        (["serve_helpers:Echo", "--port", "70000"], "--port"),
        (["serve_helpers:free_port"], "Pass the class itself"),
        (["no_such_module:Model"], "No module named 'no_such_module'"),
        (["serve_helpers:Echo", "--max-body", "lots"], "--max-body"),
        (["serve_helpers:Echo", "--gpus", "none", "--workers-per-device", "2"], "shares GPUs"),
        (["serve_helpers:Echo", "--read-timeout", "0"], "read_timeout must be"),
        (
            ["serve_helpers:Echo", "--max-connections", "1000000000"],
            "--max-connections 1000000000 cannot fit",
        ),
    ],
)
def test_bad_options_exit_2_saying_what_to_change(args: list[str], says: str) -> None:
    result = _serve(*args)
    assert result.returncode == 2, result.stderr
    assert says in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_a_port_in_use_exits_2_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("serve_helpers:Echo", "--port", str(port))
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr


def test_an_empty_token_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    result = _serve("serve_helpers:Echo", "--token-file", str(tmp_path / "token"))
    assert result.returncode == 2
    assert "is empty" in result.stderr


def test_listening_beyond_this_machine_without_a_token_warns() -> None:
    server = start("serve_helpers:Echo", "--workers", "1", "--host", "0.0.0.0")
    try:
        deadline = time.monotonic() + 60
        while "ready on" not in server.stderr:
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.05)
        assert "listening on 0.0.0.0 with no token (token=, --token-file)" in server.stderr
        assert "Warning" not in server.stderr, "one line, not Python's warning format"
    finally:
        server.stop()


def test_a_class_of_the_scripts_main_is_served_and_serve_returns_on_sigterm(
    tmp_path: Path,
) -> None:
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import paralela

            class Shout:
                def predict(self, batch):
                    return [s.upper() + "!" for s in batch]

            if __name__ == "__main__":
                paralela.serve(Shout, port=0, workers=1,
                               on_ready=lambda url: print("URL", url, flush=True))
                print("returned", flush=True)
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("URL http://127.0.0.1:"), line
        url = line.split()[1]
        answer = httpx.post(f"{url}/predict", json={"inputs": ["a", "b"]}, timeout=30)
        assert answer.json() == {"outputs": ["A!", "B!"]}
        process.send_signal(signal.SIGTERM)
        assert process.stdout.read().strip() == "returned"
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.slow
def test_a_worker_that_hangs_is_killed_and_replaced() -> None:
    # --timeout 0.5: the request is a 504 at 0.5 s; the worker is killed at 10.5 s
    with serving("serve_helpers:Echo", "--workers", "1", "--timeout", "0.5") as server:
        hung = server.workers()
        answer = httpx.post(f"{server.url}/predict", json={"input": {"sleep": 600}}, timeout=30)
        assert answer.status_code == 504
        deadline = time.monotonic() + 30
        while "hung; restarting it" not in server.stderr:
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.1)
        # The new worker's start (a fresh interpreter, setup) may take longer than the
        # 0.5 s a request may wait on a loaded machine: ask once it is ready.
        while httpx.get(f"{server.url}/health").json()["status"] != "ready":
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.1)
        again = httpx.post(f"{server.url}/predict", json={"input": 1}, timeout=30)
        assert again.status_code == 200
        assert again.json()["output"]["pid"] not in hung
