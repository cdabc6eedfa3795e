"""Run by Python at start-up in every process of a ``paralela launch`` rank.

In the rank itself (the pid the bootstrap wrote to ``PARALELA_RANK_PID``; not in the
processes the rank starts), wrap torch's ``init_process_group`` so that the rank writes
``entered`` and then ``joined`` to ``PARALELA_JOIN_FILE``: the launcher watches those
files to see a rank that leaves or stalls while the others wait for it. When the master
is this host's loopback (local launches), rank 0's torch store listens on 127.0.0.1
only, not on every interface as torch's default does. Nothing is imported until the
program imports ``torch.distributed``. Any other ``sitecustomize`` on the path still runs.
"""

from __future__ import annotations

# Only what Python has already loaded at start-up: this runs in every process of a rank.
import importlib.machinery
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

_C10D = "torch.distributed.distributed_c10d"
_HERE = os.path.dirname(os.path.abspath(__file__))
_LOOPBACK = ("127.0.0.1", "localhost")
_listeners: list[Any] = []  # kept open for as long as the store serves
_early: dict[int, Any] = {}  # rank 0's store port, listened on at start-up


def _say(state: str) -> None:
    path = os.environ.get("PARALELA_JOIN_FILE")
    if path:
        try:
            with open(path, "w") as fh:
                fh.write(state)
        except OSError:  # the launcher is gone or the log directory too: nothing to tell
            pass


def _wrap(module: ModuleType) -> None:
    import functools  # torch has loaded it by now

    original = module.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _say("entered")
        result = original(*args, **kwargs)
        _say("joined")
        return result

    setattr(module, "init_process_group", init_process_group)  # noqa: B010
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is not None and os.environ.get("MASTER_ADDR") in _LOOPBACK:
        setattr(rendezvous, "_create_c10d_store", _on_loopback(create))  # noqa: B010


def _on_loopback(create: Any) -> Any:
    """torch's store factory, but rank 0's server listens on 127.0.0.1 only.

    torch's TCPStore binds every interface; given a socket that already listens, it
    serves on that one instead (``master_listen_fd``).
    """
    import functools

    @functools.wraps(create)
    def create_store(
        hostname: str, port: int, rank: int, world_size: int, timeout: Any, *args: Any, **kw: Any
    ) -> Any:
        if rank != 0 or hostname not in _LOOPBACK:
            return create(hostname, port, rank, world_size, timeout, *args, **kw)
        listener = _early.pop(port, None) or _listen(port, world_size)
        if listener is None:  # torch's own attempt says why, in its words
            return create(hostname, port, rank, world_size, timeout, *args, **kw)
        from torch._C._distributed_c10d import TCPStore

        _listeners.append(listener)
        return TCPStore(
            host_name=hostname,
            port=port,
            world_size=world_size,
            is_master=True,
            timeout=timeout,
            multi_tenant=True,
            master_listen_fd=listener.fileno(),
            **({"use_libuv": args[0]} if args else kw),
        )

    return create_store


def _listen(port: int, backlog: int) -> Any:
    """A socket listening on 127.0.0.1:``port``, or None when the port cannot be had."""
    import _socket  # socket.py's C core: loaded in well under a millisecond

    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(max(128, backlog))
    except OSError:
        listener.close()
        return None
    return listener


def _listen_early() -> None:
    """Rank 0 of a local launch listens on the store's port from its first instant.

    Without it, a rank that reaches ``init_process_group`` before rank 0 has imported torch
    finds no listener, and torch's client backs off for up to a second before it tries
    again (paralela's start-up to the first all-reduce went from 1.1 s to 1.7 s in a third
    of the runs of bench/bench_launch.py). The kernel queues an early connection on this
    socket until rank 0's store takes it over; a program that never makes a store just
    keeps an idle socket on loopback.
    """
    port = os.environ.get("MASTER_PORT", "")
    if os.environ.get("RANK") != "0" or os.environ.get("MASTER_ADDR") not in _LOOPBACK:
        return
    if not port.isdigit():
        return
    world = os.environ.get("WORLD_SIZE", "")
    listener = _listen(int(port), int(world) if world.isdigit() else 1)
    if listener is not None:
        _early[int(port)] = listener


class _Finder:
    """Finds torch's c10d module as usual, then wraps it right after it ran."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _C10D:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _wrap(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides, if there is one further on the path."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("PARALELA_RANK_PID") == str(os.getpid()) and _C10D not in sys.modules:
    _listen_early()
    sys.meta_path.insert(0, _Finder())
_chain()
