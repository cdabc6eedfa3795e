"""The peer servers of ``bench_serve.py``, each started as its own process tree::

    python _serve_peers.py KIND --port P [--max-batch B] [--batch-timeout S] [--workers W]

KIND: ``fastapi_async`` (an ``async def`` endpoint: the model runs on the event loop),
``fastapi_sync`` (a ``def`` endpoint: FastAPI's thread pool), ``litserve`` (LitServe
0.2.19, ``accelerator="cpu"``, ``max_batch_size``/``batch_timeout`` on the ``LitAPI``,
``workers_per_device`` W). Every server loads ``_serve_model.Embedder`` (the same class
paralela serve loads), listens on 127.0.0.1, logs at ``warning`` and speaks paralela's
JSON: ``POST /predict {"input": "<sentence>"}`` -> ``{"output": [384 floats]}``; FastAPI's
``GET /health`` answers once the model is loaded (LitServe has its own). SIGINT stops it.

No ``from __future__ import annotations`` here: FastAPI and LitServe read the endpoint's
annotations at run time (the pydantic request model ``Item``, as FastAPI's rows use).
"""

import argparse
from typing import Any

import litserve as ls
import uvicorn
from _serve_model import Embedder
from fastapi import FastAPI
from pydantic import BaseModel

HOST = "127.0.0.1"


class Item(BaseModel):
    input: str


def fastapi_app(kind: str) -> FastAPI:
    model = Embedder()
    model.setup("cpu")
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ready"}

    if kind == "fastapi_async":

        @app.post("/predict")
        async def predict_async(item: Item) -> dict[str, Any]:
            return {"output": model.predict([item.input])[0]}

    else:

        @app.post("/predict")
        def predict_sync(item: Item) -> dict[str, Any]:
            return {"output": model.predict([item.input])[0]}

    return app


class EmbedAPI(ls.LitAPI):  # type: ignore[misc]
    """The same model behind LitServe; with batching, ``predict`` gets a list."""

    def setup(self, device: Any) -> None:
        self.model = Embedder()
        self.model.setup(device)

    def decode_request(self, request: Item) -> str:  # a real class: LitServe reads it
        return request.input

    def predict(self, x: Any) -> Any:
        if self.max_batch_size > 1:  # x: a list of sentences
            return self.model.predict(list(x))
        return self.model.predict([x])[0]

    def encode_response(self, output: Any) -> dict[str, Any]:
        return {"output": output}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["fastapi_async", "fastapi_sync", "litserve"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--batch-timeout", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    if args.kind == "litserve":
        api = EmbedAPI(max_batch_size=args.max_batch, batch_timeout=args.batch_timeout)
        server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers)
        server.run(host=HOST, port=args.port, log_level="warning", generate_client_file=False)
    else:
        app = fastapi_app(args.kind)
        uvicorn.run(app, host=HOST, port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
