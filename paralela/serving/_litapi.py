"""LitServe's ``LitAPI`` classes, served by ``paralela serve`` unchanged.

::

    class API(ls.LitAPI):                      paralela serve server.py:API
        def setup(self, device): ...           once per worker, after api.device = device
        def decode_request(self, request): ... the whole JSON body of POST /predict
        def predict(self, x): ...              one x, or batch(xs) when max_batch_size > 1
        def encode_response(self, output): ... the whole JSON answer

A class is taken for a LitAPI when it has ``decode_request`` and ``encode_response``
(subclassing ``litserve.LitAPI`` is not required). Its own ``max_batch_size`` (set in its
constructor) decides whether ``predict`` gets a batch, as in LitServe: ``batch`` and
``unbatch`` are the class's (LitAPI's defaults stack tensors and arrays, and list the
outputs). paralela's ``--max-batch`` groups requests on their way to a worker either way.
Streaming (``stream=True``) is not supported: such a class is refused at setup.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["LitApiAdapter", "is_litapi"]


def is_litapi(cls: Any) -> bool:
    """Whether ``cls`` follows LitServe's LitAPI: ``decode_request`` and
    ``encode_response`` around ``predict``."""
    return callable(getattr(cls, "decode_request", None)) and callable(
        getattr(cls, "encode_response", None)
    )


def prepare(api: Any, device: str) -> None:
    """What LitServe does before ``setup``: the device and ``pre_setup``.

    Raises:
        ValueError: the API streams its outputs, which paralela serve does not do.
    """
    if getattr(api, "stream", False):
        raise ValueError(
            "this LitAPI streams its outputs (stream=True), which paralela serve does not "
            "support; serve it with LitServe, or return whole outputs"
        )
    with contextlib.suppress(AttributeError):  # a read-only property: leave it
        api.device = device
    pre_setup = getattr(api, "pre_setup", None)
    if callable(pre_setup):
        pre_setup()


class LitApiAdapter:
    """A LitAPI as paralela's model: ``predict(bodies)`` -> one encoded answer per body."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.max_batch = int(getattr(api, "max_batch_size", 1) or 1)

    def predict(self, bodies: list[Any]) -> list[Any]:
        api = self.api
        inputs = [api.decode_request(body) for body in bodies]
        if self.max_batch == 1:
            outputs = [api.predict(x) for x in inputs]
        else:  # batches of at most the API's own max_batch_size
            outputs = []
            for first in range(0, len(inputs), self.max_batch):
                batch = api.batch(inputs[first : first + self.max_batch])
                outputs.extend(api.unbatch(api.predict(batch)))
        return [api.encode_response(output) for output in outputs]
