"""A pipeline's ``cache()``: the elements of the stages above it, kept in memory or in a
file, with what says whether they are still those stages' elements over that source.

::

    cache(path) at each run ──> path exists?
      no  ─> run the stages above; each element is pickled to a temp file, renamed to
             `path` when the pass completes (removed if the run stops first):
               MAGIC line | header {identity, names, dependencies, python, paralela} | elements
      yes ─> starts with MAGIC?   no ─> ConfigError: not paralela's file, neither read nor
                                        replaced
             header's identity == this pipeline's?  yes ─> read its elements
                                                     no  ─> FingerprintMismatchError naming
                                                            what changed (delete to rebuild)
    cache() in memory: a store of its own step, kept with the digest of the source's
             elements; a source that changed (a list that grew) fills it anew

The identity of a file cache is map's fingerprinting (``paralela.runs``), step by step:
each step's functions by :func:`fingerprint_function` (code, what it reads, captured
values), its parameters by value, and the source by its elements: a list or tuple by
their pickle, a ``range`` by its bounds, files by path, size and modification time, a
generator by its code and arguments. Another iterator cannot be identified before it
runs: ``cache(path, fingerprint=KEY)`` names the cache with the user's key instead.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import pickle
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from paralela.data._parallel import _END, Stage
from paralela.data._stats import StageStats
from paralela.errors import ConfigError, FingerprintMismatchError
from paralela.runs import (
    describe_changes,
    digest_bytes,
    digest_items,
    fingerprint_function,
)

if TYPE_CHECKING:
    from paralela.data._run import _Run, _Step

__all__ = ["RUN_COLLATE", "Cache", "SourceId", "file_identity", "source_digest"]

MAGIC = b"paralela.data cache 1\n"
_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: Stands for the run's collate in a ``batch()`` step's identity (a batch without a
#: collate of its own is numpy's or torch's, depending on the run).
RUN_COLLATE = "<the run's collate>"


class _Unidentifiable(Exception):
    pass


class SourceId:
    """A source's elements, as far as a cache needs to know whether they changed.

    ``kind``: ``"iterable"`` or ``"files"``. A generator is identified once, before it
    runs (its arguments are gone afterwards), and keeps that identity.
    """

    def __init__(self, kind: str, value: Any) -> None:
        self.kind = kind
        self.value = value
        self._once: str | None = None

    def digest(self, persistent: bool) -> str:
        """For a cache file (``persistent``): the elements' digest, the same in every
        program run. In memory: cheap, and the same while the elements are the same objects.

        Raises:
            _Unidentifiable: a file cache's iterator that is not a fresh generator, or
                elements that cannot be pickled.
        """
        value = self.value
        if self.kind == "files":
            return digest_bytes(json.dumps([_file_state(p) for p in value]).encode())
        if isinstance(value, range):
            return repr(value)
        if isinstance(value, Iterator):
            if not persistent:
                return "one-shot"  # it can only ever be this iterator: read once
            if self._once is None:
                self._once = _generator_digest(value)
            return self._once
        if isinstance(value, (list, tuple)):
            if not persistent:  # not a pickle of every element at every epoch
                return digest_bytes(repr([len(value), *map(id, value)]).encode())
            try:
                return digest_items(value)
            except Exception as exc:
                raise _Unidentifiable(f"its elements cannot be pickled ({exc})") from None
        if not persistent:
            return f"object {id(value)}"
        try:
            return digest_items([value])
        except Exception as exc:
            raise _Unidentifiable(f"it cannot be pickled ({exc})") from None


def _file_state(path: str) -> list[Any]:
    try:
        info = os.stat(path)
    except OSError:
        return [path, "missing"]
    return [path, info.st_size, info.st_mtime_ns]


def _generator_digest(generator: Any) -> str:
    if not isinstance(generator, types.GeneratorType):
        raise _Unidentifiable(f"a {type(generator).__name__} cannot be read before it runs")
    frame, code = generator.gi_frame, generator.gi_code
    if frame is None or inspect.getgeneratorstate(generator) != inspect.GEN_CREATED:
        raise _Unidentifiable("a generator that already started")
    arguments = dict(frame.f_locals)  # before the first next(): its arguments
    cells = tuple(types.CellType(arguments.get(name)) for name in code.co_freevars)
    function = types.FunctionType(code, frame.f_globals, code.co_name, None, cells)
    return str(fingerprint_function(functools.partial(function, **arguments)))


def source_digest(steps: Sequence[_Step]) -> str:
    """An in-memory cache's check: the source's elements are the same objects."""
    parts = [p.digest(False) for p in steps[0].identity if isinstance(p, SourceId)]
    return "|".join(parts)


def file_identity(steps: Sequence[_Step], run: _Run, key: str | None) -> dict[str, Any]:
    """What a cache file records of the steps above it: ``identity`` (step key to digest,
    what is compared), their ``names`` and functions' ``dependencies`` (to say what
    changed). ``key``: the user's ``fingerprint=``, in place of all of it.

    Raises:
        ConfigError: the source cannot be identified and no key was given.
    """
    if key is not None:
        return {"identity": {"fingerprint": key}, "names": {}, "dependencies": {}}
    identity: dict[str, str] = {}
    names: dict[str, str] = {}
    dependencies: dict[str, dict[str, str]] = {}
    for index, step in enumerate(steps):
        name = f"step {index}"
        parts: list[str] = []
        found: dict[str, str] = {}
        for part in step.identity:
            if isinstance(part, SourceId):
                try:
                    parts.append(part.digest(True))
                except _Unidentifiable as why:
                    raise ConfigError(
                        f"cache(path) cannot tell whether the source {step.name} changed "
                        f"since the cache file was written: {why}. Use a list, a range, "
                        "files or a generator function's call as the source, or name the "
                        "cache yourself with cache(path, fingerprint=KEY) (change KEY when "
                        "the source or the stages change)."
                    ) from None
                continue
            if part is RUN_COLLATE:
                part = run.collate
            if callable(part):
                fingerprint = fingerprint_function(part)
                parts.append(str(fingerprint))
                found.update(getattr(fingerprint, "dependencies", {}))
            else:
                parts.append(repr(part))
        identity[name] = digest_bytes(json.dumps([step.name, parts]).encode())
        names[name] = step.name
        dependencies[name] = found
    return {"identity": identity, "names": names, "dependencies": dependencies}


def _mismatch(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    """What differs between the identity a cache file recorded and this pipeline's."""
    old, new = theirs.get("identity", {}), ours["identity"]
    if "fingerprint" in old or "fingerprint" in new:
        was, now = old.get("fingerprint"), new.get("fingerprint")
        return f"fingerprint={was!r}, now {now!r}" if was and now else "a fingerprint= key"
    old_names, new_names = theirs.get("names", {}), ours["names"]
    old_deps = theirs.get("dependencies", {})
    found = []
    for key in sorted(set(old) | set(new), key=lambda k: int(k.split()[-1])):
        if old.get(key) == new.get(key):
            continue
        was, now = old_names.get(key, "?"), new_names.get(key, "?")
        if key not in old:
            found.append(f"{key} {now} is new")
        elif key not in new:
            found.append(f"{key} {was} is gone")
        elif was != now:
            found.append(f"{key} was {was}, now {now}")
        elif key == "step 0":
            found.append(f"the source {now}: its elements (or files) differ")
        else:
            changes = describe_changes(old_deps.get(key, {}), ours["dependencies"][key])
            found.append(f"{key} {now}: {changes or 'its parameters'}")
    text = "; ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    python = theirs.get("python")
    if isinstance(python, str) and python != _PYTHON:
        text += f" (it was made with Python {python}, this is {_PYTHON}: compiled code differs)"
    return text


