"""Slots: splitting CPUs and GPUs, the pinning environment, and impossible requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paralela.errors import ConfigError
from paralela.resources import (
    THREAD_VARIABLES,
    CpuInfo,
    GpuInfo,
    MemoryInfo,
    Resources,
    Slot,
    make_slots,
)


def resources(n_cpus: int = 2, n_gpus: int = 0, notes: tuple[str, ...] = ()) -> Resources:
    gpus = tuple(
        GpuInfo(i, i, f"GPU-{i}000", "NVIDIA L4", 24 * 1024**3, 24 * 1024**3) for i in range(n_gpus)
    )
    return Resources(
        host="node1",
        cpus=CpuInfo.from_parts(n_cpus, tuple(range(n_cpus)), None),
        memory=MemoryInfo(1 << 34, 1 << 33, None, None),
        gpus=gpus,
        gpu_source="nvidia-smi" if n_gpus else "none",
        gpu_notes=notes,
        slurm=None,
        filesystems=(),
    )


def test_two_cpus_make_two_slots_of_one() -> None:
    slots = make_slots(resources(2))
    assert slots == [Slot("node1", (0,), (), 0), Slot("node1", (1,), (), 1)]
    for slot in slots:
        env = slot.env()
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert all(env[name] == "1" for name in THREAD_VARIABLES)


def test_cpus_split_evenly_and_disjoint() -> None:
    slots = make_slots(resources(8), n_slots=3)
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert [s.threads for s in slots] == [3, 3, 2]
    assert slots[0].env()["OMP_NUM_THREADS"] == "3"
    assert slots[2].env()["MKL_NUM_THREADS"] == "2"


def test_more_slots_than_cpus_share_round_robin_with_one_thread() -> None:
    slots = make_slots(resources(2), n_slots=5)
    assert [s.cpus for s in slots] == [(0,), (1,), (0,), (1,), (0,)]
    assert {s.env()["OPENBLAS_NUM_THREADS"] for s in slots} == {"1"}


def test_cpus_per_slot() -> None:
    slots = make_slots(resources(8), cpus_per_slot=3)
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 4, 5)]
    with pytest.raises(ConfigError, match=r"3 slot\(s\) x cpus_per_slot=3 need 9 CPUs.*8"):
        make_slots(resources(8), n_slots=3, cpus_per_slot=3)
    with pytest.raises(ConfigError, match="cpus_per_slot=4 is more than the 2 CPUs"):
        make_slots(resources(2), cpus_per_slot=4)


def test_one_slot_per_gpu() -> None:
    slots = make_slots(resources(6, n_gpus=3), gpus_per_slot=1)
    assert [s.gpus for s in slots] == [("0",), ("1",), ("2",)]
    assert [s.cpus for s in slots] == [(0, 1), (2, 3), (4, 5)]
    env = slots[1].env()
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1000"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NUMEXPR_NUM_THREADS"] == "2"
    assert env["VECLIB_MAXIMUM_THREADS"] == "2"


def test_three_gpus_two_slots_each_make_six_slots() -> None:
    slots = make_slots(resources(6, n_gpus=3), slots_per_gpu=2)
    assert len(slots) == 6
    assert [s.gpus[0] for s in slots] == ["0", "1", "2", "0", "1", "2"]
    assert [s.cpus for s in slots] == [(i,) for i in range(6)]
    assert [s.index for s in slots] == list(range(6))


def test_fewer_slots_than_gpu_capacity_spread_over_gpus() -> None:
    slots = make_slots(resources(4, n_gpus=2), slots_per_gpu=4, n_slots=3)
    assert [s.gpus for s in slots] == [("0",), ("1",), ("0",)]


@pytest.mark.parametrize("gpus", ["0,2", [0, 2], ("0", "2"), "GPU-0000,GPU-2000"])
def test_gpus_restricts_the_devices(gpus: str | list[int] | tuple[str, ...]) -> None:
    slots = make_slots(resources(4, n_gpus=3), gpus=gpus)
    assert [s.gpus for s in slots] == [("0",), ("2",)]
    assert [s.env()["CUDA_VISIBLE_DEVICES"] for s in slots] == ["GPU-0000", "GPU-2000"]


def test_gpus_with_several_slots_per_gpu() -> None:
    slots = make_slots(resources(2, n_gpus=3), gpus="0,2", slots_per_gpu=3)
    assert [s.gpus for s in slots] == [("0",), ("2",)] * 3


def test_two_gpus_per_slot() -> None:
    slots = make_slots(resources(4, n_gpus=4), gpus_per_slot=2)
    assert [s.gpus for s in slots] == [("0", "1"), ("2", "3")]
    assert slots[1].env()["CUDA_VISIBLE_DEVICES"] == "GPU-2000,GPU-3000"


def test_two_gpus_per_slot_with_one_gpu_says_what_is_there() -> None:
    with pytest.raises(ConfigError) as info:
        make_slots(resources(2, n_gpus=1), gpus_per_slot=2)
    message = str(info.value)
    assert "gpus_per_slot=2 needs 2 GPU(s), but 1 is available" in message
    assert "0 (NVIDIA L4)" in message
    assert "Lower gpus_per_slot" in message


def test_gpu_not_visible() -> None:
    with pytest.raises(ConfigError, match=r"GPU '5' in gpus='0,5' is not visible.*0 \(NVIDIA"):
        make_slots(resources(2, n_gpus=2), gpus="0,5")
    with pytest.raises(ConfigError, match="appears twice"):
        make_slots(resources(2, n_gpus=2), gpus="1,1")
    with pytest.raises(ConfigError, match="names no GPU"):
        make_slots(resources(2, n_gpus=2), gpus=" , ")


def test_gpu_slots_without_gpus_say_why() -> None:
    res = resources(2, notes=("nvidia-smi: not found on PATH",))
    with pytest.raises(ConfigError, match=r"no GPU is visible.*nvidia-smi: not found"):
        make_slots(res, gpus_per_slot=1)


def test_more_slots_than_gpus_allow() -> None:
    with pytest.raises(ConfigError, match=r"n_slots=5 is more than the 4 GPU slot\(s\)"):
        make_slots(resources(2, n_gpus=2), slots_per_gpu=2, n_slots=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_slots": 0},
        {"n_slots": -2},
        {"n_slots": True},
        {"n_slots": 2.0},
        {"cpus_per_slot": 0},
        {"gpus_per_slot": -1},
        {"slots_per_gpu": 0},
    ],
)
def test_bad_numbers(kwargs: dict[str, object]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=f"{name} must be a whole number"):
        make_slots(resources(2), **kwargs)  # type: ignore[arg-type]


def test_slot_without_cuda_devices_uses_its_gpu_ids() -> None:
    slot = Slot("h", (0, 1, 2, 3), ("1", "3"))
    assert slot.env()["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert slot.env()["OMP_NUM_THREADS"] == "4"
    assert Slot("h", ()).threads == 1
    data = json.loads(json.dumps(slot.to_dict()))
    assert data["cpus"] == [0, 1, 2, 3]
    assert data["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"


APPLY_IN_CHILD = """
import json, os, sys
from paralela.resources import Slot
cpu = int(sys.argv[1])
Slot("h", (cpu,), ("0",), cuda_devices=("GPU-x",)).apply(pin=True)
print(json.dumps({"affinity": sorted(os.sched_getaffinity(0)),
                  "cvd": os.environ["CUDA_VISIBLE_DEVICES"],
                  "omp": os.environ["OMP_NUM_THREADS"]}))
"""


def test_apply_pins_a_real_process() -> None:
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", APPLY_IN_CHILD, str(cpu)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(out) == {"affinity": [cpu], "cvd": "GPU-x", "omp": "1"}


def test_apply_without_pin_sets_only_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *THREAD_VARIABLES):
        monkeypatch.setenv(name, "before")
    before = os.sched_getaffinity(0)
    Slot("h", (0, 1)).apply()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert os.environ["VECLIB_MAXIMUM_THREADS"] == "2"
    assert os.sched_getaffinity(0) == before


def test_apply_to_cpus_this_process_may_not_use(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *THREAD_VARIABLES):
        monkeypatch.setenv(name, "before")
    with pytest.raises(ConfigError, match=r"Cannot pin this process to CPUs \[100000\]"):
        Slot("h", (100_000,)).apply(pin=True)
