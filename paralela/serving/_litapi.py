"""LitServe's ``LitAPI`` classes, served by ``paralela serve`` unchanged.

::

    class API(ls.LitAPI):                      paralela serve server.py:API
        def setup(self, device): ...           once per worker, after api.device = device
        def decode_request(self, request): ... the whole JSON body of POST /predict
                                               (annotated with a pydantic model: the
                                               validated model; a body that does not fit
                                               it is a 422 before any worker sees it)
        def predict(self, x): ...              one x, or batch(xs) when max_batch_size > 1
        def encode_response(self, output): ... the whole JSON answer

A class is taken for a LitAPI when it has ``decode_request`` and ``encode_response``
(subclassing ``litserve.LitAPI`` is not required). Its own ``max_batch_size`` (set in its
constructor) decides whether ``predict`` gets a batch, as in LitServe: ``batch`` and
``unbatch`` are the class's (LitAPI's defaults stack tensors and arrays, and list the
outputs). paralela's ``--max-batch`` groups requests on their way to a worker either way.
Streaming (``stream=True``) is not supported: such a class is refused at setup.
An error of the API names the method that raised (``decode_request``, ``batch``,
``predict``, ``unbatch`` or ``encode_response``).
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

from paralela.serving._model_error import ModelError

__all__ = ["LitApiAdapter", "is_litapi", "request_model", "response_model"]


def is_litapi(cls: Any) -> bool:
    """Whether ``cls`` follows LitServe's LitAPI: ``decode_request`` and
    ``encode_response`` around ``predict``."""
    return callable(getattr(cls, "decode_request", None)) and callable(
        getattr(cls, "encode_response", None)
    )


def request_model(cls: Any) -> Any:
    """The pydantic model ``decode_request``'s argument is annotated with, or None (no
    annotation, or one that is not a pydantic model: the body goes as JSON values)."""
    return _pydantic(_annotation(getattr(cls, "decode_request", None), parameter=True))


def response_model(cls: Any) -> Any:
    """The pydantic model ``encode_response`` is annotated to return, or None."""
    return _pydantic(_annotation(getattr(cls, "encode_response", None), parameter=False))


def _annotation(fn: Any, *, parameter: bool) -> Any:
    """The annotation of ``fn``'s first argument after ``self`` (or of its return),
    resolved when it is a string (``from __future__ import annotations``)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if parameter:
        names = [p for p in signature.parameters if p != "self"]
        if not names:
            return None
        name = names[0]
    else:
        name = "return"
    try:
        return typing.get_type_hints(fn).get(name)
    except Exception:  # an annotation that names what its module lacks: none usable
        return None


def _pydantic(annotation: Any) -> Any:
    try:
        from pydantic import BaseModel
    except ImportError:
        return None
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


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
    """A LitAPI as paralela's model: ``predict(bodies)`` -> one encoded answer per body.

    Raises:
        ModelError: a method of the API raised; the message names it (``name.method``),
            the API's own exception is the cause.
    """

    def __init__(self, api: Any, name: str) -> None:
        self.api = api
        self.name = name
        self.max_batch = int(getattr(api, "max_batch_size", 1) or 1)
        self.request_model = request_model(type(api))

    def predict(self, bodies: list[Any]) -> list[Any]:
        api, call = self.api, self._call
        if self.request_model is not None:  # validated by the server: again, into the model
            bodies = [call("decode_request", self.request_model.model_validate, b) for b in bodies]
        inputs = [call("decode_request", api.decode_request, body) for body in bodies]
        if self.max_batch == 1:
            outputs = [call("predict", api.predict, x) for x in inputs]
        else:  # batches of at most the API's own max_batch_size
            outputs = []
            for first in range(0, len(inputs), self.max_batch):
                batch = call("batch", api.batch, inputs[first : first + self.max_batch])
                outputs.extend(call("unbatch", api.unbatch, call("predict", api.predict, batch)))
        return [call("encode_response", api.encode_response, output) for output in outputs]

    def _call(self, method: str, fn: Callable[[Any], Any], value: Any) -> Any:
        try:
            return fn(value)
        except Exception as exc:
            raise ModelError(f"{self.name}.{method} raised {type(exc).__name__}: {exc}") from exc
