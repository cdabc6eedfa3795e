"""Fingerprints of functions and inputs, so a run directory is never reused by mistake.

Inputs are fingerprinted by their pickled bytes, chunk by chunk. A function is
fingerprinted by what it depends on, found by following the global names its code reads::

    fingerprint_function(job.f) ─▶ Fingerprint: one digest (what the run store compares)
      │                            + .dependencies, name ─▶ "kind:digest" (what it records,
      │                              to say which dependency changed)
      ├─ job.f                code   its compiled code (constants and nested functions
      │                              and lambdas, not line numbers), defaults, captured values
      └─ each global name job.f's code reads (nested code included), in job.f's module:
           ├─ a constant      value  job.OFFSET: its pickle (sets in sorted order)
           ├─ user code       code   mathhelp.scale, whose own globals are followed in turn
           │                  class  mathhelp.Model: attributes, and methods as code
           ├─ a user module   -      import mathhelp; mathhelp.NAME for each name the code uses
           └─ library code    ref    np, json.dumps: by the name it refers to, not followed

"User code" is any file outside the standard library, site-packages / dist-packages
and the interpreter's install paths, and not paralela; code with no file (``<stdin>``,
``python -c``, a notebook cell) counts as the user's too. Each object is visited once,
so recursion and import cycles end. A value whose pickle is larger than
:data:`VALUE_LIMIT` counts by its type (and shape): hashing a model or a large array on
every call would cost more than the check is worth. Nothing here raises: what cannot be
read counts by its type.

What cannot be seen (so editing it does not change the fingerprint): files the function
reads (data, configuration, model weights), environment variables, the versions of
installed packages, objects reached only through its arguments (their classes are not
followed), names looked up at run time (``getattr(module, name)``, ``importlib``), and
the content of values over :data:`VALUE_LIMIT`. For these, and to resume after a change
that cannot alter results, ``map(..., fingerprint=KEY)`` replaces the computed digest
with the user's own key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import site
import sys
import sysconfig
import types
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from paralela.backends import dumps

__all__ = [
    "VALUE_LIMIT",
    "Fingerprint",
    "describe_changes",
    "digest_bytes",
    "digest_items",
    "fingerprint_function",
    "fingerprint_object",
    "is_user_file",
]

#: Values whose pickle is larger count by their type: hashing 1 MiB takes about 1 ms.
VALUE_LIMIT = 1 << 20
# Containers longer than this, or nested deeper, are pickled whole instead of walked
# element by element (walking in Python costs about 1 µs an element).
_WALK_LENGTH = 256
_WALK_DEPTH = 16
# Class attributes that say nothing about what the class computes.
_CLASS_NOISE = {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"}


def digest_bytes(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def digest_items(items: Sequence[Any]) -> str:
    """Digest of a chunk's input items (the same for a list, tuple or range of them)."""
    return digest_bytes(dumps(items if isinstance(items, list) else list(items)))


def fingerprint_object(obj: Any) -> str:
    """Digest of any picklable object (shared data, initializer arguments)."""
    return digest_bytes(dumps(obj))


class Fingerprint(str):
    """A function's digest (a ``str``: what a run directory's identity compares) that
    also carries what it was made from: ``dependencies``, a name such as
    ``"mathhelp.scale"`` mapped to ``"kind:digest"`` (kinds: code, class, value, ref)."""

    dependencies: dict[str, str]

    def __new__(cls, digest: str, dependencies: dict[str, str]) -> Fingerprint:
        self = super().__new__(cls, digest)
        self.dependencies = dependencies
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Fingerprint, (str(self), self.dependencies))


def fingerprint_function(fn: Any) -> str:
    """Digest of a callable and of what it depends on (see the module docstring): a
    :class:`Fingerprint` (typed ``str`` so that identities stay ``dict[str, str]``).

    A ``functools.partial`` counts by its function and arguments, a bound method by its
    function and its object, a callable object by its class and its state. Never raises.
    """
    walk = _Walk()
    try:
        walk.top(fn)
        walk.follow_globals()
    except Exception:  # a broken object: its type is all that can count
        walk.dependencies["<unreadable>"] = f"ref:{_name_of(type(fn))}"
    dependencies = dict(sorted(walk.dependencies.items()))
    return Fingerprint(digest_bytes(json.dumps(dependencies).encode()), dependencies)