def _open(path: Path, ours: dict[str, Any]) -> BinaryIO:
    """``path`` opened after its header: the elements follow.

    Raises:
        ConfigError: not a cache file that paralela wrote.
        FingerprintMismatchError: a cache of other stages or another source.
    """
    f = open(path, "rb")  # noqa: SIM115  (handed to the reader, which closes it)
    try:
        header: Any = None
        if f.read(len(MAGIC)) == MAGIC:
            with contextlib.suppress(Exception):
                header = pickle.load(f)
        if not isinstance(header, dict) or not isinstance(header.get("identity"), dict):
            raise ConfigError(
                f"{path} is not a cache file that paralela wrote (or one from a paralela "
                "that did not record what made it): paralela neither reads nor replaces "
                "it. Pass cache() another path, or delete the file if it is a cache."
            )
        if header["identity"] != ours["identity"]:
            raise FingerprintMismatchError(
                f"The cache file {path} holds the elements of other stages or another "
                f"source: {_mismatch(header, ours)}. Its elements would be stale. "
                "Delete it to rebuild the cache (the next complete run writes it), or "
                "pass cache() another path."
            )
    except BaseException:
        f.close()
        raise
    return f


def _elements(f: BinaryIO) -> Iterator[Any]:
    with f:
        while True:
            try:
                yield pickle.load(f)
            except EOFError:
                return


