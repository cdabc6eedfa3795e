"""Loading the function a command runs (``MODULE:FUNC`` or ``path/to/file.py:FUNC``)
with :func:`paralela.loading.load_function`, for the command line: a problem exits
with code 2, its message, and the tail of the traceback where importing the module
raised.

Used by ``paralela map``, ``mapreduce``, ``predict``, ``sweep`` and ``scale``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, Literal

from paralela import loading
from paralela.cli._errors import EXIT_USAGE, fail, tail
from paralela.errors import ConfigError

__all__ = ["load_function"]


def load_function(spec: str, kind: Literal["function", "class"] = "function") -> Callable[..., Any]:
    """Import ``MODULE:FUNC`` or ``path/to/file.py:FUNC`` (``FUNC`` may be dotted);
    ``kind="class"`` for ``MODULE:CLASS`` (a typo lists the module's classes).

    The current directory is put first on ``sys.path``, as ``python -m`` does. Every
    problem exits with code 2 and a message saying what to do.
    """
    try:
        return loading.load_function(spec, kind=kind)
    except ConfigError as exc:
        cause = exc.__cause__
        detail = None
        if cause is not None:
            detail = tail(
                "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
            )
        fail(str(exc), EXIT_USAGE, detail)
