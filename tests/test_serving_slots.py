"""The model workers' slots of serve and predict: how many by default, and their CPUs."""

from __future__ import annotations

import pytest
from test_resources_slots import resources

import paralela.resources
from paralela.serving._serve import CPUS_PER_WORKER, MIN_CPU_WORKERS
from paralela.serving._slots import worker_slots


@pytest.mark.parametrize(
    ("cpus", "workers"), [(1, 1), (2, 2), (3, 2), (4, 2), (8, 2), (16, 4), (64, 16)]
)
def test_serve_runs_two_workers_at_least_on_cpus_and_one_per_4_cpus_beyond(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int
) -> None:
    monkeypatch.setattr(paralela.resources, "detect", lambda: resources(cpus))
    slots = worker_slots(
        None, None, 1, cpus_per_worker=CPUS_PER_WORKER, min_cpu_workers=MIN_CPU_WORKERS
    )
    assert len(slots) == workers
    # every CPU is some worker's, and a worker's threads are its own CPUs
    assert sorted(cpu for slot in slots for cpu in slot.cpus) == list(range(cpus))
    assert [slot.env()["OMP_NUM_THREADS"] for slot in slots] == [
        str(len(slot.cpus)) for slot in slots
    ]


def test_predict_keeps_one_worker_per_cpu_and_an_explicit_count_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paralela.resources, "detect", lambda: resources(4))
    assert len(worker_slots(None, None, 1)) == 4
    assert len(worker_slots(1, None, 1, min_cpu_workers=MIN_CPU_WORKERS)) == 1
