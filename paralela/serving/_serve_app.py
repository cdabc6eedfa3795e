"""The HTTP side of ``paralela serve``: a FastAPI app over the batcher and the workers.

::

    Guard (pure ASGI: token, body size, status and latency counts)
      └ FastAPI
          POST /predict   {"input": x} -> {"output": y};  {"inputs": [..]} -> {"outputs": [..]}
                          422 a malformed body (FastAPI names the field), 400 not UTF-8
                          JSON, 415 not sent as JSON, 413 too large,
                          503 + Retry-After queue full or worker died, 504 timed out,
                          500 the model failed on this input
                          (a LitServe LitAPI class: the whole body in, validated first
                          when decode_request takes a pydantic model; its whole answer out)
                          JSON is strict: NaN and Infinity are a 422
          GET  /health    200 ready (or degraded: some workers restarting or past the
                          timeout on a batch), 503 starting or unavailable
          GET  /metrics   Prometheus text
          GET  /docs      OpenAPI docs, with the model's input_model/output_model schemas

The answers are JSON the workers encoded; the event loop only joins bytes. This module
imports FastAPI: ``serve`` imports it only once the ``serve`` extra is known present.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from paralela.serving._litapi import is_litapi, request_model, response_model
from paralela.serving._model import model_name
from paralela.serving._serve_batcher import Batcher, QueueFull
from paralela.serving._serve_metrics import CONTENT_TYPE, Metrics
from paralela.serving._serve_pool import WorkerDied, WorkerPool
from paralela.serving._serve_worker import Failed

__all__ = ["Guard", "ServeOptions", "build_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Paths open without the token: probes and the docs.
OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/openapi.json"})


@dataclass(frozen=True)
class ServeOptions:
    """What ``serve`` was asked for, as the app needs it."""

    timeout: float
    token: str | None
    max_body_bytes: int


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body).encode(), status, headers, media_type="application/json")


def build_app(model: type, pool: WorkerPool, batcher: Batcher, metrics: Metrics,
              options: ServeOptions) -> Any:  # fmt: skip
    """The ASGI app: FastAPI behind :class:`Guard`."""
    app = FastAPI(
        title=f"paralela serve: {model_name(model)}",
        description=(model.__doc__ or "").strip(),
        lifespan=_lifespan(pool, batcher),
    )
    app.router.route_class = StrictJSONRoute

    @app.exception_handler(400)
    async def unreadable(request: Any, exc: Any) -> Response:  # FastAPI's "error parsing"
        return _json(400, {"error": "the body is not JSON text (UTF-8): "
                                    f"{getattr(exc, 'detail', exc)}"})  # fmt: skip

    _add_predict(app, model, _answerer(batcher, options))
    _add_status(app, pool, batcher, metrics)
    return Guard(app, metrics, options)


def _lifespan(pool: WorkerPool, batcher: Batcher) -> Callable[[Any], Any]:
    """The app's lifespan: the workers start with it; on the way out they stop and every
    request still queued fails as the server stopping."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        pool.start()
        try:
            yield
        finally:
            await pool.stop()
            batcher.fail_all(WorkerDied("the server is stopping"))

    return lifespan


def _responses() -> dict[int | str, dict[str, Any]]:
    """The answers of POST /predict besides 200 and 422, for the OpenAPI docs (a new
    dict for each app: FastAPI keeps it)."""
    return {
        413: {"description": "The body is larger than the server allows."},
        500: {"description": "The model failed on this input."},
        503: {"description": "The queue is full, or the worker holding the request died."},
        504: {"description": "No answer within the server's timeout."},
    }


