"""`paralela stage`: copies with real files in tmp_path, verification (with real corrupted
bytes), skipping, atomicity after a real crash, --back, the default DEST, and the CLI."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paralela.cli import app
from paralela.errors import ConfigError
from paralela.staging import (
    StageError,
    StageResult,
    VerificationError,
    _copy,
    default_dest,
    default_workers,
    scratch_dir,
    stage,
    verify_stage,
)
from paralela.staging._manifest import (
    LOCK_NAME,
    MANIFEST_NAME,
    TMP_PREFIX,
    Entry,
    Manifest,
    hold_lock,
    remove_temporaries,
)
from paralela.staging._plan import stage_root

BIG = 2 * _copy.CHUNK + 12345  # spans three read pieces


def make_tree(root: Path) -> dict[str, bytes]:
    """A small dataset: nested files of many sizes (empty, tiny, several MiB), an empty dir."""
    files = {
        "a.txt": b"alpha\n",
        "empty.bin": b"",
        "sub/b.bin": os.urandom(5000),
        "sub/deeper/c.bin": os.urandom(300),
        "big.bin": os.urandom(BIG),
    }
    files.update({f"many/{i:03d}.dat": os.urandom(i * 7) for i in range(40)})
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "nothing_inside").mkdir()
    return files


def copied_files(dest: Path) -> dict[str, bytes]:
    """Every regular file under dest except the stage's own bookkeeping."""
    out = {}
    for path in dest.rglob("*"):
        if path.is_file() and path.name not in (MANIFEST_NAME, LOCK_NAME):
            out[path.relative_to(dest).as_posix()] = path.read_bytes()
    return out


def leftovers(dest: Path) -> list[Path]:
    return list(dest.rglob(f"{TMP_PREFIX}*"))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    src = tmp_path / "data"
    return src, make_tree(src)


# -- copying, skipping, recopying --------------------------------------------------------


