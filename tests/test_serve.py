"""``paralela serve`` for real: a uvicorn server on 127.0.0.1, model worker processes, and
real HTTP clients (httpx)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serve_helpers import Server, free_port, metric, serving, start, wait_ready

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def echo() -> Any:
    """Two workers, each batch taking 20 ms: concurrent requests share batches."""
    with serving(
        "serve_helpers:Echo",
        "--workers",
        "2",
        "--max-wait-ms",
        "5",
        env={"SERVE_PREDICT_S": "0.02"},
    ) as server:
        yield server


def _post(server: Server, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/predict", json=body, timeout=30, **kwargs)


async def _clients(url: str, bodies: list[Any], clients: int) -> list[httpx.Response]:
    """Send ``bodies`` from ``clients`` clients, each its own connection, each sending its
    next request when its last is answered; the answers in the order of ``bodies``."""
    answers: list[Any] = [None] * len(bodies)

    async def client(k: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(k, len(bodies), clients):
                answers[i] = await http.post(f"{url}/predict", json=bodies[i])

    await asyncio.gather(*(client(k) for k in range(clients)))
    return answers


def test_one_input_and_a_list_of_inputs(echo: Server) -> None:
    one = _post(echo, {"input": 3})
    assert one.status_code == 200
    assert one.json()["output"]["x"] == 3
    many = _post(echo, {"inputs": ["a", {"b": [1, 2]}, None]})
    assert many.status_code == 200
    assert [o["x"] for o in many.json()["outputs"]] == ["a", {"b": [1, 2]}, None]
    assert _post(echo, {"inputs": []}).json() == {"outputs": []}


def test_300_requests_from_32_clients_each_get_their_own_answer(echo: Server) -> None:
    bodies: list[Any] = [
        {"input": {"id": i}} if i % 3 else {"inputs": [{"id": i, "k": k} for k in range(i % 5)]}
        for i in range(300)
    ]
    answers = asyncio.run(_clients(echo.url, bodies, 32))
    assert [a.status_code for a in answers] == [200] * 300
    for body, answer in zip(bodies, answers, strict=True):
        if "input" in body:
            assert answer.json()["output"]["x"] == body["input"]
        else:
            assert [o["x"] for o in answer.json()["outputs"]] == body["inputs"]
    batches = [a.json()["output"]["batch"] for a in answers if "output" in a.json()]
    assert max(batches) > 1, "32 clients on 2 workers taking 20 ms a batch never shared one"
    assert len({a.json()["output"]["pid"] for a in answers if "output" in a.json()}) == 2


def test_batches_grow_with_load(echo: Server) -> None:
    def mean_batch() -> tuple[float, float]:
        page = httpx.get(f"{echo.url}/metrics").text
        return (
            metric(page, "paralela_serve_batch_size_sum"),
            metric(page, "paralela_serve_batch_size_count"),
        )

    s0, n0 = mean_batch()
    for i in range(10):  # one client: every batch holds one input
        assert _post(echo, {"input": i}).status_code == 200
    s1, n1 = mean_batch()
    assert (s1 - s0) / (n1 - n0) == 1.0
    asyncio.run(_clients(echo.url, [{"input": i} for i in range(256)], 64))
    s2, n2 = mean_batch()
    assert (s2 - s1) / (n2 - n1) >= 4, "64 clients did not make batches of 4 or more"


def test_metrics_are_prometheus_text(echo: Server) -> None:
    _post(echo, {"input": 1})
    page = httpx.get(f"{echo.url}/metrics")
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = page.text
    assert re.search(r'^paralela_serve_requests_total\{code="200"\} [1-9]\d*$', text, re.M)
    assert metric(text, "paralela_serve_workers") == 2
    assert metric(text, "paralela_serve_workers_ready") == 2
    assert metric(text, "paralela_serve_queue_depth") == 0
    assert metric(text, "paralela_serve_request_seconds_count") >= 1
    assert "# TYPE paralela_serve_batch_size histogram" in text
    buckets = [
        int(v) for v in re.findall(r"^paralela_serve_batch_size_bucket\{[^}]*\} (\d+)$", text, re.M)
    ]
    assert buckets == sorted(buckets), "histogram buckets must be cumulative"


def test_each_worker_is_pinned_to_its_slot(echo: Server) -> None:
    answers = asyncio.run(_clients(echo.url, [{"input": i} for i in range(64)], 16))
    outputs = [a.json()["output"] for a in answers]
    assert {o["device"] for o in outputs} == {"cpu"}
    assert {o["cuda"] for o in outputs} == {""}, "CPU slots hide the GPUs"
    assert {o["threads"] for o in outputs} == {"1"}, "2 workers on 2 CPUs: a thread each"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({}, "neither"),
        ({"input": 1, "inputs": [1]}, "both"),
        ({"inputz": 1}, "inputz"),
        ({"inputs": 5}, "inputs"),
        ([1, 2], "body"),
    ],
)
def test_a_malformed_body_is_422_naming_what_is_wrong(echo: Server, body: Any, where: str) -> None:
    answer = _post(echo, body)
    assert answer.status_code == 422
    assert where in str(answer.json()["detail"])


def test_a_body_that_is_not_json_is_422(echo: Server) -> None:
    answer = httpx.post(
        f"{echo.url}/predict", content=b'{"input": 1', headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422
    assert "JSON" in str(answer.json()["detail"])


def test_a_body_that_is_not_utf8_is_400_saying_so(echo: Server) -> None:
    answer = httpx.post(
        f"{echo.url}/predict",
        content=b'{"input": "\xff\xfe"}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert "not JSON text (UTF-8)" in answer.json()["error"]


def test_a_body_sent_as_a_form_is_415_and_one_with_no_type_is_read_as_json(echo: Server) -> None:
    form = httpx.post(f"{echo.url}/predict", content=b'{"input": 1}',
                      headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert form.status_code == 415
    assert "Content-Type: application/json" in form.json()["error"]
    untyped = httpx.post(f"{echo.url}/predict", content=b'{"input": 1}')  # no Content-Type
    assert "content-type" not in untyped.request.headers
    assert untyped.status_code == 200
    assert untyped.json()["output"]["x"] == 1


def test_a_body_over_the_limit_is_413(echo: Server) -> None:
    big = {"input": "x" * (2 << 20)}
    assert _post(echo, big).status_code == 413

    def chunks() -> Any:  # no Content-Length: counted as it arrives
        yield b'{"input": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}'

    answer = httpx.post(f"{echo.url}/predict", content=chunks(), timeout=30)
    assert answer.status_code == 413
    assert "--max-body" in answer.json()["error"]
    assert _post(echo, {"input": "small"}).status_code == 200


def test_an_input_the_model_fails_on_fails_only_its_own_request(echo: Server) -> None:
    bodies: list[Any] = [{"input": {"fail": True}}] + [{"input": i} for i in range(15)]
    answers = asyncio.run(_clients(echo.url, bodies, 16))
    assert answers[0].status_code == 500
    assert "cannot predict" in answers[0].json()["error"]
    assert [a.status_code for a in answers[1:]] == [200] * 15


def test_an_output_json_cannot_hold_is_500_naming_why(echo: Server) -> None:
    answer = _post(echo, {"input": {"nan": True}})
    assert answer.status_code == 500
    assert "JSON" in answer.json()["error"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_a_request_is_422_not_a_model_error(echo: Server, constant: str) -> None:
    answer = httpx.post(f"{echo.url}/predict", content=f'{{"input": [1, {constant}]}}',
                        headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert constant in str(answer.json()["detail"])
    assert "JSON" in str(answer.json()["detail"])


def test_docs_and_openapi_schema(echo: Server) -> None:
    assert httpx.get(f"{echo.url}/docs").status_code == 200
    schema = httpx.get(f"{echo.url}/openapi.json").json()
    assert "/predict" in schema["paths"]
    assert "PredictRequest" in schema["components"]["schemas"]


def test_typed_models_validate_inputs_and_outputs() -> None:
    with serving("serve_helpers:Adder", "--workers", "1") as server:
        assert _post(server, {"input": {"x": 1, "y": 2.5}}).json() == {"output": {"total": 3.5}}
        assert _post(server, {"inputs": [{"x": 1, "y": 1}]}).json() == {"outputs": [{"total": 2.0}]}
        bad = _post(server, {"input": {"x": 1}})
        assert bad.status_code == 422
        assert "y" in str(bad.json()["detail"])
        assert "missing" in str(bad.json()["detail"])
        schemas = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
        assert {"Point", "Total"} <= set(schemas)


def test_overload_is_503_with_retry_after_and_the_server_stays_up() -> None:
    with serving(
        "serve_helpers:Echo",
        "--workers", "1", "--max-batch", "2", "--max-queue", "4",
        env={"SERVE_PREDICT_S": "0.2"},
    ) as server:  # fmt: skip
        answers = asyncio.run(_clients(server.url, [{"input": i} for i in range(40)], 40))
        codes = [a.status_code for a in answers]
        assert 503 in codes
        assert 200 in codes
        refused = next(a for a in answers if a.status_code == 503)
        assert refused.headers["retry-after"] == "1"
        assert "queue is full" in refused.json()["error"]
        assert httpx.get(f"{server.url}/health").json()["status"] == "ready"
        assert _post(server, {"input": "after"}).json()["output"]["x"] == "after"
        too_many = _post(server, {"inputs": list(range(5))})
        assert too_many.status_code == 413


def test_a_request_with_no_answer_in_time_is_504() -> None:
    with serving("serve_helpers:Echo", "--workers", "1", "--timeout", "0.3") as server:
        answer = _post(server, {"input": {"sleep": 1.0}})
        assert answer.status_code == 504
        assert "0.3 s" in answer.json()["error"]
        time.sleep(0.8)
        assert _post(server, {"input": 1}).status_code == 200


def test_a_sigkilled_worker_fails_its_requests_fast_and_is_replaced() -> None:
    with serving("serve_helpers:Echo", "--workers", "2", "--max-batch", "1") as server:
        before = set(server.workers())
        assert len(before) == 2

        async def scenario() -> tuple[list[httpx.Response], list[httpx.Response], float]:
            async with httpx.AsyncClient(timeout=30) as http:
                slow = [
                    asyncio.ensure_future(http.post(f"{server.url}/predict",
                                                    json={"input": {"sleep": 20, "k": k}}))
                    for k in range(2)
                ]  # fmt: skip
                await asyncio.sleep(1.0)  # both workers hold a 20 s request
                killed = time.monotonic()
                for pid in before:
                    import os

                    os.kill(pid, signal.SIGKILL)
                failed = await asyncio.gather(*slow)
                waited = time.monotonic() - killed
                after = [await http.post(f"{server.url}/predict", json={"input": i})
                         for i in range(4)]  # fmt: skip
                return failed, after, waited

        failed, after, waited = asyncio.run(scenario())
        assert [a.status_code for a in failed] == [503, 503]
        assert "died" in failed[0].json()["error"]
        assert waited < 5, f"the requests of a killed worker waited {waited:.1f} s"
        assert [a.status_code for a in after] == [200] * 4
        assert set(server.workers()).isdisjoint(before)
        page = httpx.get(f"{server.url}/metrics").text
        assert metric(page, "paralela_serve_worker_restarts_total") == 2
        assert "died; restarting it" in server.stderr


def test_the_other_workers_serve_while_one_restarts(tmp_path: Path) -> None:
    hold = tmp_path / "hold-setup"  # a worker starting while this exists stays in setup
    with serving(
        "serve_helpers:Echo",
        "--workers",
        "2",
        "--max-batch",
        "1",
        env={"SERVE_SETUP_HOLD": str(hold)},
    ) as server:
        import os

        victim, survivor = server.workers()[:2]
        hold.touch()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{server.url}/health").json())["ready"] != 1:
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        assert health == {"status": "degraded", "workers": 2, "ready": 1}
        answers = [_post(server, {"input": i}) for i in range(5)]
        assert [a.status_code for a in answers] == [200] * 5
        # answered while the replacement was still held in its setup: no request waited
        # for it, the surviving worker took them all
        assert {a.json()["output"]["pid"] for a in answers} == {survivor}
        assert httpx.get(f"{server.url}/health").json()["ready"] == 1
        hold.unlink()
        while (health := httpx.get(f"{server.url}/health").json())["status"] != "ready":
            assert time.monotonic() < deadline + 30, health
            time.sleep(0.05)


def test_health_is_degraded_while_a_worker_is_past_the_timeout() -> None:
    with serving("serve_helpers:Echo", "--workers", "1", "--timeout", "0.5") as server:
        assert _post(server, {"input": {"sleep": 4}}).status_code == 504
        health = httpx.get(f"{server.url}/health")  # the only worker still holds the batch
        assert health.status_code == 200
        assert health.json() == {"status": "degraded", "workers": 1, "ready": 0}
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{server.url}/health")).json()["status"] != "ready":
            assert time.monotonic() < deadline, health.json()
            time.sleep(0.05)
        assert _post(server, {"input": 1}).status_code == 200


def test_health_is_not_ready_before_setup_ends() -> None:
    port = free_port()
    server = start("serve_helpers:Echo", "--workers", "1", env={"SERVE_SETUP_S": "3"}, port=port)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # the socket listens from the start
            try:
                health = httpx.get(f"{url}/health")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, server.stderr
                time.sleep(0.05)
        assert health.status_code == 503
        assert health.json()["status"] == "starting"
        early = _post(Server(url, server.process), {"input": "early"})  # waits for setup
        assert early.status_code == 200
        assert early.json()["output"]["x"] == "early"
        assert httpx.get(f"{url}/health").json() == {"status": "ready", "workers": 1, "ready": 1}
        assert "ready on" in server.stderr
    finally:
        server.stop()


def test_the_token_is_required_when_configured(tmp_path: Any) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    with serving("serve_helpers:Echo", "--workers", "1", "--token-file", str(token_file)) as server:
        assert _post(server, {"input": 1}).status_code == 401
        wrong = _post(server, {"input": 1}, headers={"Authorization": "Bearer s3cret-tokeN"})
        assert wrong.status_code == 401
        assert wrong.headers["www-authenticate"] == "Bearer"
        good = _post(server, {"input": 1}, headers={"Authorization": "Bearer s3cret-token"})
        assert good.status_code == 200
        for scheme in ("bearer", "BEARER"):  # RFC 9110: the scheme is case-insensitive
            auth = {"Authorization": f"{scheme} s3cret-token"}
            assert _post(server, {"input": 1}, headers=auth).status_code == 200, scheme
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        assert httpx.get(f"{server.url}/health").status_code == 200


def test_sigterm_answers_the_requests_in_flight_then_exits_0() -> None:
    server = wait_ready(start("serve_helpers:Echo", "--workers", "2", "--max-batch", "1"))
    workers = server.workers()

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as http:
            inflight = [
                asyncio.ensure_future(http.post(f"{server.url}/predict",
                                                json={"input": {"sleep": 1.0, "k": k}}))
                for k in range(4)
            ]  # fmt: skip
            await asyncio.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*inflight)

    try:
        answers = asyncio.run(scenario())
        assert [a.status_code for a in answers] == [200] * 4
        assert [a.json()["output"]["x"]["k"] for a in answers] == [0, 1, 2, 3]
        assert server.process.wait(30) == 0
        assert "stopped" in server.stderr
        import psutil

        assert not [p for p in workers if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    finally:
        server.stop()


def test_ctrl_c_during_setup_stops_at_once_and_leaves_no_worker() -> None:
    import psutil

    server = start("serve_helpers:Echo", "--workers", "2", env={"SERVE_SETUP_S": "60"})
    try:
        deadline = time.monotonic() + 30
        while len(server.workers()) < 2:  # both workers are in their 60 s setup
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.05)
        workers = server.workers()
        time.sleep(0.5)
        started = time.monotonic()
        assert server.stop(signal.SIGINT) == 0
        assert time.monotonic() - started < 5, "Ctrl-C waited for the workers' setup"
        time.sleep(0.2)
        alive = [p for p in workers if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
        assert not alive
        assert "Traceback" not in server.stderr
    finally:
        server.stop(signal.SIGKILL)


def test_ctrl_c_stops_the_server_cleanly() -> None:
    server = wait_ready(start("serve_helpers:Echo", "--workers", "1"))
    assert server.stop(signal.SIGINT) == 0
    assert "Traceback" not in server.stderr


def test_a_setup_that_fails_stops_the_server_with_its_error() -> None:
    server = start("serve_helpers:BrokenSetup", "--workers", "2")
    assert server.stop(None, timeout=60) == 1
    assert "no weights at /nowhere/model.pt" in server.stderr
    assert "FileNotFoundError" in server.stderr


@pytest.mark.gpu
def test_each_worker_holds_its_own_gpu() -> None:
    from paralela.resources import detect

    gpus = detect().gpus
    if not gpus:
        pytest.skip("needs an NVIDIA GPU")
    with serving("serve_helpers:Echo", "--workers-per-device", "2") as server:
        assert len(server.workers()) == 2 * len(gpus)
        answers = asyncio.run(_clients(server.url, [{"input": i} for i in range(200)], 32))
        outputs = [a.json()["output"] for a in answers]
        assert {o["device"] for o in outputs} == {"cuda:0"}
        seen = {o["cuda"] for o in outputs}
        assert all(v and "," not in v for v in seen), "each worker sees exactly one GPU"
        assert len(seen) == len(gpus), "the workers spread over every GPU"


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_of_a_worker_sleep_when_they_wait_unless_told(
    given: str | None, seen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spinning OpenMP threads take the CPUs the server and the clients need (bench_serve)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = {"OMP_WAIT_POLICY": given} if given else None
    with serving("serve_helpers:Echo", "--workers", "1", env=env) as server:
        (worker,) = server.workers()
        with open(f"/proc/{worker}/environ", "rb") as f:
            environ = dict(v.partition(b"=")[::2] for v in f.read().split(b"\0") if v)
        assert environ[b"OMP_WAIT_POLICY"] == seen.encode()
        assert _post(server, {"input": 1}).status_code == 200