def _answerer(
    batcher: Batcher, options: ServeOptions
) -> Callable[[list[Any], bool, bool], Awaitable[Response]]:
    """``answer(values, wrap, single)``: the one path of every /predict request."""

    async def answer(values: list[Any], wrap: bool, single: bool) -> Response:
        """Queue ``values``, wait for their outputs; the response (``wrap``: in
        ``{"output": ..}`` or ``{"outputs": [..]}``, else the single output as it is)."""
        if not values:
            return Response(b'{"outputs":[]}', media_type="application/json")
        if len(values) > batcher.max_queue:
            return _json(413, {"error": f"a request carries at most {batcher.max_queue} "
                                        "inputs (the server's --max-queue); split it"})  # fmt: skip
        try:
            futures = batcher.put(values)
        except QueueFull:
            return _json(
                503,
                {"error": f"the server's queue is full ({batcher.max_queue} inputs); retry"},
                {"Retry-After": "1"},
            )
        waiting: Awaitable[Any] = futures[0] if single else asyncio.gather(*futures)
        try:
            result = await asyncio.wait_for(waiting, options.timeout)
        except asyncio.TimeoutError:
            return _json(504, {"error": f"no answer within {options.timeout:g} s"})
        except WorkerDied as exc:
            for future in futures:
                future.cancel()
            return _json(503, {"error": str(exc)}, {"Retry-After": "1"})
        outputs = [result] if single else result
        failed = next((o for o in outputs if isinstance(o, Failed)), None)
        if failed is not None:
            return _json(failed.status, {"error": failed.message})
        if not wrap:
            return Response(result, media_type="application/json")
        if single:
            return Response(b'{"output":' + result + b"}", media_type="application/json")
        return Response(b'{"outputs":[' + b",".join(result) + b"]}",
                        media_type="application/json")  # fmt: skip

    return answer


def _add_predict(
    app: FastAPI, model: type, answer: Callable[[list[Any], bool, bool], Awaitable[Response]]
) -> None:
    """POST /predict for ``model``: a LitAPI's whole body (validated against its
    ``decode_request`` model when it has one), else ``{"input"}`` or ``{"inputs"}``
    validated against the model's ``input_model``."""

    async def predict(body: Any) -> Response:
        single = "input" in body.model_fields_set
        values = [body.input] if single else body.inputs
        if getattr(model, "input_model", None) is not None:
            values = [v.model_dump() for v in values]  # validated again by the worker
        return await answer(values, True, single)

    async def predict_litapi(request: Request) -> Response:
        """A LitAPI's endpoint: the whole body to its ``decode_request``, the whole answer
        from its ``encode_response``."""
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:  # as FastAPI words it for the other models
            return _json(422, {"detail": [{"type": "json_invalid", "loc": ["body", exc.pos],
                                           "msg": "JSON decode error",
                                           "ctx": {"error": exc.msg}}]})  # fmt: skip
        except ValueError as exc:
            return _json(400, {"error": f"the body is not JSON text (UTF-8): {exc}"})
        except ClientDisconnect:  # closed before its body came (timed out): nobody reads this
            return _json(400, {"error": "the connection closed before the body arrived"})
        return await answer([body], False, True)

    async def predict_litapi_typed(body: Any) -> Response:
        """A LitAPI whose ``decode_request`` takes a pydantic model: the body validated
        against it (422 otherwise), as LitServe does."""
        return await answer([body.model_dump()], False, True)  # validated again by the worker

    responses = _responses()
    if is_litapi(model) and request_model(model) is not None:
        predict_litapi_typed.__annotations__["body"] = request_model(model)
        app.post("/predict", responses=responses,
                 response_model=response_model(model))(predict_litapi_typed)  # fmt: skip
    elif is_litapi(model):  # any JSON body, shown as such in /docs (as LitServe's issue 667)
        body_doc = {"content": {"application/json": {"schema": {}}}, "required": True}
        app.post("/predict", responses=responses, response_model=response_model(model),
                 openapi_extra={"requestBody": body_doc})(predict_litapi)  # fmt: skip
    else:
        # The body's model is made at run time: given to FastAPI as the real annotation.
        predict.__annotations__["body"] = _request_model(model)
        app.post("/predict", responses=responses, response_model=_response_model(model))(predict)


def _add_status(app: FastAPI, pool: WorkerPool, batcher: Batcher, metrics: Metrics) -> None:
    """GET /health (200 ready or degraded, 503 starting or unavailable) and /metrics."""

    @app.get("/health")
    async def health() -> Response:
        ready = pool.ready
        alive = ready or pool.stalled  # a stalled worker may still answer: not "unavailable"
        status = "ready" if ready == pool.size else "degraded" if alive else "unavailable"
        if not pool.started:
            status = "starting"
        code = 200 if status in ("ready", "degraded") else 503
        return _json(code, {"status": status, "workers": pool.size, "ready": ready})

    @app.get("/metrics", response_class=Response)
    async def metrics_page() -> Response:
        text = metrics.render(len(batcher), pool.size, pool.ready)
        return Response(text, media_type=CONTENT_TYPE)


