"""Every file paralela writes atomically goes through paralela._files: a random temp name
created with O_EXCL | O_NOFOLLOW, then a rename. Someone who can write the directory
cannot make any writer write through a symlink, at the temp name or at the final one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import paralela
from paralela import _files
from paralela._files import (
    TMP_PREFIX,
    atomic_write,
    create_exclusive,
    json_text,
    make_dirs,
    temp_path,
)
from paralela.backends import dumps
from paralela.backends.slurm._worker import run_task
from paralela.distributed._checkpoint import save_checkpoint
from paralela.distributed._env import local_specs
from paralela.distributed._launcher import _write_record
from paralela.reporting import write_report
from paralela.runs import RunStore
from paralela.staging import stage
from paralela.staging._manifest import TMP_PREFIX as STAGE_PREFIX

VICTIM = b"precious: must not be overwritten\n"


def add(a: int, b: int) -> int:
    return a + b


# Each writer: (prepare, write, the file it writes, the prefix of its temp names).
def _run_store(d: Path) -> Path:
    atomic_write(d / "chunk-0.pkl", b"chunk")
    return d / "chunk-0.pkl"


def _manifest(d: Path) -> Path:
    assert create_exclusive(d / "manifest.json", b"{}")
    return d / "manifest.json"


def _checkpoint(d: Path) -> Path:
    save_checkpoint({"step": 3}, d / "ckpt.pt")
    return d / "ckpt.pt"


def _report(d: Path) -> Path:
    if not (d / "launch.json").exists():
        record = {"argv": ["x"], "world_size": 1, "nnodes": 1, "master": "127.0.0.1:1"}
        rank = {"rank": 0, "local_rank": 0, "host": "h", "pid": 1, "start": 0.0}
        record["attempts"] = [[{**rank, "end": 1.0, "returncode": 0, "log": str(d / "r.log")}]]
        (d / "launch.json").write_text(json.dumps(record))
    write_report(d)
    return d / "report.html"


def _launch_record(d: Path) -> Path:
    _write_record(d, ["train.py"], local_specs(1, with_tf=False), [[]])
    return d / "launch.json"


def _slurm_result(d: Path) -> Path:
    job = d
    for sub in ("calls", "refs", "results"):
        (job / sub).mkdir(exist_ok=True)
    (job / "sys_path.json").write_text(json.dumps(sys.path))
    (job / "calls" / "0.pkl").write_bytes(dumps((add, (40, 2), {})))
    run_task(job, 0)
    return job / "results" / "0.pkl"


def _staged(d: Path) -> Path:
    src = d.parent / "src"
    src.mkdir(exist_ok=True)
    (src / "data.bin").write_bytes(b"data")
    # A link at the target is a file paralela did not write: refused unless overwrite
    # (tests/test_output_safety.py); told to replace it, the stage replaces the link.
    with contextlib.suppress(Exception):  # a refused file fails the stage: that is fine
        stage(src, d, overwrite=True)
    return d / "data.bin"


WRITERS: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    # name: (writer, the file it writes, temp prefix)
    "run store": (_run_store, "chunk-0.pkl", TMP_PREFIX),
    "manifest": (_manifest, "manifest.json", TMP_PREFIX),
    "checkpoint": (_checkpoint, "ckpt.pt", TMP_PREFIX),
    "report": (_report, "report.html", TMP_PREFIX),
    "launch record": (_launch_record, "launch.json", TMP_PREFIX),
    "slurm result": (_slurm_result, "results/0.pkl", TMP_PREFIX),
    "stage": (_staged, "data.bin", STAGE_PREFIX),
}
# The names these writers used before they shared one helper: predictable, followed.
OLD_NAMES = {
    "checkpoint": [f"ckpt.pt.tmp-{os.getpid()}"],
    "report": [f".report.html.{os.getpid()}.tmp"],
    "launch record": [".launch.json.tmp"],
    "stage": [".paralela-tmp.data.bin"],
}


@pytest.fixture
def task_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_task sets PARALELA_TASK_DIR and a USR1 handler: both are undone afterwards."""
    import signal

    monkeypatch.setenv("PARALELA_TASK_DIR", "")
    previous = signal.getsignal(signal.SIGUSR1)
    monkeypatch.setattr(signal, "signal", lambda *a: previous)


