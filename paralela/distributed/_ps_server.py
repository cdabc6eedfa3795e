"""The server half of the parameter server: its state, and the functions trainers call.

Each server rank holds one shard of the model's parameters (its own model's
``Parameter`` objects, updated in place) and the optimizer over them. Trainers reach it
only through the module-level ``remote_*`` functions, which ``torch.distributed.rpc``
runs on the server's rpc threads::

    trainer ── remote_pull() ─────────────▶ server: (version, copies of the shard)
    trainer ── remote_push(v, grads) ─────▶ sync:  held until every active trainer has
            ◀─ (staleness, version) ──────         pushed; average; one optimizer step
                                            async: one optimizer step at once
    trainer ── remote_trainer_done() ─────▶ the trainer left: rounds no longer wait for it
    trainer ── remote_wait_finished() ────▶ True once every trainer has left; False
                                            after timeout/4 s ("not yet": ask again)
    trainer ── remote_trainer_failed(m) ──▶ stops serve() and answers every held call
                                            with the failure; the trainer left

``version`` counts the optimizer steps this server has applied; the staleness of a
push is the version when it is applied minus the version the trainer had pulled. One
lock guards the state; futures are completed outside it. A refusal or failure comes
back as a :class:`Failure` value, never as a raised exception: ``async_execution``
futures do not carry exceptions back faithfully (PyTorch 2.13 returns the exception
object as the result).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch.distributed.rpc import functions as rpc_functions

__all__ = ["Failure", "ServerState", "install", "uninstall"]

Mode = Literal["sync", "async"]
Grads = list[torch.Tensor | None]
PushReply = tuple[int, int]  # (staleness, version after the update)
T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """A server's answer when it refused a call or has stopped; the trainer raises it."""

    message: str


