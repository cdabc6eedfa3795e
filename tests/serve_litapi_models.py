"""LitServe APIs, written for LitServe (``litserve.LitAPI`` subclasses), that the
``serve`` tests serve with paralela unchanged; the first two are LitServe's own examples
(``litserve.test_examples``), imported from the package itself."""

from __future__ import annotations

from typing import Any

import litserve as ls
from fastapi import HTTPException
from litserve.test_examples import SimpleBatchedAPI, SimpleLitAPI, SimpleTorchAPI

__all__ = ["BatchedSquares", "Picky", "SimpleBatchedAPI", "SimpleLitAPI", "SimpleTorchAPI"]


class BatchedSquares(ls.LitAPI):
    """Batched as LitServe batches: ``max_batch_size`` in the constructor, ``predict`` on
    the list ``batch`` made; each answer says how large its batch was."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=8, batch_timeout=0.01)

    def setup(self, device: str) -> None:
        self.seen_device = device

    def decode_request(self, request: dict[str, Any]) -> float:
        return float(request["input"])

    def predict(self, x: list[float]) -> list[dict[str, Any]]:
        return [{"square": v * v, "batch": len(x), "device": self.seen_device} for v in x]

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return {"output": output["square"], "batch": output["batch"], "device": output["device"]}


class Picky(ls.LitAPI):
    """Refuses negative inputs with an HTTP 400, as LitServe's docs show."""

    def setup(self, device: str) -> None:
        pass

    def decode_request(self, request: dict[str, Any]) -> float:
        value = float(request["input"])
        if value < 0:
            raise HTTPException(status_code=400, detail="input must be >= 0")
        return value

    def predict(self, x: float) -> float:
        return x**0.5

    def encode_response(self, output: float) -> dict[str, float]:
        return {"output": output}
