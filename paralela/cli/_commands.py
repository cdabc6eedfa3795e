"""Every sub-command, registered on the app: importing this module registers them."""

from __future__ import annotations

from paralela.cli import _demo, _info, _launch, _map, _mapreduce, _report, _scale, _stage, _sweep  # noqa: F401  (each registers a command)

from paralela.cli import _compare, _predict, _serve  # noqa: F401  # isort: skip
from paralela.cli._app import app

__all__ = ["app"]
