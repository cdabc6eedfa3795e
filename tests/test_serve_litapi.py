"""LitServe APIs served by ``paralela serve`` unchanged: LitServe's own example classes
and its test scenarios (``tests/test_simple.py``, ``tests/e2e/default_batching.py``:
POST ``{"input": 4.0}`` to ``/predict`` answers ``{"output": 16.0}``), ported onto a real
paralela server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.serve_helpers import serving

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _post(url: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}/predict", json=body, timeout=30)


def test_litserves_simple_example_answers_as_under_litserve() -> None:
    with serving("serve_litapi_models:SimpleLitAPI", "--workers", "1") as server:
        answer = _post(server.url, {"input": 4.0})
        assert answer.status_code == 200
        assert answer.json() == {"output": 16.0}


def test_litserves_batched_example_with_its_batch_size() -> None:
    with serving("serve_litapi_models:SimpleBatchedAPI", "--workers", "1") as server:

        async def many() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(
                    *(http.post(f"{server.url}/predict", json={"input": i}) for i in range(32))
                )

        answers = asyncio.run(many())
        assert [a.json() for a in answers] == [{"output": i * i} for i in range(32)]


def test_litserves_torch_example_on_the_workers_device() -> None:
    with serving("serve_litapi_models:SimpleTorchAPI", "--workers", "1") as server:
        assert _post(server.url, {"input": 4.0}).json() == {"output": 9.0}


def test_a_litapi_batched_by_its_max_batch_size_gets_lists_and_each_answer_is_its_own() -> None:
    with serving(
        "serve_litapi_models:BatchedSquares", "--workers", "1", "--max-wait-ms", "20"
    ) as server:

        async def many() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(
                    *(http.post(f"{server.url}/predict", json={"input": i}) for i in range(40))
                )

        answers = [a.json() for a in asyncio.run(many())]
        assert [a["output"] for a in answers] == [float(i * i) for i in range(40)]
        assert 1 < max(a["batch"] for a in answers) <= 8, "batches of its max_batch_size=8"
        assert {a["device"] for a in answers} == {"cpu"}


def test_an_http_exception_of_decode_request_keeps_its_status() -> None:
    with serving("serve_litapi_models:Picky", "--workers", "1") as server:
        refused = _post(server.url, {"input": -1})
        assert refused.status_code == 400
        assert refused.json() == {"error": "input must be >= 0"}
        assert _post(server.url, {"input": 9}).json() == {"output": 3.0}
        broken = _post(server.url, {"wrong": 9})
        assert broken.status_code == 500
        assert "Picky.decode_request raised KeyError" in broken.json()["error"], broken.json()
        nan = httpx.post(f"{server.url}/predict", content=b'{"input": NaN}',
                         headers={"content-type": "application/json"})  # fmt: skip
        assert nan.status_code == 422, nan.text


# LitServe's tests/unit/test_pydantic.py, on a real paralela server: decode_request takes
# the validated model, and a body that does not fit it is a 422 before any worker sees it.


def test_pydantic() -> None:
    with serving("serve_litapi_pydantic:SimpleLitAPI", "--workers", "1") as server:
        response = _post(server.url, {"input": 4.0})
        assert response.json() == {"output": 16.0}
        for body in ({"input": "four"}, {}, [4.0]):
            refused = _post(server.url, body)
            assert refused.status_code == 422, (body, refused.text)
            assert refused.json()["detail"][0]["loc"][0] == "body"
        schema = httpx.get(f"{server.url}/openapi.json").json()
        assert {"PredictRequest", "PredictResponse"} <= set(schema["components"]["schemas"])


def test_swagger_request_body_without_decode_request_annotation() -> None:
    """LitServe issue 667: with no annotation, /docs still offers a JSON request body."""
    from paralela.serving._serve_app import ServeOptions, build_app
    from paralela.serving._serve_batcher import Batcher
    from paralela.serving._serve_metrics import Metrics
    from tests.serve_litapi_pydantic import NoAnnotationLitAPI

    app = build_app(NoAnnotationLitAPI, None, Batcher(1, 0, 1), Metrics(),  # type: ignore[arg-type]
                    ServeOptions(1.0, None, 1024))  # fmt: skip
    predict_post = app.app.openapi()["paths"]["/predict"]["post"]
    assert "requestBody" in predict_post, "Swagger must expose a requestBody for /predict"
    assert "application/json" in predict_post["requestBody"]["content"]
