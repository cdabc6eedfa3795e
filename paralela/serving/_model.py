"""The user's model, as ``serve`` and ``predict`` see it: a class, built once per worker.

::

    class Embedder:                      # given as `module:Embedder` or as the class
        input_model = Sentence           # optional pydantic models: validation, OpenAPI
        output_model = Embedding
        def setup(self, device): ...     # optional: load weights once, on "cuda:0" / "cpu"
        def predict(self, batch): ...    # a list of inputs -> a list of outputs, same length

    check_model(cls) ──in the driver, before any worker starts──> ConfigError naming what
                                                                   is missing
    LoadedModel(cls, device) ──in each worker──> .predict(batch): checked output length,
                                                 errors as ModelError naming the class

A model class takes no constructor arguments (configure it with class attributes or the
environment). ``setup`` is optional: a class that loads nothing in it works as well.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from paralela.errors import ConfigError
from paralela.serving._model_error import ModelError

__all__ = ["LoadedModel", "ModelError", "check_model", "model_name"]


def model_name(cls: Any) -> str:
    """``module:Class`` of a model class, for messages and run identities."""
    module = getattr(cls, "__module__", "?")
    return f"{module}:{getattr(cls, '__qualname__', type(cls).__name__)}"


def check_model(cls: Any) -> type:
    """Check a model class before any worker starts; returns it.

    Raises:
        ConfigError: ``cls`` is not a class, takes constructor arguments, has no
            ``predict(self, batch)``, a ``setup`` that does not take ``device``, or an
            ``input_model``/``output_model`` that is not a pydantic model.
    """
    if not inspect.isclass(cls):
        raise ConfigError(
            f"A model is a class with predict(self, batch) (and optionally setup(self, "
            f"device)); got {type(cls).__name__} {cls!r}. Pass the class itself, not an "
            "instance or a function."
        )
    name = model_name(cls)
    try:
        inspect.signature(cls).bind()
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name} takes constructor arguments; a model is built with {cls.__name__}() "
            "in every worker. Configure it with class attributes or environment variables, "
            "and load weights in setup(self, device)."
        ) from None
    predict = getattr(cls, "predict", None)
    if not callable(predict):
        raise ConfigError(
            f"{name} has no predict method; define predict(self, batch) taking a list of "
            "inputs and returning a list of outputs of the same length."
        )
    _check_arity(name, "predict", predict, "predict(self, batch)")
    setup = getattr(cls, "setup", None)
    if setup is not None:
        if not callable(setup):
            raise ConfigError(f"{name}.setup is not a method; define setup(self, device).")
        _check_arity(name, "setup", setup, "setup(self, device)")
    for attribute in ("input_model", "output_model"):
        schema = getattr(cls, attribute, None)
        if schema is not None and not _is_pydantic_model(schema):
            raise ConfigError(
                f"{name}.{attribute} is {schema!r}; it must be a pydantic BaseModel subclass "
                "(or left unset)."
            )
    return cls


def _check_arity(name: str, method: str, fn: Any, usage: str) -> None:
    try:
        inspect.signature(fn).bind(None, None)  # self, and one argument
    except TypeError:
        raise ConfigError(f"{name}.{method} must take one argument: define {usage}.") from None
    except ValueError:  # a builtin without a signature: trust it
        return


def _is_pydantic_model(obj: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:
        return False
    return inspect.isclass(obj) and issubclass(obj, BaseModel)


class LoadedModel:
    """One worker's instance of the user's model, set up on ``device``.

    Raises:
        ModelError: the constructor or ``setup`` raised (the cause is the user's exception).
    """

    def __init__(self, cls: type, device: str) -> None:
        self.name = model_name(cls)
        self.device = device
        from paralela.serving._litapi import LitApiAdapter, is_litapi, prepare

        try:
            self.instance = cls()
            if is_litapi(cls):
                prepare(self.instance, device)
            setup = getattr(self.instance, "setup", None)
            if setup is not None:
                setup(device)
            if is_litapi(cls):
                self.instance = LitApiAdapter(self.instance, self.name)
        except Exception as exc:
            raise ModelError(
                f"{self.name} failed to set up on {device}: {type(exc).__name__}: {exc}"
            ) from exc

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        """The model's outputs for ``batch``, one per input, in order.

        Raises:
            ModelError: ``predict`` raised, or returned something that is not a sequence
                as long as ``batch`` (a numpy array or a tensor counts, row by row).
        """
        try:
            outputs = self.instance.predict(list(batch))
        except ModelError as exc:  # a LitAPI's method, named: the batch's size added
            raise ModelError(f"{exc} (on a batch of {len(batch)})") from exc.__cause__
        except Exception as exc:
            raise ModelError(
                f"{self.name}.predict raised {type(exc).__name__}: {exc} (on a batch of "
                f"{len(batch)})"
            ) from exc
        if hasattr(outputs, "tolist") and not isinstance(outputs, list):
            outputs = outputs.tolist()  # numpy arrays, tensors: plain lists per row
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            raise ModelError(
                f"{self.name}.predict returned {type(outputs).__name__}; it must return a "
                f"list with one output per input (the batch had {len(batch)})."
            )
        if len(outputs) != len(batch):
            raise ModelError(
                f"{self.name}.predict returned {len(outputs)} outputs for a batch of "
                f"{len(batch)}; it must return one output per input, in order."
            )
        return list(outputs)
