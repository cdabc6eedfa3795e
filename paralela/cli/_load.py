"""Loading the function a command runs: ``MODULE:FUNC`` or ``path/to/file.py:FUNC``.

::

    "features:extract" ──> cwd first on sys.path (like python -m) ──> import features
    "src/feat.py:extract" ──> src/ first on sys.path ──> import feat (workers import it
                              by the same name, from the sys.path they receive)
        ──> getattr, one dotted part at a time ──> a callable, or exit 2 saying what to do

Used by ``paralela map``, ``paralela sweep`` and ``paralela scale``, and by the trial
processes of a sweep (``paralela.sweeping._function_trial``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paralela.cli._errors import EXIT_USAGE, fail, tail

__all__ = ["load_function"]


def _put_first_on_path(directory: str) -> None:
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)


def _import_module(name: str, shown: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            fail(
                f"No module named {missing!r} in the current directory ({os.getcwd()}) "
                "or on the Python path. Run paralela from the directory that holds it, "
                "or name the file: path/to/file.py:func.",
                EXIT_USAGE,
            )
        fail(
            f"Importing {shown} failed: {exc}. Install the missing package in this environment.",
            EXIT_USAGE,
            tail(_format_exception(exc)),
        )
    except (Exception, SystemExit) as exc:
        fail(
            f"Importing {shown} failed: {type(exc).__name__}: {exc}",
            EXIT_USAGE,
            tail(_format_exception(exc)),
        )


def _format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _module_from_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        fail(f"No such file: {path_text}. Give MODULE:FUNC or path/to/file.py:FUNC.", EXIT_USAGE)
    if path.suffix != ".py" or not path.stem.isidentifier():
        fail(
            f"{path_text} cannot be imported: a module file must be named like "
            "name.py, with a Python identifier as its name.",
            EXIT_USAGE,
        )
    # Like `python path/to/file.py`: the file's directory goes first on sys.path, and
    # the workers (which receive this sys.path) import it by the same name.
    _put_first_on_path(str(path.parent.resolve()))
    module = _import_module(path.stem, path_text)
    found = Path(getattr(module, "__file__", None) or "")
    if found.resolve() != path.resolve():
        fail(
            f"{path_text} cannot be imported as {path.stem!r}: a module of that name is "
            f"already imported from {found}. Rename the file.",
            EXIT_USAGE,
        )
    return module


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``MODULE:FUNC`` or ``path/to/file.py:FUNC`` (``FUNC`` may be dotted).

    The current directory is put first on ``sys.path``, as ``python -m`` does. Every
    problem exits with code 2 and a message saying what to do.
    """
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        fail(
            f"Expected MODULE:FUNC, got {spec!r}; e.g. features:extract (features.py in "
            "the current directory), mypkg.features:extract, or path/to/file.py:extract.",
            EXIT_USAGE,
        )
    _put_first_on_path(os.getcwd())
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        module = _module_from_file(module_part)
    else:
        module = _import_module(module_part, repr(module_part))
    target: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            owner = ".".join([module_part, *attr.split(".")[:i]])
            fail(
                f"{owner} has no attribute {part!r}. {_functions_in(module) if i == 0 else ''}",
                EXIT_USAGE,
            )
    if not callable(target):
        fail(
            f"{spec} is not a function (it is of type {type(target).__name__}); name a "
            "function that takes one item.",
            EXIT_USAGE,
        )
    return target  # type: ignore[no-any-return]


def _functions_in(module: Any) -> str:
    names = sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and value.__module__ == module.__name__
    )
    return f"Functions defined there: {', '.join(names)}." if names else ""
