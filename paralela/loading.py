"""Loading what a ``module:Name`` string names: the one resolver behind the CLI's
``MODULE:FUNC`` arguments, ``paralela.scale``'s ``"module:function"`` targets and
``paralela.compare``'s estimators (``"sklearn.svm:SVC"``).

::

    "features:extract" ──> cwd first on sys.path (like python -m) ──> import features
    "src/feat.py:extract" ──> src/ first on sys.path ──> import feat (workers import it
                              by the same name, from the sys.path they receive)
    "sklearn.svm.SVC" (dotted=True) ──> import sklearn.svm
        ──> getattr, one dotted part at a time ──> the object, or ConfigError

Contract: every problem raises :class:`~paralela.errors.ConfigError` saying what is
wrong and what to do (the CLI exits with code 2 and prints it). Where importing the
module raised, that exception is the error's ``__cause__`` (the CLI shows the tail of
its traceback); a module that does not exist has none. Imports nothing of paralela but
``paralela.errors``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from paralela.errors import ConfigError, did_you_mean

__all__ = ["load_function", "load_object"]


def load_object(spec: str, *, who: str = "", dotted: bool = False, search_cwd: bool = True) -> Any:
    """Import ``MODULE:NAME`` or ``path/to/file.py:NAME`` (``NAME`` may be dotted) and
    return the object it names.

    ``who`` starts every message (``"Family 'svm': "``); ``dotted`` also takes
    ``module.NAME`` without a colon; ``search_cwd`` puts the current directory first on
    ``sys.path``, as ``python -m`` does.

    Raises:
        ConfigError: the spec is malformed, the module or file cannot be imported, or
            it has no such name.
    """
    return _load(spec, who, dotted, search_cwd, "NAME")


def load_function(
    spec: str, *, who: str = "", kind: Literal["function", "class"] = "function"
) -> Callable[..., Any]:
    """:func:`load_object` for ``MODULE:FUNC`` (the current directory first on
    ``sys.path``), which must name something callable.

    ``kind="class"`` is for ``MODULE:CLASS`` (a model class): the messages then say
    CLASS, and a name the module lacks is answered with the classes it defines (else
    with its functions), and the closest name.

    Raises:
        ConfigError: as :func:`load_object`, or the name is not callable.
    """
    target = _load(spec, who, False, True, "CLASS" if kind == "class" else "FUNC")
    if not callable(target):
        raise ConfigError(
            _said(
                who,
                f"{spec} is not a {kind} (it is of type {type(target).__name__}); name a {kind}.",
            )
        )
    return target  # type: ignore[no-any-return]


_EXAMPLES = {
    "FUNC": (
        "features:extract (features.py in the current directory), mypkg.features:extract, "
        "or path/to/file.py:extract"
    ),
    "NAME": "sklearn.svm:SVC, mypkg.models:Model, or path/to/file.py:Model",
    "CLASS": (
        "models:Embedder (models.py in the current directory), mypkg.models:Embedder, "
        "or path/to/file.py:Embedder"
    ),
}


def _said(who: str, text: str) -> str:
    """``text`` after ``who``, or as a sentence of its own (a first word capitalized;
    a text that starts with a name is left as it is)."""
    if who or not text[:1].islower() or text.split(" ", 1)[0] not in _WORDS:
        return who + text
    return text[:1].upper() + text[1:]


_WORDS = {"cannot", "expected", "importing", "no"}  # the first words of the messages


def _load(spec: str, who: str, dotted: bool, search_cwd: bool, kind: str) -> Any:
    module_part, sep, attr = spec.rpartition(":")
    if not sep and dotted:
        module_part, sep, attr = spec.rpartition(".")
    if not sep or not module_part or not attr:
        raise ConfigError(
            _said(who, f"expected MODULE:{kind}, got {spec!r}; e.g. {_EXAMPLES[kind]}.")
        )
    if search_cwd:
        _put_first_on_path(os.getcwd())
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        module = _module_from_file(module_part, who, kind)
    else:
        module = _import_module(module_part, repr(module_part), who, search_cwd, kind)
    target: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            owner = ".".join([module_part, *attr.split(".")[:i]])
            listing = _defined_in(module, "CLASS" if kind == "CLASS" else "FUNC") if i == 0 else ""
            hint = did_you_mean(part, [n for n in dir(target) if not n.startswith("_")])
            raise ConfigError(
                _said(who, f"{owner} has no attribute {part!r}.{listing}{hint}")
            ) from None
    return target


def _put_first_on_path(directory: str) -> None:
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)


def _import_module(name: str, shown: str, who: str, search_cwd: bool, kind: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            if search_cwd:
                where = f"in the current directory ({os.getcwd()}) or on the Python path"
                fix = (
                    "Run from the directory that holds it, or name the file: "
                    f"path/to/file.py:{kind}."
                )
            else:
                where = "on the Python path"
                fix = "Check the name, or install the package that provides it."
            raise ConfigError(
                _said(who, f"cannot import {name!r}. No module named {missing!r} {where}. {fix}")
            ) from None
        raise ConfigError(
            _said(
                who,
                f"importing {shown} failed: {exc}. Install the missing package in this "
                "environment.",
            )
        ) from exc
    except (Exception, SystemExit) as exc:
        raise ConfigError(
            _said(who, f"importing {shown} failed: {type(exc).__name__}: {exc}")
        ) from exc


def _module_from_file(path_text: str, who: str, kind: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(
            _said(who, f"no such file: {path_text}. Give MODULE:{kind} or path/to/file.py:{kind}.")
        )
    if path.suffix != ".py" or not path.stem.isidentifier():
        raise ConfigError(
            _said(
                who,
                f"{path_text} cannot be imported: a module file must be named like "
                "name.py, with a Python identifier as its name.",
            )
        )
    # Like `python path/to/file.py`: the file's directory goes first on sys.path, and
    # the workers (which receive this sys.path) import it by the same name.
    _put_first_on_path(str(path.parent.resolve()))
    module = _import_module(path.stem, path_text, who, True, kind)
    found = Path(getattr(module, "__file__", None) or "")
    if found.resolve() != path.resolve():
        raise ConfigError(
            _said(
                who,
                f"{path_text} cannot be imported as {path.stem!r}: a module of that name is "
                f"already imported from {found}. Rename the file.",
            )
        )
    return module


def _defined_in(module: Any, kind: str) -> str:
    """`` Classes defined there: A, B.`` (``kind`` CLASS) or `` Functions defined
    there: f, g.``: the public ones ``module`` defines itself (not those it imports)."""
    wanted = inspect.isclass if kind == "CLASS" else inspect.isfunction
    names = sorted(
        name
        for name, value in vars(module).items()
        if wanted(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
    )
    what = "Classes" if kind == "CLASS" else "Functions"
    return f" {what} defined there: {', '.join(names)}." if names else ""