class ServerState:
    """What one server rank holds: its shard, the optimizer, the round in progress."""

    def __init__(
        self,
        *,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        optimizer: torch.optim.Optimizer,
        mode: Mode,
        trainers: Sequence[int],
        timeout: float,
    ) -> None:
        self.params = list(params)
        self.names = list(names)
        self.optimizer = optimizer
        self.mode = mode
        self.timeout = timeout
        self.lock = threading.Lock()
        self.version = 0
        self.active = set(trainers)
        self.error: str | None = None
        self.finished = threading.Event()  # every trainer left, or the server failed
        self.all_left = threading.Event()  # every trainer left (finished or failed)
        self.last_heard = time.monotonic()
        self.pushes = 0
        self.pulls = 0
        self.staleness: list[int] = []
        # sync mode: trainer rank -> (pulled version, gradients, future to answer)
        self.pending: dict[int, tuple[int, Grads, torch.futures.Future[Any]]] = {}
        # trainers waiting in remote_wait_finished, with the time they started to wait
        self.waiters: list[tuple[float, torch.futures.Future[Any]]] = []

    # --- called from rpc threads -------------------------------------------------------

    def pull(self) -> tuple[int, list[torch.Tensor]] | Failure:
        with self.lock:
            self.last_heard = time.monotonic()
            if self.error is not None:
                return self._stopped()
            self.pulls += 1
            return self.version, [p.detach().to("cpu", copy=True) for p in self.params]

    def push(self, trainer: int, pulled: int, grads: Grads) -> torch.futures.Future[Any]:
        future: torch.futures.Future[Any] = torch.futures.Future()
        answers: list[tuple[torch.futures.Future[Any], object]] = []
        with self.lock:
            self.last_heard = time.monotonic()
            refusal = self._refuse_push(trainer, grads)
            if refusal is not None:
                answers.append((future, refusal))
            elif self.mode == "async":
                self.pushes += 1
                staleness = self.version - pulled
                failure = self._step([grads])
                if failure is None:
                    self.staleness.append(staleness)
                answers.append((future, failure or (staleness, self.version)))
            else:
                self.pushes += 1
                self.pending[trainer] = (pulled, grads, future)
                answers = self._maybe_finish_round()
            error = self.error
        _answer(answers)
        if error is not None:
            self.fail(error)  # an optimizer step failed: answer everyone, stop serve()
        return future

    def trainer_done(self, trainer: int) -> None:
        with self.lock:
            self.last_heard = time.monotonic()
            self.active.discard(trainer)
            answers = self._maybe_finish_round() if self.mode == "sync" else []
            if not self.active:
                self.finished.set()
                self.all_left.set()
        _answer(answers)
        if self.finished.is_set():
            self._release_waiters(everyone=True)

    def trainer_failed(self, trainer: int, message: str) -> None:
        self.fail(f"trainer rank {trainer} failed: {message}")
        with self.lock:
            self.active.discard(trainer)
            if not self.active:
                self.all_left.set()

    def wait_finished(self) -> torch.futures.Future[Any]:
        future: torch.futures.Future[Any] = torch.futures.Future()
        with self.lock:
            self.last_heard = time.monotonic()
            if not self.finished.is_set():
                self.waiters.append((time.monotonic(), future))
                return future
        _answer([(future, self._wait_answer())])
        return future

    # --- called from the server's own thread, or any thread -----------------------------

    def serve(self) -> str | None:
        """Block until every trainer has finished; return the failure that stopped it.

        Stops with a failure when a trainer failed, an optimizer step failed, or no
        trainer was heard from for ``timeout`` seconds.
        """
        while not self.finished.wait(0.2):
            with self.lock:
                quiet = time.monotonic() - self.last_heard
                active = sorted(self.active)
            if quiet > self.timeout:
                self.fail(
                    f"no trainer has pushed, pulled or finished for {quiet:.0f} s "
                    f"(timeout={self.timeout:g}); trainer ranks still expected: {active}. "
                    "A trainer may have died (see its log) or hang; if its steps are "
                    "really that slow, raise timeout="
                )
            # A trainer asking whether everyone finished gets "not yet" after a while
            # and asks again, so that no rpc outlives its timeout.
            self._release_waiters(everyone=False)
        return self.error

    def fail(self, message: str) -> None:
        """Record the first failure; answer every held push and waiter with it."""
        with self.lock:
            if self.error is None:
                self.error = message
            held = [future for _, _, future in self.pending.values()]
            self.pending.clear()
            failure = self._stopped()
        _answer([(future, failure) for future in held])
        self.finished.set()
        self._release_waiters(everyone=True)

    # --- helpers (the ones named _under_lock... expect the lock held) ------------------

    def _stopped(self) -> Failure:
        return Failure(f"The parameter server stopped: {self.error}")

    def _refuse_push(self, trainer: int, grads: Grads) -> Failure | None:
        if self.error is not None:
            return self._stopped()
        if trainer not in self.active:
            return Failure(f"Trainer rank {trainer} pushed after it finished.")
        if trainer in self.pending:
            return Failure(
                f"Trainer rank {trainer} pushed twice in one synchronous round; call push() "
                "once per step, from one thread."
            )
        if len(grads) != len(self.params):
            return Failure(
                f"Trainer rank {trainer} pushed {len(grads)} gradients to a server holding "
                f"{len(self.params)} parameters: every rank must build the same model."
            )
        for name, param, grad in zip(self.names, self.params, grads, strict=True):
            if grad is not None and grad.shape != param.shape:
                return Failure(
                    f"Trainer rank {trainer} pushed a gradient of shape {tuple(grad.shape)} "
                    f"for parameter '{name}' of shape {tuple(param.shape)}: every rank must "
                    "build the same model."
                )
        return None

    def _maybe_finish_round(self) -> list[tuple[torch.futures.Future[Any], object]]:
        """Sync mode, lock held: once every active trainer pushed, apply the round."""
        if not self.pending or not self.active.issubset(self.pending):
            return []
        entries = [self.pending[rank] for rank in sorted(self.pending)]  # fixed sum order
        self.pending.clear()
        version = self.version
        failure = self._step([grads for _, grads, _ in entries])
        if failure is not None:
            return [(future, failure) for _, _, future in entries]
        answers: list[tuple[torch.futures.Future[Any], object]] = []
        for pulled, _, future in entries:
            self.staleness.append(version - pulled)
            answers.append((future, (version - pulled, self.version)))
        return answers

    def _step(self, pushed: Sequence[Grads]) -> Failure | None:
        """Lock held: :meth:`_apply`; a failure stops the server (recorded in ``error``)."""
        try:
            self._apply(pushed)
        except Exception as exc:
            self.error = (
                f"the optimizer step on the server failed: {type(exc).__name__}: {exc}. "
                "Check the optimizer factory (it gets this server's parameters)."
            )
            return self._stopped()
        return None

    def _apply(self, pushed: Sequence[Grads]) -> None:
        """Average the pushed gradients (None counts as zero) and take one optimizer step."""
        for i, param in enumerate(self.params):
            given = [g for g in (grads[i] for grads in pushed) if g is not None]
            if not given:
                param.grad = None  # no trainer used it: the optimizer skips it
                continue
            total = given[0].detach().to(param.device, dtype=param.dtype, copy=True)
            for grad in given[1:]:
                total.add_(grad.to(param.device, dtype=param.dtype))
            param.grad = total.div_(len(pushed)) if len(pushed) > 1 else total
        self.optimizer.step()
        for param in self.params:
            param.grad = None
        self.version += 1

    def _wait_answer(self) -> bool | Failure:
        return self._stopped() if self.error is not None else self.finished.is_set()

    def _release_waiters(self, *, everyone: bool) -> None:
        now = time.monotonic()
        with self.lock:
            keep: list[tuple[float, torch.futures.Future[Any]]] = []
            release: list[torch.futures.Future[Any]] = []
            for since, future in self.waiters:
                if everyone or now - since > self.timeout / 4:
                    release.append(future)
                else:
                    keep.append((since, future))
            self.waiters = keep
            answer = self._wait_answer()
        _answer([(future, answer) for future in release])


