"""Workers of the processes backend pinned to slots: GPUs, thread limits, CPU affinity."""

from __future__ import annotations

import os

import pytest

import paralela
from paralela.backends import ProcessBackend, get_backend, make_backend
from paralela.errors import ConfigError
from paralela.resources import Slot


def _pinning(_: object) -> tuple[str | None, str | None, tuple[int, ...]]:
    return (
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        os.environ.get("OMP_NUM_THREADS"),
        tuple(sorted(os.sched_getaffinity(0))),
    )


def test_each_worker_gets_its_slot_environment_and_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    slots = [Slot("localhost", (cpus[0],), ("0",)), Slot("localhost", (cpus[-1],), ("1",))]
    with ProcessBackend(slots=slots, pin_cpus=True) as backend:
        assert backend.effective_workers() == 2
        seen = set(paralela.map(_pinning, range(40), backend=backend, chunksize=1))
    assert seen <= {("0", "1", (cpus[0],)), ("1", "1", (cpus[-1],))}
    # Two workers, each with a distinct device; with 40 one-item chunks both served.
    assert {device for device, _, _ in seen} == {"0", "1"}


def test_cpu_slot_hides_gpus_and_limits_threads() -> None:
    slot = Slot("localhost", (0,), ())
    with ProcessBackend(slots=[slot]) as backend:
        device, threads, _ = backend.submit(_pinning, None).result(timeout=30)
    assert device == ""
    assert threads == "1"


def test_empty_slot_list_is_refused() -> None:
    with pytest.raises(ConfigError, match="slots is empty"):
        ProcessBackend(slots=[])


def _slot_index(_: object) -> tuple[str | None, str | None]:
    return os.environ.get("PARALELA_SLOT"), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_workers_know_their_slot_index() -> None:
    slots = [Slot("localhost", (0,), ("a",), index=0), Slot("localhost", (0,), ("b",), index=1)]
    with ProcessBackend(slots=slots) as backend:
        seen = set(paralela.map(_slot_index, range(20), backend=backend, chunksize=1))
    assert seen == {("0", "a"), ("1", "b")}


def test_make_backend_pins_a_fresh_pool_to_slots() -> None:
    slots = [Slot("localhost", (0,), ("a",), index=0), Slot("localhost", (0,), ("b",), index=1)]
    backend = make_backend("processes", slots=slots)
    other = make_backend("processes", slots=slots)
    try:
        assert isinstance(backend, ProcessBackend)
        assert backend.effective_workers() == 2  # one worker per slot
        assert other is not backend  # never shared: each caller owns its pool
        seen = set(paralela.map(_slot_index, range(20), backend=backend, chunksize=1))
    finally:
        backend.shutdown()
        other.shutdown()
    assert seen == {("0", "a"), ("1", "b")}


@pytest.mark.parametrize("name", ["threads", "sequential"])
def test_slots_for_a_backend_that_cannot_pin_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"Backend '{name}' cannot pin workers to slots"):
        make_backend(name, 1, slots=[Slot("localhost", (0,), ())])


def test_slots_for_a_backend_instance_are_refused() -> None:
    with ProcessBackend(1) as backend, pytest.raises(ConfigError, match="slots apply to a backend"):
        get_backend(backend, slots=[Slot("localhost", (0,), ())])
