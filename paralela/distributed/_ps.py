"""Parameter server: server ranks hold the parameters, trainer ranks push gradients.

Ranks ``0 .. servers-1`` are servers, the others trainers; every rank builds the same
model and calls :func:`parameter_server`. The parameters are split into one shard per
server (largest tensors first, each to the server with the fewest elements so far);
a trainer talks to every server, servers never to each other::

    trainer 2 ──pull/push shard 0──▶ server 0 (shard 0 + its optimizer)
              ──pull/push shard 1──▶ server 1 (shard 1 + its optimizer)
    trainer 3 ──pull/push shard 0──▶ server 0
              ──pull/push shard 1──▶ server 1

The server side lives in :mod:`paralela.distributed._ps_server`. Transport is
``torch.distributed.rpc`` (TensorPipe), set up from ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` as ``paralela launch`` or ``torchrun`` set them.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from types import TracebackType
from typing import Any

import torch
import torch.distributed.rpc as rpc

from paralela.distributed import _ps_server as server
from paralela.distributed._ps_config import (
    Layout,
    Mode,
    OptimizerFactory,
    ParameterServerStats,
    check_layout,
    default_optimizer,
)
from paralela.errors import ConfigError, DistributedError

__all__ = ["ParameterServer", "ParameterServerStats", "parameter_server"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_ERROR_LINGER_S = 5.0  # seconds a failing server waits for the trainers to hear it


def _worker_name(rank: int) -> str:
    return f"paralela_ps_{rank}"


def _init_rpc(layout: Layout, timeout: float) -> None:
    """Join the rpc group; every rank waits up to ``timeout`` for the others."""
    if os.environ.get("MASTER_ADDR") in _LOOPBACK:
        # every rank is on this machine: TensorPipe must not pick an outside interface
        os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    options = rpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=timeout)
    try:
        with warnings.catch_warnings():
            # init_rpc's own rendezvous uses a gloo ProcessGroup the deprecated way
            # (PyTorch 2.x); nothing a user can change, so it is not shown.
            warnings.filterwarnings(
                "ignore",
                message=r"You are using a Backend .* as a ProcessGroup",
                category=UserWarning,
            )
            rpc.init_rpc(  # type: ignore[no-untyped-call]
                _worker_name(layout.rank),
                rank=layout.rank,
                world_size=layout.world_size,
                rpc_backend_options=options,
            )
    except RuntimeError as exc:
        raise DistributedError(
            f"Rank {layout.rank} could not join the parameter server's rpc group of "
            f"{layout.world_size} ranks within {timeout:g} s: {exc}. Check that every rank "
            "started with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and that none "
            "died (see their logs)."
        ) from exc


class ParameterServer:
    """One rank's handle on the parameter server; made by :func:`parameter_server`.

    On a server rank call :meth:`serve`; on a trainer rank :meth:`pull` and
    :meth:`push` every step, then :meth:`finish` (the end of the ``with`` block does
    both for you). A trainer pushes and pulls from one thread. Every blocking call
    waits at most ``timeout`` seconds for another rank, and then raises
    :class:`~paralela.errors.DistributedError`. Without a ``with`` block, call
    :meth:`close` at the end: rpc keeps threads and connections open until then.

    Attributes:
        model: the model given; on a server, the parameters of its shard are the live
            ones; on a trainer, what :meth:`pull` fills in.
        mode: ``"sync"`` or ``"async"``.
        rank, world_size: this rank, and how many ranks there are.
        servers: how many ranks are servers (ranks ``0 .. servers-1``).
        trainers: the trainer ranks.
        shards: for each server, the indices (in ``model.parameters()`` order) of
            the parameters it holds.
        timeout: see :func:`parameter_server`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: OptimizerFactory,
        layout: Layout,
        mode: Mode,
        timeout: float,
    ) -> None:
        self.model = model
        self.mode: Mode = mode
        self.rank = layout.rank
        self.world_size = layout.world_size
        self.servers = layout.servers
        self.trainers = layout.trainers
        self.timeout = float(timeout)
        self.shards = layout.shards
        self._params = list(model.parameters())
        self._names = [name for name, _ in model.named_parameters()]
        self._state: server.ServerState | None = None
        self._versions = [0] * self.servers
        self._pushes = self._pulls = 0
        self._staleness: list[int] = []
        self._finished = self._closed = False
        if self.is_server:
            mine = [self._params[i] for i in self.shards[self.rank]]
            built = optimizer(mine)
            if not isinstance(built, torch.optim.Optimizer):
                raise ConfigError(
                    "optimizer must return a torch.optim.Optimizer over the parameters it "
                    f"is given, got {type(built).__name__}."
                )
            self._state = server.ServerState(
                params=mine,
                names=[self._names[i] for i in self.shards[self.rank]],
                optimizer=built,
                mode=mode,
                trainers=self.trainers,
                timeout=self.timeout,
            )
            server.install(self._state)
        try:
            _init_rpc(layout, self.timeout)
        except BaseException:
            server.uninstall()
            raise
        if not self.is_server:
            try:
                self.pull()  # every trainer starts from the servers' parameters
            except BaseException:
                self._abort("the first pull failed")
                raise

    @property
    def is_server(self) -> bool:
        """Whether this rank is a server (ranks ``0 .. servers-1``)."""
        return self.rank < self.servers

    @property
    def stats(self) -> ParameterServerStats:
        """A snapshot of this rank's counts; see :class:`ParameterServerStats`."""
        if self._state is not None:
            with self._state.lock:
                return ParameterServerStats(
                    "server",
                    self._state.pushes,
                    self._state.pulls,
                    self._state.version,
                    tuple(self._state.staleness),
                )
        return ParameterServerStats("trainer", self._pushes, self._pulls, 0, tuple(self._staleness))

    # --- servers -----------------------------------------------------------------------

    def serve(self) -> None:
        """Answer the trainers until every one has finished (server ranks only).

        Returns when all trainers have called :meth:`finish` (or ended their ``with``
        block). Raises :class:`DistributedError` when a trainer reported a failure, or
        when no trainer was heard from for ``timeout`` seconds (one died or hangs);
        every trainer still waiting on this server then gets an error too.
        """
        state = self._require_role(want_server=True, what="serve()")
        if not self._finished:
            error = state.serve()
            if error is not None:
                raise DistributedError(f"The parameter server stopped: {error}")
            self._finished = True

    # --- trainers ----------------------------------------------------------------------

    def pull(self, model: torch.nn.Module | None = None) -> None:
        """Copy the servers' current parameters into ``model`` (default: the model given).

        Raises :class:`DistributedError` when a server does not answer within
        ``timeout`` seconds, has stopped, or holds parameters of other shapes.
        """
        self._require_role(want_server=False, what="pull()")
        self._check_open("pull()")
        params = self._params if model is None else list(model.parameters())
        if len(params) != len(self._params):
            raise ConfigError(
                f"pull() got a model with {len(params)} parameter tensors; the parameter "
                f"server's model has {len(self._params)}."
            )
        futures = [
            rpc.rpc_async(_worker_name(s), server.remote_pull, timeout=self.timeout)
            for s in range(self.servers)
        ]
        for s, future in enumerate(futures):
            version, tensors = self._wait(future, s, "pull")
            with torch.no_grad():
                for index, tensor in zip(self.shards[s], tensors, strict=True):
                    if params[index].shape != tensor.shape:
                        raise DistributedError(
                            f"Server rank {s} holds parameter '{self._names[index]}' with "
                            f"shape {tuple(tensor.shape)}, this trainer's has "
                            f"{tuple(params[index].shape)}: every rank must build the "
                            "same model."
                        )
                    params[index].copy_(tensor)
            self._versions[s] = version
        self._pulls += 1

    def push(self, model: torch.nn.Module | None = None) -> int:
        """Send the gradients of ``model`` (default: the model given), then clear them.

        In sync mode the call returns once every trainer still training has pushed
        for this step and the servers took one optimizer step with the average; in
        async mode, once the servers applied this push. The model's ``.grad`` are set
        to ``None`` afterwards, so the next ``backward()`` starts from zero. A
        parameter whose ``.grad`` is ``None`` counts as a zero gradient.

        Returns:
            The push's staleness: optimizer steps the servers took between this
            trainer's last pull and this push (the largest over servers).

        Raises:
            ConfigError: no parameter has a gradient (call ``loss.backward()`` first).
            DistributedError: a server did not answer within ``timeout`` seconds (in
                sync mode that includes waiting for the slowest trainer), stopped, or
                another trainer failed.
        """
        self._require_role(want_server=False, what="push()")
        self._check_open("push()")
        params = self._params if model is None else list(model.parameters())
        grads = [None if p.grad is None else p.grad.detach().cpu() for p in params]
        if all(g is None for g in grads):
            raise ConfigError(
                "push() found no gradient in the model: call loss.backward() before push()."
            )
        futures = [
            rpc.rpc_async(
                _worker_name(s),
                server.remote_push,
                args=(self.rank, self._versions[s], [grads[i] for i in self.shards[s]]),
                timeout=self.timeout,
            )
            for s in range(self.servers)
        ]
        staleness: int = max(self._wait(future, s, "push")[0] for s, future in enumerate(futures))
        for p in params:
            p.grad = None
        self._pushes += 1
        self._staleness.append(staleness)
        return staleness

    def finish(self) -> None:
        """Leave the training; wait for the other trainers; pull the final parameters.

        After it returns, the model holds the parameters every trainer ends with. In
        sync mode, rounds after this no longer wait for this trainer. Raises
        :class:`DistributedError` when a server stopped or does not answer within
        ``timeout`` seconds; there is no limit on how long the other trainers train.
        """
        self._require_role(want_server=False, what="finish()")
        self._check_open("finish()")
        for s in range(self.servers):
            self._wait(
                rpc.rpc_async(
                    _worker_name(s),
                    server.remote_trainer_done,
                    args=(self.rank,),
                    timeout=self.timeout,
                ),
                s,
                "finish",
            )
        for s in range(self.servers):
            while not self._wait(
                rpc.rpc_async(_worker_name(s), server.remote_wait_finished, timeout=self.timeout),
                s,
                "finish",
            ):
                pass  # "not yet": the server answers every timeout/4 seconds; ask again
        self._finished = True
        self.pull()

    # --- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Finish this rank's part (serve or finish) and shut rpc down.

        Every rank waits here, at most ``timeout`` seconds, for the others to arrive.
        """
        if self._closed:
            return
        try:
            if self.is_server:
                self.serve()
            elif not self._finished:
                self.finish()
        except BaseException:
            self._abort("its close() failed")
            raise
        try:
            rpc.shutdown(graceful=True, timeout=self.timeout)
        except RuntimeError as exc:
            raise DistributedError(
                f"Rank {self.rank} could not shut the parameter server down with the other "
                f"ranks within {self.timeout:g} s: {exc}"
            ) from exc
        finally:
            self._closed = True
            server.uninstall()

    def _abort(self, why: str) -> None:
        """Tell the servers this trainer failed (best effort), then leave at once."""
        if self._closed:
            return
        self._closed = True
        if self._state is not None:
            self._state.fail(f"server rank {self.rank} stopped: {why}")
            # Closing the connections at once could cut off the answers that carry the
            # failure, and a trainer would see only "eof". Each trainer that gets one
            # leaves through its own _abort, which tells this server: wait for that,
            # a bounded time (a dead or busy trainer never tells).
            self._state.all_left.wait(_ERROR_LINGER_S)
        else:
            for s in range(self.servers):
                # the server may be gone already; this rank fails anyway
                with contextlib.suppress(Exception):
                    rpc.rpc_sync(
                        _worker_name(s),
                        server.remote_trainer_failed,
                        args=(self.rank, why),
                        timeout=min(self.timeout, 10.0),
                    )
        try:
            rpc.shutdown(graceful=False)
        finally:
            server.uninstall()

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self._abort(f"{type(exc).__name__}: {exc}")

    # --- helpers -----------------------------------------------------------------------

    def _require_role(self, *, want_server: bool, what: str) -> server.ServerState:
        if want_server != self.is_server:
            role, other = ("a server", "trainer") if self.is_server else ("a trainer", "server")
            hint = "serve()" if self.is_server else "pull() and push()"
            raise ConfigError(
                f"{what} is for {other} ranks; rank {self.rank} is {role} "
                f"(ranks 0..{self.servers - 1} are servers): call {hint}, or branch on "
                "ps.is_server."
            )
        return self._state  # type: ignore[return-value]

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise DistributedError(f"{what} after the parameter server was closed.")
        if self._finished and what != "pull()":
            raise DistributedError(f"{what} after finish(): this trainer has left.")

    def _wait(self, future: torch.futures.Future[Any], s: int, what: str) -> Any:
        """The answer of server ``s``; its refusal or a transport error raises."""
        try:
            answer = future.wait()
        except RuntimeError as exc:
            raise DistributedError(
                f"{what} to server rank {s} failed on trainer rank {self.rank}: {exc}. If "
                "the server or another trainer died, its log says why; if it timed out "
                f"after {self.timeout:g} s, raise timeout=."
            ) from exc
        if isinstance(answer, server.Failure):
            raise DistributedError(f"{what} on trainer rank {self.rank}: {answer.message}")
        return answer


def parameter_server(
    model: torch.nn.Module,
    optimizer: OptimizerFactory = default_optimizer,
    *,
    mode: Mode = "sync",
    servers: int = 1,
    timeout: float = 300.0,
    rank: int | None = None,
    world_size: int | None = None,
) -> ParameterServer:
    """Join a parameter server as a server or a trainer rank; call it on every rank.

    Ranks ``0 .. servers-1`` hold the parameters of ``model`` (split over them when
    ``servers > 1``) and apply ``optimizer(their parameters)``; the other ranks are
    trainers, which start from the servers' parameters (they pull once here).

    Args:
        model: the model, built the same way on every rank. On a server, its
            parameters are the ones updated (those of its shard).
        optimizer: builds the optimizer from a list of parameters; called on servers
            only. The default is ``torch.optim.SGD(params, lr=0.1)``.
        mode: ``"sync"``: every step, the servers average the gradients of all the
            trainers still training and take one step, as all-reduce data parallelism
            would. ``"async"``: each push is applied as it arrives; trainers never
            wait for each other, and the staleness of each push is recorded.
        servers: how many ranks are servers; at least one rank must be left to train.
        timeout: the longest wait, in seconds, for another rank at any one point
            (start, every pull and push, the end); a server also stops when no
            trainer was heard from for that long.
        rank: overrides ``RANK`` from the environment.
        world_size: overrides ``WORLD_SIZE`` from the environment.

    Returns:
        This rank's :class:`ParameterServer`; use it as a context manager. Leaving the
        block normally serves (server) or finishes (trainer) and shuts rpc down;
        leaving it with an exception tells the servers, which fail everyone's
        pending calls, so no rank waits for a dead one.

    Raises:
        ConfigError: a bad option, a missing variable, or no trainer rank left.
        DistributedError: the ranks did not all meet within ``timeout`` seconds.
    """
    layout = check_layout(model, optimizer, mode, servers, timeout, rank, world_size)
    return ParameterServer(model, optimizer, layout, mode, timeout)