def _answer(answers: Sequence[tuple[torch.futures.Future[Any], object]]) -> None:
    for future, value in answers:
        future.set_result(value)


_STATE: ServerState | None = None


def install(state: ServerState) -> None:
    """Make ``state`` the one this process's remote functions use."""
    global _STATE
    _STATE = state


def uninstall() -> None:
    """Forget the installed state (after rpc shut down)."""
    global _STATE
    _STATE = None


def _state() -> ServerState | Failure:
    if _STATE is None:
        return Failure(
            "A trainer called a rank that holds no parameter server: every rank must call "
            "parameter_server() with the same servers=."
        )
    return _STATE


def _done_future(value: object) -> torch.futures.Future[Any]:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(value)
    return future


def _async(fn: Callable[..., T]) -> Callable[..., T]:
    wrapped: Callable[..., T] = rpc_functions.async_execution(fn)  # type: ignore[no-untyped-call]
    return wrapped


# The functions trainers call through rpc; rpc finds them by their qualified name.


def remote_pull() -> tuple[int, list[torch.Tensor]] | Failure:
    state = _state()
    return state if isinstance(state, Failure) else state.pull()


@_async
def remote_push(trainer: int, pulled: int, grads: Grads) -> torch.futures.Future[Any]:
    state = _state()
    return _done_future(state) if isinstance(state, Failure) else state.push(trainer, pulled, grads)


def remote_trainer_done(trainer: int) -> Failure | None:
    state = _state()
    if isinstance(state, Failure):
        return state
    state.trainer_done(trainer)
    return None


def remote_trainer_failed(trainer: int, message: str) -> None:
    state = _state()
    if not isinstance(state, Failure):
        state.trainer_failed(trainer, message)


@_async
def remote_wait_finished() -> torch.futures.Future[Any]:
    state = _state()
    return _done_future(state) if isinstance(state, Failure) else state.wait_finished()