def _plant(link: Path, victim: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, link)


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_symlink_at_the_target_is_replaced_not_written_through(
    name: str, tmp_path: Path, task_env: None
) -> None:
    write, rel, _ = WRITERS[name]
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    d = tmp_path / "d"
    d.mkdir()
    if name != "manifest":  # create_exclusive refuses any existing name
        _plant(d / rel, victim)
    for old in OLD_NAMES.get(name, []):
        _plant(d / old, tmp_path / f"victim-{old}")
    target = write(d)
    assert victim.read_bytes() == VICTIM
    assert not any(p.exists() for p in tmp_path.glob("victim-*"))  # dangling ones stay so
    assert not target.is_symlink(), f"{name} did not replace the link at {target}"
    assert target.is_file(), f"{name} did not write {target}"


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_symlink_at_the_temp_name_is_never_followed(
    name: str, tmp_path: Path, task_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make the random part known in advance (as an attacker would need), plant a link."""
    write, rel, prefix = WRITERS[name]
    fixed = uuid.UUID(int=7)
    monkeypatch.setattr(uuid, "uuid4", lambda: fixed)
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    d = tmp_path / "d"
    d.mkdir()
    target = d / rel
    _plant(temp_path(target, prefix), victim)
    with contextlib.suppress(Exception):  # refusing to write is the right outcome
        write(d)
    assert victim.read_bytes() == VICTIM


def test_open_new_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(FileExistsError):
        _files.open_new(tmp_path / "link")
    assert not (tmp_path / "nowhere").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_bytes(b"old")

    def pieces() -> object:
        yield b"half"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, pieces())  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_directories_made_are_never_group_or_world_writable(tmp_path: Path) -> None:
    previous = os.umask(0o002)  # a common cluster umask: group-writable by default
    try:
        make_dirs(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(previous)
    for d in ("a", "a/b", "a/b/c"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o755, d
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        make_dirs(tmp_path / "file")


def test_run_directories_are_not_group_writable_under_a_loose_umask(tmp_path: Path) -> None:
    previous = os.umask(0o002)
    try:
        store = RunStore(tmp_path / "runs" / "one", {"fn": "f"}, {})
    finally:
        os.umask(previous)
    for d in (tmp_path / "runs", store.path, store.chunks_dir):
        assert stat.S_IMODE(d.stat().st_mode) & 0o022 == 0, d


# Writing a temp file and renaming it by hand is what this module exists to prevent.
_TWINS = [
    re.compile(r"""\.tmp["'}-]"""),  # f"...{name}.tmp" / ".tmp-..." names
    re.compile(r"\bmktemp\("),
    re.compile(r"\bos\.(replace|rename)\("),
]
# os.replace is allowed where the temp file was made by paralela._files.open_new: a stage
# renames its copy only once it is verified, a Slurm script once Slurm gave it its job id.
_ALLOWED = {
    "_files.py",
    os.path.join("staging", "_copy.py"),
    os.path.join("backends", "slurm", "_jobs.py"),
}


def test_no_other_temp_file_writer_in_the_package() -> None:
    root = Path(paralela.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in _ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(p.search(line) for p in _TWINS):
                found.append(f"paralela/{rel}:{number}: {line.strip()}")
    assert not found, "write through paralela._files instead:\n" + "\n".join(found)


def test_move_into_place_never_replaces_what_is_there(tmp_path: Path) -> None:
    from paralela._files import move_into_place, open_new

    target = tmp_path / "study.db"
    first, second = temp_path(target), temp_path(target)
    for temp, data in ((first, b"first"), (second, b"second")):
        with open_new(temp) as f:
            f.write(data)
    assert move_into_place(first, target)
    assert not move_into_place(second, target)  # another process won: its file stays
    assert target.read_bytes() == b"first"
    assert not first.exists()
    assert not second.exists()


def test_json_text_reads_back_as_json_dumps_and_puts_list_items_on_lines() -> None:
    data = {
        "b": [{"z": 1, "a": [1, 2]}, {"x": None}],
        "a": 'ü\n"x"',
        "empty": [],
        "nested": {"k": [3]},
        "n": 1.5,
    }
    for sort_keys in (False, True):
        text = json_text(data, sort_keys=sort_keys)
        assert json.loads(text) == data
        assert text.endswith("}\n")
        lines = text.splitlines()
        first = '    {"a": [1, 2], "z": 1},' if sort_keys else '    {"z": 1, "a": [1, 2]},'
        assert first in lines  # a list's item on a line of its own
        assert [line.split(":")[0] for line in lines if line.startswith('  "')] == [
            f'  "{k}"' for k in (sorted(data) if sort_keys else data)
        ]
    assert json.loads(json_text({"when": object()}, default=lambda o: "obj")) == {"when": "obj"}
    assert json_text({}) == "{}\n"
