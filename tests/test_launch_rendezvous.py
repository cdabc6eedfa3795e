"""The preflight rendezvous over real sockets: everyone comes, someone does not, a clash."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from paralela.distributed._env import free_ports
from paralela.distributed._rendezvous import preflight
from paralela.errors import RendezvousError

HOSTS = ("node-a", "node-b", "node-c")


def meet(
    ranks: list[int],
    world_size: int,
    *,
    timeout: float = 5.0,
    overrides: dict[str, dict[int, object]] | None = None,
) -> dict[int, BaseException | None]:
    """Run ``preflight`` for ``ranks`` in threads; each rank's exception (or None).

    ``overrides`` changes one argument for some ranks: ``{"restart": {1: 1}}``.
    """
    port = free_ports(1)[0]
    outcome: dict[int, BaseException | None] = {}

    def one(rank: int) -> None:
        kwargs: dict[str, object] = {
            "rank": rank,
            "world_size": world_size,
            "master_addr": "127.0.0.1",
            "port": port,
            "rank_hosts": HOSTS[:world_size],
            "timeout": timeout,
        }
        for name, per_rank in (overrides or {}).items():
            if rank in per_rank:
                kwargs[name] = per_rank[rank]
        try:
            call: Callable[..., None] = preflight
            call(**kwargs)
            outcome[rank] = None
        except BaseException as exc:
            outcome[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 15)
        assert not t.is_alive(), "a preflight did not return after its timeout"
    return outcome


def test_everyone_comes() -> None:
    assert meet([0, 1, 2], 3) == {0: None, 1: None, 2: None}


def test_one_rank_needs_no_meeting() -> None:
    preflight(rank=0, world_size=1, master_addr="127.0.0.1", port=1, timeout=0.1)


def test_a_missing_rank_is_named_with_its_host_on_every_rank() -> None:
    outcome = meet([0, 1], 3, timeout=1.0)
    for rank in (0, 1):
        error = outcome[rank]
        assert isinstance(error, RendezvousError)
        assert "rank 2 (node-c)" in str(error)
        assert "1 of 3 rank(s)" in str(error)
        assert "within 1 s" in str(error)


def test_missing_rank_zero_is_named_by_the_others() -> None:
    outcome = meet([1, 2], 3, timeout=0.5)
    for rank in (1, 2):
        error = outcome[rank]
        assert isinstance(error, RendezvousError)
        assert "could not reach rank 0 (node-a)" in str(error)


def test_a_different_world_size_is_an_error_for_all() -> None:
    outcome = meet([0, 1], 2, overrides={"world_size": {1: 3}})
    assert all(isinstance(e, RendezvousError) for e in outcome.values())
    assert "expects 3 ranks" in str(outcome[0])
    assert str(outcome[0]) == str(outcome[1])


def test_two_processes_claiming_one_rank() -> None:
    port = free_ports(1)[0]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            preflight(rank=rank, world_size=3, master_addr="127.0.0.1", port=port, timeout=5)
        except RendezvousError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(errors) == 3
    assert all("claim rank 1" in str(e) for e in errors)


def test_a_straggler_of_another_attempt_is_not_counted() -> None:
    outcome = meet([0, 1], 2, timeout=1.0, overrides={"restart": {1: 1}})
    assert isinstance(outcome[0], RendezvousError)
    assert "rank 1 (node-b)" in str(outcome[0])


def test_port_taken_is_explained() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(RendezvousError, match="cannot listen on port"):
            preflight(rank=0, world_size=2, master_addr="127.0.0.1", port=port, timeout=1)