# -- what is the user's code -----------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # paralela
    bases = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars=bases)):
        roots.update(paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:  # an old virtualenv's site module lacks these
        pass
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots if root)


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Whether code from ``filename`` is the user's (followed) rather than a library's."""
    if not filename:
        return False
    if filename.startswith("<"):  # <stdin>, <string>, a notebook cell; not <frozen os>
        return not filename.startswith("<frozen")
    path = os.path.realpath(filename)
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not path.startswith(_library_roots())


def _is_user_module(module: types.ModuleType) -> bool:
    namespace = vars(module)
    filename = namespace.get("__file__")
    if isinstance(filename, str):
        return is_user_file(filename)
    paths = namespace.get("__path__")  # a namespace package
    if paths is not None:
        return any(isinstance(p, str) and is_user_file(os.path.join(p, "")) for p in paths)
    return namespace.get("__name__") == "__main__"  # python -c, a REPL


def _is_user_class(cls: type) -> bool:
    module = sys.modules.get(cls.__module__) if isinstance(cls.__module__, str) else None
    if module is not None and (
        "__file__" in vars(module) or "__path__" in vars(module) or cls.__module__ == "__main__"
    ):
        return _is_user_module(module)
    for value in vars(cls).values():  # a class made by exec: where its methods come from
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType):
            return is_user_file(code.co_filename)
    return False


def _name_of(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(qualname, str):
        qualname = type(obj).__qualname__
    return f"{module}.{qualname}" if isinstance(module, str) else qualname


# -- code ------------------------------------------------------------------------------


def _const_repr(const: Any) -> str:
    """A code constant, the same in every process: frozensets (``x in {"a", "b"}``) in
    sorted order, since their order follows the per-process string hash seed."""
    if isinstance(const, types.CodeType):
        return _code_digest(const)
    if isinstance(const, frozenset):
        return "frozenset({" + ", ".join(sorted(_const_repr(c) for c in const)) + "})"
    if isinstance(const, tuple):
        return "(" + ", ".join(_const_repr(c) for c in const) + ")"
    return repr(const)


@functools.lru_cache(maxsize=4096)
def _code_digest(code: types.CodeType) -> str:
    """Compiled code, nested functions included, line numbers and file name excluded."""
    h = hashlib.blake2b(code.co_code, digest_size=16)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        h.update(_const_repr(const).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=4096)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The names a code object and the code nested in it look up: globals, and the
    attribute names (``mathhelp.scale``: ``scale``) used to follow user modules."""
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_names(const)))
    return tuple(names)


# -- values ----------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


class _HashingWriter:
    """A file for ``pickle`` that hashes what it is given and stops past a limit, so a
    1 GB value costs little more than a 1 MiB one."""

    def __init__(self, limit: int) -> None:
        self.hash = hashlib.blake2b(digest_size=16)
        self.left = limit

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.left -= size
        if self.left < 0:
            raise _TooLarge
        self.hash.update(data)
        return size


