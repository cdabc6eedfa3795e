"""Serving a trained model over HTTP (``paralela serve``) and batch prediction over files
(``paralela predict``): the user's model class (``_model``), built once per worker.

``predict`` loads its modules (and ``paralela.files``' readers) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from paralela.serving._model import LoadedModel, ModelError, check_model, model_name
from paralela.serving._serve import ExposedServerWarning, serve

if TYPE_CHECKING:
    from paralela.serving._predict import PredictResult, predict

__all__ = [
    "ExposedServerWarning",
    "LoadedModel",
    "ModelError",
    "PredictResult",
    "check_model",
    "model_name",
    "predict",
    "serve",
]

_LAZY = {"predict": "paralela.serving._predict", "PredictResult": "paralela.serving._predict"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.serving' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