class StrictJSONRequest(Request):
    """A request whose JSON body is read strictly: ``NaN``, ``Infinity`` and
    ``-Infinity``, which RFC 8259 does not allow but Python's json reads, are a
    ``JSONDecodeError`` (FastAPI's 422), not a float that the model gets."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = json.loads(body, parse_constant=functools.partial(_refuse, body))
        return self._json


def _refuse(body: bytes, constant: str) -> Any:
    text = body.decode("utf-8", "replace")
    # where the constant is, strings skipped (it may appear inside one)
    pos = next((m.start(1) for m in _CONSTANTS.finditer(text) if m.group(1) == constant), 0)
    raise json.JSONDecodeError(
        f"{constant} is not JSON (RFC 8259 has no NaN or Infinity); send a finite number or null",
        text,
        pos,
    )


_CONSTANTS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


class StrictJSONRoute(APIRoute):
    """FastAPI's route, with a :class:`StrictJSONRequest` for the endpoint."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive, request._send))

        return strict


def _request_model(model: type) -> Any:
    """The body of ``/predict``: exactly one of ``input`` and ``inputs``, each validated by
    the model's ``input_model`` when it has one."""
    from pydantic import ConfigDict, create_model, model_validator

    item: Any = getattr(model, "input_model", None) or Any

    def exactly_one(self: Any) -> Any:
        given = {"input", "inputs"} & self.model_fields_set
        if len(given) != 1:
            raise ValueError(
                'the body holds either "input" (one input) or "inputs" (a list of them), '
                f"not {'both' if given else 'neither'}"
            )
        return self

    return create_model(
        "PredictRequest",
        __config__=ConfigDict(extra="forbid"),
        __validators__={"exactly_one": model_validator(mode="after")(exactly_one)},  # type: ignore[dict-item]
        input=(item | None, None),
        inputs=(list[item] | None, None),
    )


def _response_model(model: type) -> Any:
    from pydantic import create_model

    item: Any = getattr(model, "output_model", None) or Any
    return create_model("PredictResponse", output=(item | None, None),
                        outputs=(list[item] | None, None))  # fmt: skip


class Guard:
    """Pure ASGI middleware in front of the app: the bearer token, the body size limit,
    and each ``/predict`` answer's status and latency counted."""

    def __init__(self, app: Any, metrics: Metrics, options: ServeOptions) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = options.max_body_bytes
        self.token = options.token.encode() if options.token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            # RFC 9110 11.1: the scheme is case-insensitive, one or more spaces follow it
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            matches = hmac.compare_digest(given.lstrip(b" "), self.token)
            if not (matches and scheme.lower() == b"bearer"):
                self.metrics.requests[401] += 1
                await _send(send, 401, {"error": "a bearer token is required: send the header "
                                        "'Authorization: Bearer <token>'"},
                            [(b"www-authenticate", b"Bearer")])  # fmt: skip
                return
        kind: bytes | None = headers.get(b"content-type")
        if scope["path"] != "/predict":
            pass
        elif kind is None:  # as JSON, which it must be
            scope["headers"] = [*scope["headers"], (b"content-type", b"application/json")]
        elif b"json" not in kind.lower():
            self.metrics.requests[415] += 1
            shown = kind.decode("latin-1")
            await _send(send, 415, {"error": "the body is JSON: send the header 'Content-Type: "
                                    f"application/json', not {shown!r}"})  # fmt: skip
            return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await self._too_large(send)
            return
        if length is None and headers.get(b"transfer-encoding"):
            replay = await self._read_body(receive)  # chunked: counted as it comes
            if replay is None:
                await self._too_large(send)
                return
            receive = replay
        if scope["path"] != "/predict":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests[status] += 1
            self.metrics.request_seconds.observe(time.perf_counter() - started)

    async def _too_large(self, send: Send) -> None:
        self.metrics.requests[413] += 1
        await _send(send, 413, {"error": f"the body is larger than {self.max_body} bytes "
                                "(the server's --max-body)"})  # fmt: skip

    async def _read_body(self, receive: Receive) -> Receive | None:
        """The whole body, or None once it passes the limit; a receive that replays it."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return None
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


async def _send(send: Send, status: int, body: dict[str, Any],
                headers: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()), *(headers or [])],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})