def _large(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"large {_name_of(type(value))}" + (f" {shape}" if isinstance(shape, tuple) else "")


class _BoundedPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Arrays and tensors, also inside objects: a strided one is copied whole before
        # the writer could stop it.
        nbytes = getattr(obj, "nbytes", None)
        if isinstance(nbytes, int) and nbytes > VALUE_LIMIT:
            raise _TooLarge
        return NotImplemented


def _pickle_digest(value: Any) -> str:
    writer = _HashingWriter(VALUE_LIMIT)
    try:
        _BoundedPickler(writer, protocol=5).dump(value)
    except _TooLarge:
        return _large(value)
    except Exception:  # a lock, a connection, a lambda inside
        return f"unpicklable {_name_of(type(value))}"
    return writer.hash.hexdigest()


def _wrapped(obj: Any) -> Any:
    try:
        return vars(obj).get("__wrapped__") if hasattr(obj, "__dict__") else None
    except Exception:
        return None


class _Walk:
    """One fingerprinting: the dependencies found so far, and what was visited."""

    def __init__(self) -> None:
        self.dependencies: dict[str, str] = {}
        self._keys: dict[int, str] = {}  # id(object) -> its dependency name
        self._alive: list[Any] = []  # keeps ids unique while the walk lasts
        self._attributes: set[tuple[int, str]] = set()  # (module, name) followed
        # User functions whose globals are still to be followed: a queue, not recursion,
        # so a long chain of helpers cannot reach the recursion limit.
        self._queue: deque[tuple[types.CodeType, dict[str, Any]]] = deque()

    def _claim(self, obj: Any, name: str) -> tuple[str, bool]:
        """The dependency name of ``obj``, and whether it is new (to be walked)."""
        key = self._keys.get(id(obj))
        if key is not None:
            return key, False
        key, n = name, 1
        while key in self.dependencies:  # two lambdas of one module
            n += 1
            key = f"{name}#{n}"
        self._keys[id(obj)] = key
        self._alive.append(obj)
        self.dependencies[key] = "pending"
        return key, True

    def top(self, fn: Any) -> None:
        """``fn``, the callable that ``map`` calls: always digested, even library code."""
        if isinstance(fn, functools.partial):
            self.top(fn.func)
            key = f"partial({_name_of(fn.func)}).args"
            self.dependencies[key] = "value:" + self.value((fn.args, fn.keywords))
        elif isinstance(fn, types.MethodType):
            self.top(fn.__func__)
            self.dependencies[f"{_name_of(fn.__func__)}.__self__"] = "value:" + self.value(
                fn.__self__
            )
        elif isinstance(fn, types.FunctionType):
            user = is_user_file(fn.__code__.co_filename)
            self.function(fn, follow=user)
            if not user and _wrapped(fn) is not None:  # a library decorator's wrapper
                self.reference(_wrapped(fn))
        elif isinstance(fn, type):
            self._class_entry(fn)
        elif _wrapped(fn) is not None:  # functools.lru_cache, functools.wraps
            self.top(_wrapped(fn))
        elif hasattr(fn, "__qualname__"):  # a builtin function
            self.dependencies[_name_of(fn)] = "ref:" + _name_of(fn)
        else:  # a callable object: its class (methods included) and its state
            cls = self._class_entry(type(fn))
            self.dependencies[f"{cls} instance"] = "value:" + self.value(fn)

    def _class_entry(self, cls: type) -> str:
        """A class as a dependency: walked if the user's, else by its name."""
        key = self.reference(cls) or _name_of(cls)
        if key not in self.dependencies:
            self.dependencies[key] = "ref:" + key
        return key

    def function(self, fn: types.FunctionType, follow: bool = True) -> str:
        key, new = self._claim(fn, _name_of(fn))
        if not new:
            return key
        h = hashlib.blake2b(_code_digest(fn.__code__).encode(), digest_size=16)
        h.update(self.value(fn.__defaults__).encode())
        h.update(self.value(fn.__kwdefaults__).encode())
        for cell in fn.__closure__ or ():
            try:
                h.update(self.value(cell.cell_contents).encode())
            except ValueError:  # not assigned yet
                h.update(b"<empty>")
        self.dependencies[key] = "code:" + h.hexdigest()
        if follow:
            self._queue.append((fn.__code__, fn.__globals__))
        return key

    def cls(self, cls: type) -> str:
        key, new = self._claim(cls, _name_of(cls))
        if not new:
            return key
        h = hashlib.blake2b(digest_size=16)
        for base in cls.__bases__:
            h.update(f"base={self.reference(base)}\n".encode())
        for attr, value in list(vars(cls).items()):
            if attr in _CLASS_NOISE:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = (value.fget, value.fset, value.fdel)
            if attr.startswith("__") and attr.endswith("__") and not callable(value):
                continue  # __annotations__, __slots__, __dataclass_fields__, ...
            h.update(f"{attr}={self.value(value)}\n".encode())
        self.dependencies[key] = "class:" + h.hexdigest()
        return key

    def follow_globals(self) -> None:
        while self._queue:
            self.globals(*self._queue.popleft())

    def globals(self, code: types.CodeType, namespace: dict[str, Any]) -> None:
        names = _global_names(code)
        module = namespace.get("__name__", "?")
        for name in names:
            if name in namespace:
                self.binding(namespace[name], f"{module}.{name}", names)

    def binding(self, value: Any, name: str, names: tuple[str, ...]) -> None:
        """A global name bound to ``value``, read by code that uses ``names``."""
        try:
            if isinstance(value, types.ModuleType):
                if not _is_user_module(value):
                    self.dependencies[name] = f"ref:{value.__name__}"
                    return
                namespace = vars(value)
                for attr in names:  # the module's names that the code may use
                    if attr in namespace and (id(value), attr) not in self._attributes:
                        self._attributes.add((id(value), attr))
                        self._alive.append(value)
                        self.binding(namespace[attr], f"{value.__name__}.{attr}", names)
                return
            reference = self.reference(value)
            if reference is not None:
                if reference not in self.dependencies:  # library code: what it names
                    self.dependencies[name] = "ref:" + reference
                return
            self.dependencies[name] = "value:" + self.value(value)
        except Exception:
            self.dependencies[name] = f"ref:unreadable {_name_of(type(value))}"

    def reference(self, obj: Any, hops: int = 0) -> str | None:
        """The name of a function or class, walked first if it is the user's; ``None``
        for anything else (a value)."""
        if isinstance(obj, types.FunctionType):
            if is_user_file(obj.__code__.co_filename):
                return self.function(obj)
            inner = _wrapped(obj)  # a library decorator around the user's function
            if inner is not None and hops < 8:
                return self.reference(inner, hops + 1) or _name_of(obj)
            return _name_of(obj)
        if isinstance(obj, type):
            return self.cls(obj) if _is_user_class(obj) else _name_of(obj)
        if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType)):
            return _name_of(obj)
        inner = _wrapped(obj)  # functools.lru_cache and other wrapper objects
        if inner is not None and inner is not obj and hops < 8:
            return self.reference(inner, hops + 1)
        return None

    def value(self, value: Any, depth: int = 0) -> str:
        """Digest of a value; functions and classes in it by name, walked if the user's."""
        try:
            return digest_bytes(self._value_text(value, depth).encode())
        except Exception:
            return f"unreadable {_name_of(type(value))}"

    def _value_text(self, value: Any, depth: int) -> str:
        kind = _name_of(type(value))
        if value is None or isinstance(value, (bool, int, float, complex)):
            return f"{kind}:{value!r}"
        if isinstance(value, (str, bytes, bytearray)):
            if len(value) > VALUE_LIMIT:
                return f"large {kind} of {len(value)}"
            return f"{kind}:{value!r}"
        if isinstance(value, functools.partial):
            return f"partial:{self.value(value.func)}:{self.value((value.args, value.keywords))}"
        if isinstance(value, types.MethodType):
            return f"method:{self.value(value.__func__)}:{self.value(value.__self__)}"
        reference = self.reference(value)
        if reference is not None:
            return f"ref:{reference}"
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            if len(value) <= _WALK_LENGTH and depth < _WALK_DEPTH:
                if isinstance(value, dict):
                    parts = [
                        f"{self.value(k, depth + 1)}={self.value(v, depth + 1)}"
                        for k, v in value.items()
                    ]
                else:
                    parts = [self.value(v, depth + 1) for v in value]
                if isinstance(value, (set, frozenset)):
                    parts.sort()
                return f"{kind}[{','.join(parts)}]"
            if isinstance(value, (set, frozenset)):
                with contextlib.suppress(TypeError):  # mixed types: in their own order
                    value = sorted(value)
        if _is_user_class(type(value)):
            self.cls(type(value))
        return f"{kind}:{_pickle_digest(value)}"