class Cache(Stage):
    """The first complete run's elements, kept (in memory, or pickled in a file at
    ``path``); later runs read them instead of running the stages above.

    A run stopped early keeps nothing: only a complete run is cached (the file is written
    through :func:`paralela._files.replacing`: renamed into place at the end, removed if
    the run stops first).

    Args:
        store: an in-memory cache's own dict (``elements``, ``source``).
        identity: a file cache's (see :func:`file_identity`); the source's digest for
            a cache in memory.
    """

    def __init__(
        self,
        stats: StageStats,
        build: Callable[[], Stage],
        store: dict[str, Any],
        path: str | None,
        identity: Any,
    ) -> None:
        self.store = store
        self.path = Path(path) if path else None
        self.identity = identity
        self.elements: Iterator[Any] | None = None
        self.kept: list[Any] | None = None
        self.writing: contextlib.ExitStack | None = None
        self.file: Any = None
        if self.path is not None and os.path.lexists(self.path):
            self.elements = _elements(_open(self.path, identity))
            super().__init__(None, stats)
        elif self.path is None and "elements" in store and store.get("source") == identity:
            self.elements = iter(store["elements"])
            super().__init__(None, stats)
        else:
            super().__init__(build(), stats)
            if self.path is None:
                self.kept = []
            else:
                from paralela._files import replacing
                from paralela._version import __version__

                self.writing = contextlib.ExitStack()
                self.file = self.writing.enter_context(replacing(self.path))
                header = {
                    **identity,
                    "python": _PYTHON,
                    "paralela": __version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                self.file.write(MAGIC)
                pickle.dump(header, self.file, protocol=pickle.HIGHEST_PROTOCOL)

    def __next__(self) -> Any:
        if self.elements is not None:
            element = next(self.elements)
            self.stats.elements += 1
            return element
        element = self.pull()
        if element is _END:
            self._complete()
            raise StopIteration
        if self.kept is not None:
            self.kept.append(element)
        elif self.file is not None:
            pickle.dump(element, self.file, protocol=pickle.HIGHEST_PROTOCOL)
        self.stats.elements += 1
        return element

    def _complete(self) -> None:
        if self.kept is not None:
            self.store["elements"], self.kept = self.kept, None
            self.store["source"] = self.identity
        elif self.writing is not None:
            writing, self.writing, self.file = self.writing, None, None
            writing.close()  # synced and renamed into place

    def close(self) -> None:
        if self.writing is not None:  # stopped early: the partial file is removed
            writing, self.writing, self.file = self.writing, None, None
            with contextlib.suppress(_Stopped):
                writing.__exit__(_Stopped, _Stopped(), None)
        close = getattr(self.elements, "close", None)
        if callable(close):  # a file being read: closed now
            close()
        super().close()


class _Stopped(Exception):
    """Ends a cache's write when its run stops early, so that nothing is kept."""
