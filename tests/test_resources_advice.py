"""Filesystem advice: fake mount tables put real directories in tmp_path on NFS, Lustre or
tmpfs; the advice then reads the real files (counts, sizes, SQLite headers)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paralela.cli import app
from paralela.resources import _advice
from paralela.resources._advice import MANY_FILES, SMALL_FILE, advise_filesystems
from paralela.resources._mounts import Mount, parse_mountinfo
from paralela.staging import stage


@pytest.fixture
def mounts(tmp_path: Path) -> list[Mount]:
    """/ on ext4; tmp_path/nfs on NFS, tmp_path/lustre on Lustre, tmp_path/shm a tmpfs."""
    for name in ("nfs", "lustre", "shm", "local"):
        (tmp_path / name).mkdir()
    real = os.path.realpath(tmp_path)
    return parse_mountinfo(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"40 22 0:45 / {real}/nfs rw - nfs4 nas01:/export/home rw,vers=4.2\n"
        f"41 22 0:46 / {real}/lustre rw - lustre 10.0.0.1@o2ib:/scratch rw,flock\n"
        f"42 22 0:47 / {real}/shm rw - tmpfs tmpfs rw,size=8G\n"
    )


def small_files(directory: Path, n: int, size: int = 200) -> Path:
    directory.mkdir(parents=True)
    for i in range(n):
        sub = directory / f"class{i % 10}"
        sub.mkdir(exist_ok=True)
        (sub / f"{i}.png").write_bytes(b"x" * size)
    return directory


NO_JOB: dict[str, str] = {}


def test_many_small_files_on_nfs_suggest_stage(tmp_path: Path, mounts: list[Mount]) -> None:
    data = small_files(tmp_path / "nfs/images", MANY_FILES + 50)
    (advice,) = advise_filesystems(data=[data], mounts=mounts, env=NO_JOB)
    assert (advice.role, advice.fstype, advice.kind) == ("data", "nfs4", "network")
    assert advice.path == str(data)
    assert "holds 1,050 files (median 200 B)" in advice.message
    assert "nas01:/export/home" in advice.message
    assert f"paralela stage {data}" in advice.message
    assert json.loads(json.dumps(advice.to_dict()))["role"] == "data"


def test_the_same_files_on_lustre_and_on_local_disk(tmp_path: Path, mounts: list[Mount]) -> None:
    lustre = small_files(tmp_path / "lustre/ds", MANY_FILES)
    local = small_files(tmp_path / "local/ds", MANY_FILES)
    found = advise_filesystems(data=[local, lustre], mounts=mounts, env=NO_JOB)
    assert [(a.path, a.fstype) for a in found] == [(str(lustre), "lustre")]


def test_few_files_or_large_files_on_nfs_are_fine(tmp_path: Path, mounts: list[Mount]) -> None:
    few = small_files(tmp_path / "nfs/few", MANY_FILES - 1)
    large = tmp_path / "nfs/large"
    large.mkdir()
    for i in range(MANY_FILES):
        with open(large / f"shard{i}.bin", "wb") as f:
            f.truncate(SMALL_FILE)  # sparse: the size is what counts
    one_file = tmp_path / "nfs/train.h5"
    one_file.write_bytes(b"h5")
    found = advise_filesystems(data=[few, large, one_file], mounts=mounts, env=NO_JOB)
    assert found == ()


def test_the_scan_stops_at_its_limit(tmp_path: Path, mounts: list[Mount]) -> None:
    data = small_files(tmp_path / "nfs/huge", MANY_FILES + 200)
    (advice,) = advise_filesystems(data=[data], mounts=mounts, env=NO_JOB, scan_limit=1100)
    assert "holds at least 1,0" in advice.message
    cut_short = advise_filesystems(data=[data], mounts=mounts, env=NO_JOB, scan_limit=500)
    assert cut_short == ()  # 500 seen are not "many"


def test_a_missing_dataset(tmp_path: Path, mounts: list[Mount]) -> None:
    (advice,) = advise_filesystems(data=[tmp_path / "nope"], mounts=mounts, env=NO_JOB)
    assert (advice.kind, advice.message) == ("missing", f"{tmp_path / 'nope'} does not exist.")


def make_sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("create table t (x)")
    db.close()


def test_sqlite_in_a_run_dir_on_nfs(tmp_path: Path, mounts: list[Mount]) -> None:
    run = tmp_path / "nfs/runs/sweep1"
    make_sqlite(run / "study.db")
    make_sqlite(run / "old/other.sqlite")
    (run / "notes.db").write_text("not a database")  # the name alone is not enough
    clean = tmp_path / "nfs/runs/map1"
    clean.mkdir()
    (clean / "chunk-0.pkl").write_bytes(b"")
    found = advise_filesystems(run_dirs=[run, clean], mounts=mounts, env=NO_JOB)
    assert len(found) == 1
    advice = found[0]
    assert (advice.role, advice.fstype) == ("run_dir", "nfs4")
    assert "SQLite database(s) old/other.sqlite, study.db" in advice.message
    assert "locking is unreliable" in advice.message


def test_sqlite_on_a_local_disk_is_fine(tmp_path: Path, mounts: list[Mount]) -> None:
    make_sqlite(tmp_path / "local/run/study.db")
    assert advise_filesystems(run_dirs=[tmp_path / "local/run"], mounts=mounts) == ()


def test_a_run_dir_in_job_scratch_or_tmpfs(tmp_path: Path, mounts: list[Mount]) -> None:
    scratch = tmp_path / "local/job42"
    run = scratch / "runs/a"  # does not exist yet: judged by where it will be
    job = {"SLURM_JOB_ID": "42", "SLURM_TMPDIR": str(scratch)}
    (advice,) = advise_filesystems(run_dirs=[run], mounts=mounts, env=job)
    assert "node-local scratch ($SLURM_TMPDIR)" in advice.message
    assert "erased when the job ends" in advice.message
    assert "paralela stage --back" in advice.message
    assert advise_filesystems(run_dirs=[run], mounts=mounts, env=NO_JOB) == ()
    (in_memory,) = advise_filesystems(run_dirs=[tmp_path / "shm/run"], mounts=mounts, env=NO_JOB)
    assert (in_memory.kind, in_memory.fstype) == ("tmpfs", "tmpfs")
    assert "held in memory" in in_memory.message


def test_stage_targets(tmp_path: Path, mounts: list[Mount]) -> None:
    (net,) = advise_filesystems(scratch=[tmp_path / "lustre/stage"], mounts=mounts)
    assert "staging there gains nothing" in net.message
    (mem,) = advise_filesystems(
        scratch=[tmp_path / "shm/stage"], staged_bytes=3 << 30, mounts=mounts
    )
    assert "the 3.0 GiB staged there are held in memory" in mem.message
    assert advise_filesystems(scratch=[tmp_path / "shm/stage"], mounts=mounts) == ()
    assert advise_filesystems(scratch=[tmp_path / "local/stage"], mounts=mounts) == ()


def test_stage_warns_about_a_network_dest(
    tmp_path: Path, mounts: list[Mount], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_advice, "read_mounts", lambda: mounts)
    src = tmp_path / "local/data"
    src.mkdir()
    (src / "x").write_bytes(b"1")
    result = stage(src, tmp_path / "nfs/copy")
    assert any("staging there gains nothing" in w for w in result.warnings)
    in_memory = stage(src, tmp_path / "shm/copy")
    assert any("held in memory" in w for w in in_memory.warnings)


def test_info_checks_the_given_paths(
    tmp_path: Path, mounts: list[Mount], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_advice, "read_mounts", lambda: mounts)
    data = small_files(tmp_path / "nfs/images", MANY_FILES)
    run = tmp_path / "nfs/run"
    make_sqlite(run / "study.db")
    env = {"SLURM_JOB_ID": "", "SLURM_TMPDIR": ""}
    args = ["info", "--json", "--data", str(data), "--run-dir", str(run)]
    result = CliRunner().invoke(app, [*args, "--data", str(tmp_path / "local")], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(a["role"], a["path"]) for a in report["advice"]] == [
        ("data", str(data)),
        ("run_dir", str(run)),
    ]
    text = CliRunner().invoke(app, ["info", "--data", str(data)], env=env)
    assert text.exit_code == 0, text.output
    flat = " ".join(text.stdout.split())
    assert "Filesystem advice" in flat
    assert "Warning (data):" in flat
    assert "paralela stage" in flat
    fine = CliRunner().invoke(app, ["info", "--json", "--data", str(tmp_path / "local")], env=env)
    assert json.loads(fine.stdout)["advice"] == []
    plain = CliRunner().invoke(app, ["info", "--json"], env=env)
    assert "advice" not in json.loads(plain.stdout)  # only when paths are given