# -- saying what changed ---------------------------------------------------------------

_MAX_NAMED = 8


def describe_changes(old: Mapping[str, Any], new: Mapping[str, str]) -> str:
    """``"mathhelp.SCALE (value), mathhelp.scale (code)"``: the dependencies that differ
    between two fingerprints' ``dependencies``, with what kind each is."""
    changed = [k for k in new if k in old and old[k] != new[k]]
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    parts = []
    if changed:
        parts.append(_listed(f"{k} ({_change(str(old[k]), new[k])})" for k in changed))
    if added:
        parts.append("now also used: " + _listed(f"{k} ({_kind(new[k])})" for k in added))
    if removed:
        parts.append("no longer used: " + _listed(f"{k} ({_kind(str(old[k]))})" for k in removed))
    return "; ".join(parts)


def _kind(entry: str) -> str:
    return entry.partition(":")[0]


def _change(old: str, new: str) -> str:
    if _kind(old) == _kind(new) == "ref":
        return f"was {old[4:]}, now {new[4:]}"
    return _kind(new) if _kind(old) == _kind(new) else f"{_kind(old)}, now {_kind(new)}"


def _listed(names: Any) -> str:
    names = list(names)
    more = len(names) - _MAX_NAMED
    return ", ".join(names[:_MAX_NAMED]) + (f" and {more} more" if more > 0 else "")
