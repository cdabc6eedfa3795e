"""LitServe's ``tests/unit/test_pydantic.py`` classes, as published (Apache-2.0, The
Lightning AI team): ``decode_request`` takes a pydantic model, ``encode_response`` returns
one. No ``from __future__ import annotations`` here, as there: the annotations are the
classes themselves."""

from litserve import LitAPI
from pydantic import BaseModel


class PredictRequest(BaseModel):
    input: float


class PredictResponse(BaseModel):
    output: float


class SimpleLitAPI(LitAPI):
    def setup(self, device):
        self.model = lambda x: x**2

    def decode_request(self, request: PredictRequest) -> float:
        return request.input

    def predict(self, x):
        return self.model(x)

    def encode_response(self, output: float) -> PredictResponse:
        return PredictResponse(output=output)


class NoAnnotationLitAPI(LitAPI):
    def setup(self, device):
        pass

    def predict(self, request):
        return {"output": request["input"] ** 2}
