"""Scaling analysis: would more workers help? Amdahl's and Gustafson's laws, measured.

:func:`measure` runs the same work at several worker counts and fits the serial
fraction with its uncertainty; :func:`analyse` does the same for timings measured
elsewhere; :func:`load_scaling` reads a saved ``scaling.json``. ``paralela scale`` is
the command-line front (docs/scaling.md).

Importing this package is cheap: the modules load when a name is used, and
``paralela.scaling._model`` (the result and its file format) imports nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paralela.scaling._analysis import analyse
    from paralela.scaling._fit import fit_amdahl, fit_gustafson
    from paralela.scaling._measure import measure
    from paralela.scaling._model import (
        Caveat,
        Fit,
        Prediction,
        RunRecord,
        ScalingError,
        ScalingPoint,
        ScalingResult,
        amdahl_speedup,
        gustafson_speedup,
        load_scaling,
    )

__all__ = [
    "measure",
    "analyse",
    "fit_amdahl",
    "fit_gustafson",
    "load_scaling",
    "amdahl_speedup",
    "gustafson_speedup",
    "ScalingResult",
    "ScalingPoint",
    "Fit",
    "Prediction",
    "Caveat",
    "RunRecord",
    "ScalingError",
]

_LAZY = {
    "measure": "paralela.scaling._measure",
    "analyse": "paralela.scaling._analysis",
    "fit_amdahl": "paralela.scaling._fit",
    "fit_gustafson": "paralela.scaling._fit",
    **dict.fromkeys(
        (
            "load_scaling",
            "amdahl_speedup",
            "gustafson_speedup",
            "ScalingResult",
            "ScalingPoint",
            "Fit",
            "Prediction",
            "Caveat",
            "RunRecord",
            "ScalingError",
        ),
        "paralela.scaling._model",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paralela.scaling' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