def test_stage_copies_every_file_verified(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    os.chmod(src / "a.txt", 0o640)
    dest = tmp_path / "scratch" / "data"
    result = stage(src, dest, workers=4)
    assert copied_files(dest) == files
    assert (dest / "nothing_inside").is_dir()
    assert (result.files_copied, result.files_skipped, result.files_verified) == (45, 0, 45)
    assert result.bytes_copied == result.bytes_total == sum(len(d) for d in files.values())
    assert result.path == result.dest == str(dest)
    assert result.direction == "stage"
    assert result.checksum == "blake2b"
    assert result.workers == 4
    assert oct((dest / "a.txt").stat().st_mode & 0o777) == oct(0o640)
    for rel in files:  # modification times are kept
        assert (dest / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns
    entries = Manifest.load(dest).entries
    assert set(entries) == set(files)
    big = entries["big.bin"]
    assert big.checksum == hashlib.blake2b(files["big.bin"], digest_size=16).hexdigest()
    assert (big.size, big.src) == (BIG, str(src.resolve() / "big.bin"))
    assert leftovers(dest) == []
    assert json.loads(json.dumps(result.to_dict()))["files_copied"] == 45


def test_rerun_skips_up_to_date_and_recopies_changed_files(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _files = tree
    dest = tmp_path / "copy"
    stage(src, dest)
    again = stage(src, dest)
    assert (again.files_copied, again.files_skipped, again.bytes_copied) == (0, 45, 0)
    # Changed content of another size; same size but a new time; a new file.
    (src / "a.txt").write_bytes(b"alpha, longer now\n")
    st = (src / "sub/b.bin").stat()
    new_b = os.urandom(5000)
    (src / "sub/b.bin").write_bytes(new_b)
    os.utime(src / "sub/b.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    (src / "sub/new.txt").write_bytes(b"new")
    third = stage(src, dest)
    assert (third.files_copied, third.files_skipped) == (3, 43)
    assert (dest / "a.txt").read_bytes() == b"alpha, longer now\n"
    assert (dest / "sub/b.bin").read_bytes() == new_b
    assert (dest / "sub/new.txt").read_bytes() == b"new"


def test_a_copy_changed_in_dest_is_copied_again(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    stage(src, dest)
    (dest / "sub/b.bin").write_bytes(b"overwritten by a job")  # new size and time
    (dest / "a.txt").unlink()
    result = stage(src, dest)
    assert result.files_copied == 2
    assert copied_files(dest) == files


def test_files_are_never_deleted_from_dest(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _files = tree
    dest = tmp_path / "copy"
    stage(src, dest)
    (src / "a.txt").unlink()
    result = stage(src, dest)
    assert result.files_skipped == 44
    assert (dest / "a.txt").read_bytes() == b"alpha\n"


def test_no_verify_still_records_checksums(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"x" * 100)
    result = stage(src, tmp_path / "dest", verify=False)
    assert (result.files_copied, result.files_verified) == (1, 0)
    entry = Manifest.load(tmp_path / "dest").entries["x"]
    assert entry.checksum == hashlib.blake2b(b"x" * 100, digest_size=16).hexdigest()


def test_sha256_and_auto_follows_the_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"payload")
    dest = tmp_path / "dest"
    assert stage(src, dest, checksum="sha256").checksum == "sha256"
    assert Manifest.load(dest).entries["x"].checksum == hashlib.sha256(b"payload").hexdigest()
    again = stage(src, dest)  # auto keeps sha256: nothing to copy again
    assert (again.checksum, again.files_skipped) == ("sha256", 1)
    switched = stage(src, dest, checksum="blake2b")  # another algorithm: hashed anew
    assert (switched.checksum, switched.files_copied) == ("blake2b", 1)
    with pytest.raises(ConfigError, match="unknown checksum 'md4'; valid checksums are: auto"):
        stage(src, dest, checksum="md4")


def test_a_single_file(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    src = tmp_path / "home" / "data.h5"
    src.write_bytes(os.urandom(3000))
    dest = tmp_path / "scratch"
    result = stage(src, dest)
    assert result.path == str(dest / "data.h5")
    assert (dest / "data.h5").read_bytes() == src.read_bytes()
    assert stage(src, dest).files_skipped == 1
    with pytest.raises(ConfigError, match="would be the same file"):
        stage(src, tmp_path / "home")


# -- verification: really corrupted bytes ------------------------------------------------


def flip_a_byte(path: str, offset: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def corrupting_copy(bad: str, times: int) -> Callable[..., tuple[int, str]]:
    """The real copy, after which the temporary copy of ``bad`` gets one byte flipped
    (``times`` times): what a damaged disk, cable or network would do."""
    real = _copy.copy_file
    left = {"n": times}

    def copy(src: str, dst: str, *args: object, **kwargs: object) -> tuple[int, str]:
        result = real(src, dst, *args, **kwargs)  # type: ignore[arg-type]
        if src.endswith(bad) and left["n"] > 0:
            left["n"] -= 1
            flip_a_byte(dst)
        return result

    return copy


def test_a_corrupted_copy_is_detected_and_never_named(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    monkeypatch.setattr(_copy, "copy_file", corrupting_copy("sub/b.bin", times=2))
    with pytest.raises(VerificationError) as caught:
        stage(src, dest)
    err = caught.value
    assert [path for path, _ in err.failures] == ["sub/b.bin"]
    assert "the copy does not match the source" in str(err)
    assert "sub/b.bin" in str(err)
    assert "run the same stage again" in str(err)
    assert not (dest / "sub/b.bin").exists()  # a damaged copy never gets the real name
    assert leftovers(dest) == []
    assert err.result is not None
    assert err.result.files_copied == 44
    assert "sub/b.bin" not in Manifest.load(dest).entries
    monkeypatch.undo()
    fixed = stage(src, dest)
    assert (fixed.files_copied, fixed.files_skipped) == (1, 44)
    assert copied_files(dest) == files


def test_one_bad_copy_is_retried(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    monkeypatch.setattr(_copy, "copy_file", corrupting_copy("big.bin", times=1))
    result = stage(src, dest)
    assert copied_files(dest) == files
    assert any("big.bin: copied on the second try" in w for w in result.warnings)


def test_a_source_that_changes_while_copied_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "log.txt").write_bytes(b"first")
    real = _copy.copy_file
    calls = []

    def copy_then_append(s: str, d: str, *args: object, **kwargs: object) -> tuple[int, str]:
        out = real(s, d, *args, **kwargs)  # type: ignore[arg-type]
        calls.append(s)
        if len(calls) == 1:
            with open(s, "ab") as f:
                f.write(b" and more")
        return out

    monkeypatch.setattr(_copy, "copy_file", copy_then_append)
    result = stage(src, tmp_path / "dest")
    assert (tmp_path / "dest/log.txt").read_bytes() == b"first and more"
    assert Manifest.load(tmp_path / "dest").entries["log.txt"].size == 14
    assert len(calls) == 2
    assert any("changed while it was being copied" in w for w in result.warnings)


def test_verify_stage_finds_a_copy_corrupted_later(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    stage(src, dest)
    assert verify_stage(src, dest).files_verified == 45
    # Damage one copy in place and put its time back: a size/time check cannot see it.
    victim = dest / "many/017.dat"
    st = victim.stat()
    flip_a_byte(str(victim), 5)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    (dest / "sub/deeper/c.bin").unlink()
    with pytest.raises(VerificationError) as caught:
        verify_stage(src, dest)
    failures = dict(caught.value.failures)
    assert set(failures) == {"many/017.dat", "sub/deeper/c.bin"}
    assert "checksum differs" in failures["many/017.dat"]
    assert failures["sub/deeper/c.bin"] == "missing"
    assert caught.value.result is not None
    assert caught.value.result.files_verified == 43
    # They were forgotten, so the next stage copies them anew.
    repaired = stage(src, dest)
    assert repaired.files_copied == 2
    assert copied_files(dest) == files
    assert verify_stage(src, dest).files_verified == 45


def test_verify_stage_needs_a_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "dest").mkdir()
    with pytest.raises(ConfigError, match="nothing staged at"):
        verify_stage(src, tmp_path / "dest")


# -- crashes and interruptions -----------------------------------------------------------

CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from paralela.staging import _copy, stage

    def half_then_die(src, dst, *args, **kwargs):
        if src.endswith("big.bin"):
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                fout.write(fin.read(1000))
                fout.flush()
            os._exit(9)  # killed in the middle of writing the copy
        return real(src, dst, *args, **kwargs)

    real = _copy.copy_file
    _copy.copy_file = half_then_die
    stage(sys.argv[1], sys.argv[2], workers=1)
    """
)


def test_a_stage_killed_mid_copy_leaves_the_old_file_then_recovers(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    stage(src, dest)
    new_big = os.urandom(BIG)
    (src / "big.bin").write_bytes(new_big)
    (src / "sub/b.bin").write_bytes(b"changed too")
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(dest)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr.decode()
    # The real name still holds the whole old copy; the half copy is only a temp file.
    assert (dest / "big.bin").read_bytes() == files["big.bin"]
    [half] = leftovers(dest)  # named TMP_PREFIX and a random part, next to big.bin
    assert half.parent == dest
    assert half.stat().st_size == 1000
    assert not Manifest.load(dest).clean
    recovered = stage(src, dest)
    assert recovered.files_copied == 2  # big.bin is the largest, so it was first: b.bin too
    assert (dest / "big.bin").read_bytes() == new_big
    assert (dest / "sub/b.bin").read_bytes() == b"changed too"
    assert leftovers(dest) == []
    assert Manifest.load(dest).clean
    assert verify_stage(src, dest).files_verified == 45


def test_an_interrupted_stage_deletes_unfinished_copies(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, files = tree
    dest = tmp_path / "copy"
    real = _copy.copy_file

    def interrupted(s: str, d: str, *args: object, **kwargs: object) -> tuple[int, str]:
        if s.endswith("sub/b.bin"):
            Path(d).write_bytes(b"partial")
            raise KeyboardInterrupt
        return real(s, d, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_copy, "copy_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stage(src, dest, workers=2)
    assert leftovers(dest) == []
    assert not (dest / "sub/b.bin").exists()
    monkeypatch.undo()
    stage(src, dest)
    assert copied_files(dest) == files


def test_a_torn_manifest_line_is_ignored(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"1")
    dest = tmp_path / "dest"
    stage(src, dest)
    with open(dest / MANIFEST_NAME, "a") as f:
        f.write('{"path": "y", "src": "/nowh')  # a crash in the middle of a line
    assert set(Manifest.load(dest).entries) == {"x"}
    assert stage(src, dest).files_skipped == 1


def test_the_manifest_is_compacted(tmp_path: Path) -> None:
    manifest = Manifest.load(tmp_path)
    manifest.begin()
    for i in range(300):
        manifest.record([Entry("same", "/src/same", i, i, i, "blake2b", "00")])
    manifest.finish(complete=True)
    lines = (tmp_path / MANIFEST_NAME).read_text().splitlines()
    assert len(lines) == 2  # the entry and "end"
    again = Manifest.load(tmp_path)
    assert again.clean
    assert again.entries["same"].size == 299


def test_cleanup_after_a_crash_spares_other_stages(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / f"{TMP_PREFIX}model.pt").write_bytes(b"half")
    (tmp_path / "sub" / f"{TMP_PREFIX}x").write_bytes(b"half")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / LOCK_NAME).write_text("")  # another DEST: may be running
    (tmp_path / "other" / f"{TMP_PREFIX}y").write_bytes(b"in progress")
    assert remove_temporaries(tmp_path) == 2
    assert [p.relative_to(tmp_path).as_posix() for p in leftovers(tmp_path)] == [
        f"other/{TMP_PREFIX}y"
    ]


# -- failures with clear messages --------------------------------------------------------


def test_an_unreadable_file_is_named_and_the_rest_copied(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root here, which chmod cannot stop: the error comes from the copy.
    src, _files = tree
    real = _copy.copy_file

    def denied(s: str, d: str, *args: object, **kwargs: object) -> tuple[int, str]:
        if s.endswith("a.txt"):
            raise PermissionError(errno.EACCES, "Permission denied", s)
        return real(s, d, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_copy, "copy_file", denied)
    dest = tmp_path / "copy"
    with pytest.raises(StageError) as caught:
        stage(src, dest)
    assert not isinstance(caught.value, VerificationError)
    assert caught.value.failures == (("a.txt", "Permission denied"),)
    assert "1 of 45 file(s) could not be staged" in str(caught.value)
    assert "  a.txt: Permission denied" in str(caught.value)
    monkeypatch.undo()
    assert stage(src, dest).files_copied == 1


def test_a_full_disk_stops_the_stage(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _files = tree
    calls = []

    def full(s: str, d: str, *args: object, **kwargs: object) -> tuple[int, str]:
        calls.append(s)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_copy, "copy_file", full)
    with pytest.raises(StageError, match=r"cannot take more files \(No space left on device\)"):
        stage(src, tmp_path / "copy", workers=1)
    assert len(calls) < 45


def test_not_enough_space_is_refused_before_copying(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _files = tree
    real = os.statvfs

    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny() if "copy" in str(p) else real(p))
    with pytest.raises(ConfigError, match=r"not enough space in .*40.0 KiB is free"):
        stage(src, tmp_path / "copy")
    assert copied_files(tmp_path / "copy") == {}


def test_symbolic_links_special_files_and_empty_dirs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "real").mkdir(parents=True)
    (src / "real/file.txt").write_bytes(b"content")
    (src / "link.txt").symlink_to("real/file.txt")
    (src / "linkdir").symlink_to("real")
    (src / "broken").symlink_to("nowhere")
    (src / "real/loop").symlink_to("..")
    os.mkfifo(src / "pipe")
    (src / "empty/nested").mkdir(parents=True)
    result = stage(src, tmp_path / "dest")
    dest = tmp_path / "dest"
    assert (dest / "link.txt").read_bytes() == b"content"  # links are followed
    assert not (dest / "link.txt").is_symlink()
    assert (dest / "empty/nested").is_dir()
    assert not (dest / "broken").exists()
    assert not (dest / "pipe").exists()
    text = "\n".join(result.warnings)
    assert "broken: broken symbolic link (to nowhere), skipped." in text
    assert "pipe: a named pipe, not a regular file; skipped." in text
    assert "a directory reached a second time" in text
    # linkdir and real are the same directory: one is copied, the other is reported.
    assert (dest / "real/file.txt").exists() != (dest / "linkdir/file.txt").exists()


@pytest.mark.parametrize(
    ("src_rel", "dest_rel", "message"),
    [
        ("missing", "dest", "does not exist; nothing to stage"),
        ("data", "data/inside", "overlap"),
        ("data/sub", "data", "overlap"),
        ("data", "a_file", "exists and is not a directory"),
    ],
)
def test_bad_usage_is_a_config_error(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, src_rel: str, dest_rel: str, message: str
) -> None:
    (tmp_path / "a_file").write_bytes(b"")
    with pytest.raises(ConfigError, match=message):
        stage(tmp_path / src_rel, tmp_path / dest_rel)
    with pytest.raises(ConfigError, match="workers must be at least 1"):
        stage(tmp_path / "data", tmp_path / "d", workers=0)


def test_a_second_stage_waits_for_the_lock(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"1")
    dest = tmp_path / "dest"
    dest.mkdir()
    told: list[str] = []
    with hold_lock(dest), pytest.raises(StageError, match="being written by another"):
        stage(src, dest, lock_timeout=0.3, on_wait=told.append)
    assert told == [f"host {socket.gethostname()} pid {os.getpid()}"]
    # Released: a stage waiting in a thread goes on once the holder is done.
    done = threading.Event()
    results: list[StageResult] = []
    with hold_lock(dest):
        waiter = threading.Thread(
            target=lambda: results.append(stage(src, dest, on_wait=lambda h: done.set()))
        )
        waiter.start()
        assert done.wait(10)
    waiter.join(10)
    assert results[0].files_copied == 1


# -- results home, and the default DEST --------------------------------------------------


def test_back_copies_results_home(tmp_path: Path) -> None:
    home = tmp_path / "home" / "results"
    scratch = tmp_path / "scratch" / "results"
    (scratch / "ckpt").mkdir(parents=True)
    (scratch / "metrics.json").write_text('{"acc": 0.9}')
    (scratch / "ckpt/model.pt").write_bytes(os.urandom(4000))
    result = stage(home, scratch, back=True)
    assert result.direction == "back"
    assert result.path == str(home)
    assert (result.source, result.dest) == (str(scratch.resolve()), str(home))
    assert (home / "metrics.json").read_text() == '{"acc": 0.9}'
    assert (home / "ckpt/model.pt").read_bytes() == (scratch / "ckpt/model.pt").read_bytes()
    assert (home / MANIFEST_NAME).exists()
    assert stage(home, scratch, back=True).files_skipped == 2
    (scratch / "metrics.json").write_text('{"acc": 0.95}')
    assert stage(home, scratch, back=True).files_copied == 1
    assert (home / "metrics.json").read_text() == '{"acc": 0.95}'
    assert verify_stage(home, scratch, back=True).files_verified == 2
    with pytest.raises(ConfigError, match="nothing to copy back"):
        stage(tmp_path / "home" / "other", scratch.parent / "other", back=True)


def test_stage_then_back_round_trip_with_default_dest(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_TMPDIR": str(tmp_path / "job7")}
    data = tmp_path / "home/data"
    data.mkdir(parents=True)
    (data / "x.csv").write_text("1,2\n")
    staged = stage(data, env=env)
    assert staged.path == str(stage_root(env) / "data")
    results = Path(staged.path).parent / "results"
    results.mkdir()
    (results / "out.txt").write_text("done")
    back = stage(tmp_path / "home/results", back=True, env=env)
    assert (tmp_path / "home/results/out.txt").read_text() == "done"
    assert back.source == str(results.resolve())


def test_single_file_back_to_a_new_place(tmp_path: Path) -> None:
    env = {"SLURM_TMPDIR": str(tmp_path / "job")}
    root = stage_root(env)
    root.mkdir(parents=True)
    (root / "model.pt").write_bytes(b"weights")
    result = stage(tmp_path / "home/model.pt", back=True, env=env)
    assert (tmp_path / "home/model.pt").read_bytes() == b"weights"
    assert result.path == str(tmp_path / "home/model.pt")


def test_scratch_dir_follows_slurm_then_tmpdir_then_tempfile(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert scratch_dir({"SLURM_TMPDIR": a, "TMPDIR": b, "SLURM_JOB_ID": "1"}) == Path(a)
    assert scratch_dir({"SLURM_JOB_ID": "1", "TMPDIR": b}) == Path(b)
    # Task 1 of a step may have no TMPDIR at all (Slurm 22.05): the temporary directory.
    assert scratch_dir({"SLURM_JOB_ID": "1"}) == Path(tempfile.gettempdir())
    assert scratch_dir({"TMPDIR": b}) == Path(tempfile.gettempdir())  # not a Slurm job
    assert scratch_dir({"SLURM_TMPDIR": ""}) == Path(tempfile.gettempdir())


def test_default_dest_is_per_user(tmp_path: Path) -> None:
    env = {"SLURM_TMPDIR": str(tmp_path)}
    (tmp_path / "ds").mkdir()
    (tmp_path / "f.bin").write_bytes(b"")
    root = default_dest(tmp_path / "f.bin", env)
    assert root.parent == tmp_path
    assert root.name.startswith("paralela-stage-")
    assert default_dest(tmp_path / "ds", env) == root / "ds"
    stage(tmp_path / "ds", env=env)
    assert oct(root.stat().st_mode & 0o777) == oct(0o700)


def test_default_workers() -> None:
    assert 8 <= default_workers() <= 32


# -- the command line --------------------------------------------------------------------


def invoke(*args: str, env: dict[str, str] | None = None) -> object:
    return CliRunner().invoke(app, ["stage", *args], env=env)


def test_cli_prints_the_path_and_a_summary(tmp_path: Path) -> None:
    src = tmp_path / "data"
    make_tree(src)
    env = {"SLURM_TMPDIR": str(tmp_path / "job"), "SLURM_JOB_ID": "3"}
    result = CliRunner().invoke(app, ["stage", str(src)], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{stage_root(env) / 'data'}\n"
    assert "45 file(s) copied" in result.stderr
    assert "45 verified" in result.stderr
    quiet = CliRunner().invoke(app, ["stage", str(src), "-q"], env=env)
    assert (quiet.exit_code, quiet.stderr) == (0, "")


def test_cli_json(tmp_path: Path) -> None:
    src = tmp_path / "data"
    make_tree(src)
    dest = tmp_path / "dest"
    result = CliRunner().invoke(app, ["stage", str(src), str(dest), "--json", "-w", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["files_copied"] == 45
    assert data["workers"] == 3
    assert data["path"] == str(dest)
    assert isinstance(data["warnings"], list)


def test_cli_exit_1_names_the_corrupted_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "data"
    make_tree(src)
    dest = tmp_path / "dest"
    monkeypatch.setattr(_copy, "copy_file", corrupting_copy("sub/deeper/c.bin", times=2))
    result = CliRunner().invoke(app, ["stage", str(src), str(dest), "--json"])
    assert result.exit_code == 1
    assert "sub/deeper/c.bin: the copy does not match the source" in result.stderr
    report = json.loads(result.stdout)
    assert report["failures"] == [["sub/deeper/c.bin", report["failures"][0][1]]]
    assert report["files_copied"] == 44
    monkeypatch.undo()
    assert CliRunner().invoke(app, ["stage", str(src), str(dest)]).exit_code == 0
    flip_a_byte(str(dest / "a.txt"))
    verify = CliRunner().invoke(app, ["stage", str(src), str(dest), "--verify-only"])
    assert verify.exit_code == 1
    assert "a.txt: blake2b checksum differs" in verify.stderr
    ok = CliRunner().invoke(app, ["stage", str(src), str(dest)])
    assert ok.exit_code == 0
    assert "1 file(s) copied" in ok.stderr


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    missing = CliRunner().invoke(app, ["stage", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert "does not exist; nothing to stage" in missing.stderr
    (tmp_path / "d").mkdir()
    both = CliRunner().invoke(app, ["stage", str(tmp_path / "d"), "--verify-only", "--no-verify"])
    assert both.exit_code == 2
    env = {"SLURM_TMPDIR": str(tmp_path / "job")}
    bad = CliRunner().invoke(app, ["stage", str(tmp_path / "d"), "--checksum", "crc"], env=env)
    assert bad.exit_code == 2
    assert "valid checksums are" in bad.stderr
    assert not (tmp_path / "job").exists()  # refused before anything was made
    zero = CliRunner().invoke(app, ["stage", str(tmp_path / "d"), "--workers", "0"])
    assert zero.exit_code == 2


def test_cli_interrupted_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "data"
    make_tree(src)

    def interrupt(*args: object, **kwargs: object) -> tuple[int, str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(_copy, "copy_file", interrupt)
    result = CliRunner().invoke(app, ["stage", str(src), str(tmp_path / "dest")])
    assert result.exit_code == 130
    assert "Interrupted. Finished files are recorded" in result.stderr
    assert leftovers(tmp_path / "dest") == []


def test_cli_help_lists_exit_codes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "paralela", "stage", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    flat = " ".join(proc.stdout.split())
    assert "Exit codes: 0 ok; 1 a file could not be copied or did not verify" in flat
    assert "130 interrupted" in flat
    assert "--back" in flat


# -- on the real local Slurm cluster -----------------------------------------------------

CORRUPT_SCRIPT = """
import json, os, sys
path = os.path.join(json.load(open(sys.argv[1]))["path"], sys.argv[2])
st = os.stat(path)
with open(path, "r+b") as f:
    f.seek(7)
    byte = f.read(1)
    f.seek(7)
    f.write(bytes([byte[0] ^ 0xFF]))
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # a size/time check cannot see it
"""


def run_batch_job(script: str, workdir: Path, timeout: float = 100) -> str:
    """Submit ``script`` with sbatch, wait until it left the queue; its output."""
    path = workdir / "job.sh"
    path.write_text(script)
    job = subprocess.run(
        ["sbatch", "--parsable", "-o", str(workdir / "job-%j.out"), str(path)],
        capture_output=True, text=True, check=True, timeout=30, cwd=workdir,
    ).stdout.strip().split(";")[0]  # fmt: skip
    deadline = time.monotonic() + timeout
    while subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
    ).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], timeout=30, check=False)
            pytest.fail(f"job {job} still queued or running after {timeout} s")
        time.sleep(0.3)
    return (workdir / f"job-{job}.out").read_text()


@pytest.mark.slurm
def test_stage_in_a_slurm_job_verified_and_corruption_found(
    slurm_cluster: str, tmp_path: Path
) -> None:
    src = tmp_path / f"ds-{uuid.uuid4().hex[:12]}"  # the default DEST in /tmp is shared
    files = make_tree(src)
    (tmp_path / "corrupt.py").write_text(CORRUPT_SCRIPT)
    py, out = sys.executable, tmp_path
    stage_cmd = f"{py} -m paralela stage {src}"
    output = run_batch_job(
        f"""#!/bin/bash
#SBATCH -p {slurm_cluster}
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -t 5
unset SLURM_TMPDIR
# Four tasks stage the same data at once: one copies, the others wait, then skip.
srun bash -c 'echo "${{TMPDIR-unset}}" > {out}/tmpdir-$SLURM_PROCID
  {stage_cmd} --json > {out}/task-$SLURM_PROCID.json; echo $? > {out}/rc-$SLURM_PROCID'
srun -N1 -n1 {py} {out}/corrupt.py {out}/task-0.json many/017.dat
srun -N1 -n1 {stage_cmd} --verify-only; echo "verify exit $?"
srun -N1 -n1 {stage_cmd} --json > {out}/repair.json; echo "repair exit $?"
SLURM_TMPDIR={out}/site-scratch srun -N1 -n1 {stage_cmd} -q > {out}/site.txt
""",
        tmp_path,
    )
    tasks = [json.loads((out / f"task-{i}.json").read_text()) for i in range(4)]
    staged = Path(tasks[0]["path"])
    try:
        assert [(out / f"rc-{i}").read_text().strip() for i in range(4)] == ["0"] * 4, output
        assert {t["path"] for t in tasks} == {str(staged)}
        assert staged.name == src.name
        assert staged.parent.name.startswith("paralela-stage-")
        assert sorted(t["files_copied"] for t in tasks) == [0, 0, 0, 45]
        assert all(t["files_copied"] + t["files_skipped"] == 45 for t in tasks)
        # Slurm sets TMPDIR for some tasks only; the others fell back to the same place.
        assert staged.parent.parent == Path(tempfile.gettempdir()), {
            i: (out / f"tmpdir-{i}").read_text() for i in range(4)
        }
        assert "many/017.dat: blake2b checksum differs" in output
        assert "verify exit 1" in output
        assert "repair exit 0" in output
        assert json.loads((out / "repair.json").read_text())["files_copied"] == 1
        assert copied_files(staged) == files
        site = Path((out / "site.txt").read_text().strip())
        assert site.parent.parent == out / "site-scratch"
        assert copied_files(site) == files
    finally:
        shutil.rmtree(staged, ignore_errors=True)
        with contextlib.suppress(OSError):  # only if empty: others may stage there too
            staged.parent.rmdir()
