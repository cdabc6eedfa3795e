"""`paralela info`: the readable report and --json, through Typer's CliRunner."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

import paralela


def import_info() -> ModuleType:
    """Import paralela.cli._info.

    paralela/cli/__init__.py imports every command module. While a sibling command
    module does not exist yet, an empty stand-in lets this command be tested alone; once
    they all exist this does nothing.
    """
    cli_dir = Path(paralela.__file__).parent / "cli"
    for name in ("_demo", "_map"):
        full = f"paralela.cli.{name}"
        if full not in sys.modules and not (cli_dir / f"{name}.py").exists():
            sys.modules[full] = ModuleType(full)
    return importlib.import_module("paralela.cli._info")


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """A group holding only `info`, so it is invoked as a sub-command as in paralela."""
    info_module = import_info()
    group = typer.Typer()

    @group.callback()
    def _root() -> None:
        """Test group."""

    group.command()(info_module.info)
    return group


NO_SLURM: dict[str, str | None] = {"SLURM_JOB_ID": None, "SLURM_NTASKS": None}


def test_info_is_registered_on_the_paralela_app() -> None:
    info_module = import_info()
    from paralela.cli._app import app

    assert info_module.info in [c.callback for c in app.registered_commands]


def test_json_report(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["info", "--json"], env=NO_SLURM)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {
        "host", "cpus", "memory", "gpus", "gpu_source", "gpu_notes", "slurm", "filesystems",
        "slots",
    }  # fmt: skip
    assert 1 <= data["cpus"]["usable"] <= len(os.sched_getaffinity(0))
    assert data["memory"]["total"] > 0
    assert data["slurm"] is None
    assert [f["role"] for f in data["filesystems"]] == ["working", "temporary"]
    expected_slots = len(data["gpus"]) or data["cpus"]["usable"]
    assert len(data["slots"]) == expected_slots
    assert all("OMP_NUM_THREADS" in slot["env"] for slot in data["slots"])


def test_json_report_inside_slurm(cli: typer.Typer, tmp_path: Path) -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_NODELIST": "gpu[01-04,07]",
        "SLURM_NTASKS": "5",
        "SLURM_PROCID": "0",
        "SLURM_TMPDIR": str(tmp_path),
    }
    result = CliRunner().invoke(cli, ["info", "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["slurm"]["job_id"] == "4242"
    assert data["slurm"]["nodes"] == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
    assert data["filesystems"][-1] == {**data["filesystems"][-1], "role": "scratch"}
    assert data["filesystems"][-1]["path"] == os.path.realpath(tmp_path)


def test_readable_report(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["info"], env=NO_SLURM)
    assert result.exit_code == 0, result.output
    for heading in ("CPUs", "Memory", "GPUs (found by:", "Filesystems", "Default slots"):
        assert heading in result.stdout
    assert "not inside a Slurm allocation" in result.stdout
    assert "usable" in result.stdout


def test_readable_report_inside_slurm(cli: typer.Typer) -> None:
    env = {"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "n[001-003]", "SLURM_NTASKS": "3"}
    result = CliRunner().invoke(cli, ["info"], env=env)
    assert result.exit_code == 0, result.output
    assert "3: n[001-003]" in result.stdout
    assert "not inside" not in result.stdout


def test_malformed_slurm_variable_exits_2_with_the_reason(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["info"], env={"SLURM_JOB_ID": "1", "SLURM_NTASKS": "abc"})
    assert result.exit_code == 2
    assert "SLURM_NTASKS='abc'" in result.stderr
    assert result.stdout == ""


FAKE_SMI = """#!/bin/sh
echo '0, GPU-11111111-aaaa, NVIDIA H100 80GB HBM3, 81559, 81000'
echo '1, GPU-22222222-bbbb, NVIDIA H100 80GB HBM3, 81559, 1000'
"""


@pytest.fixture
def gpu_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """Two GPUs from a fake nvidia-smi; NVML made unavailable so the fake is used."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    tool = tmp_path / "nvidia-smi"
    tool.write_text(FAKE_SMI)
    tool.chmod(0o755)
    return {**NO_SLURM, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}


def test_json_report_with_gpus(cli: typer.Typer, gpu_env: dict[str, str | None]) -> None:
    result = CliRunner().invoke(cli, ["info", "--json"], env=gpu_env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpu_source"] == "nvidia-smi"
    assert [g["uuid"] for g in data["gpus"]] == ["GPU-11111111-aaaa", "GPU-22222222-bbbb"]
    assert [s["gpus"] for s in data["slots"]] == [["0"], ["1"]]
    assert data["slots"][1]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-22222222-bbbb"


def test_readable_report_with_gpus(cli: typer.Typer, gpu_env: dict[str, str | None]) -> None:
    result = CliRunner().invoke(cli, ["info"], env=gpu_env)
    assert result.exit_code == 0, result.output
    assert "GPUs (found by: nvidia-smi)" in result.stdout
    assert "NVIDIA H100 80GB HBM3" in result.stdout
    assert "79.6 GiB" in result.stdout  # 81559 MiB
