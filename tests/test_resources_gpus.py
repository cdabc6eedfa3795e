"""GPU detection: a fake nvidia-smi on PATH, no GPU tools at all, CUDA_VISIBLE_DEVICES,
and (where a GPU exists) the real NVML and nvidia-smi."""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from paralela.resources import GpuInfo
from paralela.resources._gpus import detect_gpus, parse_cuda_visible_devices

MIB = 1024 * 1024

# The script refuses any other query, so the tests also check how nvidia-smi is called.
FAKE_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
cat <<'END'
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa1111-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-bbbb2222-0000-0000-0000-000000000000)
  MIG 3g.20gb     Device  0: (UUID: MIG-cccc3333-0000-0000-0000-000000000000)
  MIG 3g.20gb     Device  1: (UUID: MIG-dddd4444-0000-0000-0000-000000000000)
GPU 2: Tesla V100-PCIE-16GB (UUID: GPU-eeee5555-0000-0000-0000-000000000000)
END
exit 0
fi
if [ "$1" != "--query-gpu=index,uuid,name,memory.total,memory.free" ] || \\
   [ "$2" != "--format=csv,noheader,nounits" ]; then
  echo "unexpected arguments: $*" >&2
  exit 2
fi
cat <<'END'
0, GPU-aaaa1111-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 40960, 40000
1, GPU-bbbb2222-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 40960, [N/A]
2, GPU-eeee5555-0000-0000-0000-000000000000, Tesla V100-PCIE-16GB, 16384, 16000
END
"""


def write_tool(directory: Path, text: str) -> str:
    directory.mkdir(exist_ok=True)
    tool = directory / "nvidia-smi"
    tool.write_text(text)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(directory)


@pytest.fixture
def smi_path(tmp_path: Path) -> str:
    return write_tool(tmp_path / "bin", FAKE_SMI)


def test_all_gpus_when_cuda_visible_devices_is_unset(smi_path: str) -> None:
    report = detect_gpus({"PATH": smi_path}, use_nvml=False)
    assert report.source == "nvidia-smi"
    assert [g.index for g in report.gpus] == [0, 1, 2]
    assert report.gpus[0] == GpuInfo(
        index=0,
        physical_index=0,
        uuid="GPU-aaaa1111-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=40960 * MIB,
        memory_free=40000 * MIB,
    )
    assert report.gpus[1].memory_free is None  # "[N/A]"
    assert report.notes == ("NVML: not tried",)


def test_indices_renumber_as_the_process_sees_them(smi_path: str) -> None:
    report = detect_gpus({"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "2,0"}, use_nvml=False)
    assert [(g.index, g.physical_index) for g in report.gpus] == [(0, 2), (1, 0)]
    assert report.gpus[0].name == "Tesla V100-PCIE-16GB"


def test_uuid_and_uuid_prefix(smi_path: str) -> None:
    env = {"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "GPU-bbbb2222,GPU-eeee5555-0000"}
    report = detect_gpus(env, use_nvml=False)
    assert [g.physical_index for g in report.gpus] == [1, 2]


def test_mig_uuid_comes_from_nvidia_smi_list(smi_path: str) -> None:
    env = {"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "MIG-dddd4444-0000-0000-0000-000000000000"}
    report = detect_gpus(env, use_nvml=False)
    assert len(report.gpus) == 1
    mig = report.gpus[0]
    assert (mig.index, mig.physical_index) == (0, 1)
    assert mig.uuid.startswith("MIG-dddd4444")
    assert mig.name == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert mig.memory_total is None


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", " "])
def test_hidden_gpus(smi_path: str, value: str) -> None:
    report = detect_gpus({"PATH": smi_path, "CUDA_VISIBLE_DEVICES": value}, use_nvml=False)
    assert report.gpus == ()
    assert report.source == "nvidia-smi"
    assert any("hides the node's 3 GPU(s)" in note for note in report.notes)


def test_an_unknown_id_ends_the_list_like_cuda(smi_path: str) -> None:
    report = detect_gpus({"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "1,7,0"}, use_nvml=False)
    assert [g.physical_index for g in report.gpus] == [1]
    assert any("'7' is not a GPU" in note for note in report.notes)


def test_a_repeated_id_ends_the_list(smi_path: str) -> None:
    report = detect_gpus({"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "0,0,1"}, use_nvml=False)
    assert [g.physical_index for g in report.gpus] == [0]
    assert any("a second time" in note for note in report.notes)


def test_no_gpu_tools_at_all_is_no_gpu(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    report = detect_gpus({"PATH": str(empty), "CUDA_VISIBLE_DEVICES": "0"}, use_nvml=False)
    assert report.gpus == ()
    assert report.source == "none"
    assert report.notes == ("NVML: not tried", "nvidia-smi: not found on PATH")


def test_failing_nvidia_smi_is_no_gpu_with_its_message(tmp_path: Path) -> None:
    path = write_tool(
        tmp_path / "bin",
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the "
        "NVIDIA driver.' >&2\nexit 9\n",
    )
    report = detect_gpus({"PATH": path}, use_nvml=False)
    assert report.gpus == ()
    assert report.source == "none"
    assert "exit code 9 (NVIDIA-SMI has failed" in report.notes[-1]


def test_garbled_nvidia_smi_output_is_reported(tmp_path: Path) -> None:
    path = write_tool(tmp_path / "bin", "#!/bin/sh\necho 'No devices were found, sorry'\n")
    report = detect_gpus({"PATH": path}, use_nvml=False)
    assert report.gpus == ()
    assert "unexpected output line" in report.notes[-1]


def test_empty_nvidia_smi_output_is_zero_gpus(tmp_path: Path) -> None:
    path = write_tool(tmp_path / "bin", "#!/bin/sh\nexit 0\n")
    report = detect_gpus({"PATH": path}, use_nvml=False)
    assert report.gpus == ()
    assert report.source == "nvidia-smi"


class FakeNvmlError(Exception):
    pass


def fake_pynvml(*, fail_init: bool = False) -> ModuleType:
    """A stand-in for nvidia-ml-py: GPU 0 plain (names as bytes, like old versions),
    GPU 1 in MIG mode with instances in slots 0 and 2."""
    mod = ModuleType("pynvml")
    calls: list[str] = []
    gpus: dict[int, tuple[str | bytes, str]] = {
        0: (b"Tesla T4", "GPU-t4t4"),
        1: ("NVIDIA A100 80GB PCIe", "GPU-a100"),
    }
    migs = {0: ("NVIDIA A100 80GB PCIe MIG 1g.10gb", "MIG-m0"), 2: ("A100 MIG 2g", "MIG-m2")}

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise FakeNvmlError("Driver Not Loaded")

    def mig_mode(handle: tuple[str, int]) -> tuple[int, int]:
        if handle == ("gpu", 0):
            raise FakeNvmlError("Not Supported")
        return (1, 1)

    def mig_handle(handle: tuple[str, int], m: int) -> tuple[str, int]:
        if m not in migs:
            raise FakeNvmlError("Not Found")
        return ("mig", m)

    def name(handle: tuple[str, int]) -> str | bytes:
        return gpus[handle[1]][0] if handle[0] == "gpu" else migs[handle[1]][0]

    def uuid(handle: tuple[str, int]) -> str | bytes:
        return gpus[handle[1]][1] if handle[0] == "gpu" else migs[handle[1]][1]

    attrs: dict[str, Any] = {
        "NVMLError": FakeNvmlError,
        "NVML_DEVICE_MIG_ENABLE": 1,
        "calls": calls,
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=16 * MIB, free=8 * MIB),
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
    }
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def test_nvml_is_tried_first(monkeypatch: pytest.MonkeyPatch, smi_path: str) -> None:
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = detect_gpus({"PATH": smi_path})
    assert report.source == "nvml"
    assert report.notes == ()
    assert [(g.name, g.uuid) for g in report.gpus] == [
        ("Tesla T4", "GPU-t4t4"),
        ("NVIDIA A100 80GB PCIe", "GPU-a100"),
    ]
    assert report.gpus[0].memory_total == 16 * MIB
    assert fake.calls == ["init", "shutdown"]


def test_nvml_mig_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    report = detect_gpus({"PATH": "", "CUDA_VISIBLE_DEVICES": "MIG-m2,MIG-m0"})
    assert [(g.index, g.physical_index, g.uuid) for g in report.gpus] == [
        (0, 1, "MIG-m2"),
        (1, 1, "MIG-m0"),
    ]
    assert report.gpus[1].name == "NVIDIA A100 80GB PCIe MIG 1g.10gb"


def test_nvml_failure_falls_back_to_nvidia_smi_and_says_why(
    monkeypatch: pytest.MonkeyPatch, smi_path: str
) -> None:
    fake = fake_pynvml(fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = detect_gpus({"PATH": smi_path})
    assert report.source == "nvidia-smi"
    assert len(report.gpus) == 3
    assert report.notes == ("NVML: cannot start (Driver Not Loaded)",)
    assert fake.calls == ["init"]


def test_nvml_not_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    report = detect_gpus({"PATH": str(tmp_path)})
    assert report.source == "none"
    assert report.notes[0] == "NVML: nvidia-ml-py is not installed"


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("1,-1,2", ["1"]),
        ("GPU-abc,MIG-def", ["GPU-abc", "MIG-def"]),
    ],
)
def test_parse_cuda_visible_devices(value: str | None, ids: list[str] | None) -> None:
    assert parse_cuda_visible_devices(value) == ids


def test_real_chain_on_this_machine() -> None:
    report = detect_gpus()
    assert report.source in ("nvml", "nvidia-smi", "none")
    if report.source == "none":
        assert report.gpus == ()
        assert len(report.notes) >= 2  # why NVML and nvidia-smi failed
    for i, gpu in enumerate(report.gpus):
        assert gpu.index == i
        assert gpu.uuid.startswith(("GPU-", "MIG-"))


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU")
def test_nvml_and_nvidia_smi_agree_on_a_gpu_machine() -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    nvml = detect_gpus(env)
    smi = detect_gpus(env, use_nvml=False)
    assert nvml.source == "nvml"
    assert smi.source == "nvidia-smi"
    assert len(nvml.gpus) >= 1
    assert [g.uuid for g in nvml.gpus] == [g.uuid for g in smi.gpus]
    for gpu in nvml.gpus:
        assert gpu.memory_total is not None
        assert gpu.memory_total > 0
    last = nvml.gpus[-1]
    only_last = detect_gpus({**env, "CUDA_VISIBLE_DEVICES": str(last.physical_index)})
    assert [(g.index, g.uuid) for g in only_last.gpus] == [(0, last.uuid)]
