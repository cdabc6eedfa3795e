"""The run store: atomic files, the manifest claim, fingerprints, overlapping chunks, and
several processes writing one directory; then resuming ``map`` through it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import paralela
from paralela import _files
from paralela._files import TMP_PREFIX, atomic_write, create_exclusive
from paralela.errors import FingerprintMismatchError, MapError, RunStoreError
from paralela.runs import RunStore, StoredChunk
from paralela.runs._fingerprint import digest_items, fingerprint_function

IDENTITY = {"function": "f1"}


def store_at(path: Path, identity: dict[str, str] | None = None) -> RunStore:
    return RunStore(path, identity or IDENTITY, {"kind": "test", "function_name": "f"})


def chunk(start: int, end: int) -> StoredChunk:
    items = list(range(start, end))
    return StoredChunk(start, end, digest_items(items), [i * 10 for i in items], {"worker": "w"})


def temp_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(TMP_PREFIX)]


def record_square(x: int, log: str) -> int:
    with open(log, "a") as f:
        f.write(f"{x}\n")
    return x * x


def record_cube(x: int, log: str) -> int:
    with open(log, "a") as f:
        f.write(f"{x}\n")
    return x**3


def record_or_fail(x: int, log: str, poison: str) -> int:
    if x == 5 and os.path.exists(poison):
        raise ValueError("poisoned")
    with open(log, "a") as f:
        f.write(f"{x}\n")
    return x * x


def logged(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


# -- atomic files --------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert temp_files(tmp_path) == []


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    atomic_write(target, b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert temp_files(tmp_path) == []


def test_create_exclusive_lets_one_writer_win(tmp_path: Path) -> None:
    target = tmp_path / "claim"
    assert create_exclusive(target, b"first") is True
    assert create_exclusive(target, b"second") is False
    assert target.read_bytes() == b"first"
    assert temp_files(tmp_path) == []


# -- the manifest ------------------------------------------------------------------


def test_a_new_store_claims_the_directory(tmp_path: Path) -> None:
    store = store_at(tmp_path / "run")
    manifest = json.loads(store.manifest_path.read_text())
    assert manifest["identity"] == IDENTITY
    assert manifest["kind"] == "test"
    assert manifest["format"] == 1
    assert manifest["paralela"] == paralela.__version__
    assert (tmp_path / "run" / "chunks").is_dir()


def test_the_same_identity_reopens_the_directory(tmp_path: Path) -> None:
    store_at(tmp_path)
    store_at(tmp_path).write(chunk(0, 5))
    assert list(store_at(tmp_path).finished()) == [0]


def test_another_identity_is_a_fingerprint_mismatch(tmp_path: Path) -> None:
    store_at(tmp_path, {"function": "f1", "shared": "s1"})
    with pytest.raises(FingerprintMismatchError) as info:
        store_at(tmp_path, {"function": "f2", "shared": "s1"})
    text = str(info.value)
    assert "holds results of another computation: function differ" in text
    assert "it was made for f" in text
    assert "Pass a new run_dir=" in text


def test_an_unreadable_manifest_is_a_run_store_error(tmp_path: Path) -> None:
    (tmp_path / "chunks").mkdir()
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunStoreError, match=r"unreadable manifest\.json"):
        store_at(tmp_path)


def test_a_directory_that_cannot_be_made_is_a_run_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunStoreError, match="Cannot create the run directory"):
        store_at(tmp_path / "file" / "run")


def test_racing_claims_have_exactly_one_winner(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def claim(i: int) -> None:
        barrier.wait()
        try:
            store_at(tmp_path, {"function": f"f{i}"})
            outcomes.append("won")
        except FingerprintMismatchError:
            outcomes.append("lost")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert temp_files(tmp_path) == []


# -- chunks ------------------------------------------------------------------------


def test_chunks_round_trip(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.write(chunk(0, 5))
    store.write(chunk(5, 9))
    finished = store.finished()
    assert [(r.start, r.end) for r in finished.values()] == [(0, 5), (5, 9)]
    loaded = store.load(finished[5])
    assert loaded == chunk(5, 9)


def test_overlapping_chunks_resolve_to_disjoint_ranges(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    for start, end in [(0, 10), (5, 15), (0, 4), (10, 20), (20, 25), (22, 30), (25, 30)]:
        store.write(chunk(start, end))
    ranges = [(r.start, r.end) for r in store.finished().values()]
    assert ranges == [(0, 4), (5, 15), (20, 25), (25, 30)]
    covered = [i for start, end in ranges for i in range(start, end)]
    assert len(covered) == len(set(covered))  # each item once


def test_temp_and_foreign_files_are_ignored(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.write(chunk(0, 5))
    (store.chunks_dir / f"{TMP_PREFIX}host-1-abc").write_bytes(b"half a chunk")
    (store.chunks_dir / "000000000005-000000000009.pkl.bak").write_bytes(b"")
    (store.chunks_dir / "notes.txt").write_text("mine")
    assert [(r.start, r.end) for r in store.finished().values()] == [(0, 5)]


def test_clean_temporaries_removes_only_old_ones(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    old = store.chunks_dir / f"{TMP_PREFIX}host-1-old"
    fresh = store.chunks_dir / f"{TMP_PREFIX}host-2-fresh"
    top = tmp_path / f"{TMP_PREFIX}host-3-old"
    for path in (old, fresh, top):
        path.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    os.utime(top, (two_hours_ago, two_hours_ago))
    store.clean_temporaries(older_than=3600)
    assert not old.exists()
    assert not top.exists()
    assert fresh.exists()  # a live writer elsewhere may own it


def test_a_corrupt_chunk_says_which_file_to_delete(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    (store.chunks_dir / "000000000000-000000000005.pkl").write_bytes(b"garbage")
    (record,) = store.finished().values()
    with pytest.raises(RunStoreError, match=r"000000000000-000000000005\.pkl .*Delete that file"):
        store.load(record)


def test_a_foreign_pickle_is_refused(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    (store.chunks_dir / "000000000000-000000000005.pkl").write_bytes(pickle.dumps([1, 2]))
    (record,) = store.finished().values()
    with pytest.raises(RunStoreError, match="not a paralela chunk file"):
        store.load(record)


def test_a_chunk_with_fewer_results_than_its_range_names_the_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paralela.map(_triple, range(20), workers=2, chunksize=5, run_dir=run_dir)
    damaged = run_dir / "chunks" / "000000000005-000000000010.pkl"
    stored = pickle.loads(damaged.read_bytes())
    damaged.write_bytes(pickle.dumps(StoredChunk(5, 10, stored.input_digest, [15, 18, 21], {})))
    with pytest.raises(RunStoreError) as info:  # was 18 results for 20 items, shifted
        paralela.map(_triple, range(20), workers=2, chunksize=5, run_dir=run_dir)
    assert type(info.value) is RunStoreError
    assert str(damaged) in str(info.value)
    assert "holds 3 results for the 5 items 5..9" in str(info.value)
    assert "Delete that file and run again" in str(info.value)


def test_a_chunk_whose_range_differs_from_its_name_names_the_file(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    (store.chunks_dir / "000000000000-000000000005.pkl").write_bytes(pickle.dumps(chunk(5, 10)))
    (record,) = store.finished().values()
    with pytest.raises(RunStoreError, match=r"000000000000-000000000005\.pkl holds items 5\.\.9"):
        store.load(record)


@pytest.mark.parametrize(
    "text",
    ["[]", '"f1"', '{"format": 1}', '{"identity": "f1"}', '{"identity": {"function": 3}}'],
)
def test_a_manifest_of_the_wrong_shape_names_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "chunks").mkdir()
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(RunStoreError) as info:
        store_at(tmp_path)
    assert type(info.value) is RunStoreError
    assert f"{tmp_path / 'manifest.json'} is not a paralela run manifest" in str(info.value)
    assert "Move it away or pass another run_dir=" in str(info.value)


# -- read-only media -------------------------------------------------------------------


@contextlib.contextmanager
def read_only_media(where: Path) -> Iterator[Callable[[], None]]:
    """A directory at ``where`` and a function that makes it read-only.

    Permission bits do not stop root (as in CI), so there the directory is a tmpfs
    remounted read-only; otherwise ``chmod a-w`` on everything in it.
    """
    where.mkdir()
    if os.geteuid() != 0:

        def chmod_read_only() -> None:
            for path in [where, *where.rglob("*")]:
                path.chmod(path.stat().st_mode & ~0o222)

        try:
            yield chmod_read_only
        finally:
            for path in [where, *where.rglob("*")]:
                path.chmod(path.stat().st_mode | 0o200)
        return
    mount = shutil.which("mount")
    mounted = (
        mount is not None
        and subprocess.run(
            [mount, "-t", "tmpfs", "-o", "size=16m", "paralela-test", str(where)],
            capture_output=True,
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip(
            "running as root, which permission bits do not stop, without the right to "
            "mount a tmpfs to make read-only"
        )
    try:
        yield lambda: subprocess.run([mount, "-o", "remount,ro", str(where)], check=True)  # type: ignore[list-item]
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_finished_run_on_read_only_media_can_be_read_back(tmp_path: Path) -> None:
    with read_only_media(tmp_path / "media") as make_read_only:
        run_dir = tmp_path / "media" / "run"
        first = paralela.map(_triple, range(20), workers=2, chunksize=5, run_dir=run_dir)
        summary_before = (run_dir / "summary.json").read_bytes()
        make_read_only()
        again = paralela.map(_triple, range(20), workers=2, chunksize=5, run_dir=run_dir)
        assert again == first == [3 * x for x in range(20)]
        assert (again.summary.computed_items, again.summary.resumed_items) == (0, 20)
        assert (run_dir / "summary.json").read_bytes() == summary_before  # left as it was
        with pytest.raises(FingerprintMismatchError):  # still checked, without writing
            paralela.map(_add_shared, range(20), shared=1, workers=2, run_dir=run_dir)


def test_new_results_on_read_only_media_are_a_run_store_error(tmp_path: Path) -> None:
    with read_only_media(tmp_path / "media") as make_read_only:
        run_dir = tmp_path / "media" / "run"
        paralela.map(_triple, range(10), workers=2, chunksize=5, run_dir=run_dir)
        make_read_only()
        with pytest.raises(RunStoreError) as info:  # items 10..14 cannot be stored
            paralela.map(_triple, range(15), workers=2, chunksize=5, run_dir=run_dir)
        assert type(info.value) is RunStoreError
        assert f"Cannot write {run_dir / 'chunks'}" in str(info.value)
        assert "pass a run_dir= on writable storage" in str(info.value)
        with pytest.raises(RunStoreError, match="Cannot create the run directory"):
            store_at(tmp_path / "media" / "another")


def _triple(x: int) -> int:
    return 3 * x


# -- fingerprints --------------------------------------------------------------------


def test_fingerprint_follows_the_code_not_the_position() -> None:
    namespace: dict[str, object] = {}
    exec("def f(x):\n    return x + 1\n", namespace)
    first = fingerprint_function(namespace["f"])
    exec("\n\n\ndef f(x):\n    return x + 1\n", namespace)  # moved down the file
    assert fingerprint_function(namespace["f"]) == first
    exec("def f(x):\n    return x + 2\n", namespace)  # edited
    assert fingerprint_function(namespace["f"]) != first


def test_fingerprint_of_a_closure_follows_its_captured_values() -> None:
    def scaled(factor: int) -> Callable[[int], int]:
        return lambda x: x * factor

    assert fingerprint_function(scaled(2)) == fingerprint_function(scaled(2))
    assert fingerprint_function(scaled(2)) != fingerprint_function(scaled(3))


# -- resuming map through a run directory --------------------------------------------


def test_running_again_computes_nothing(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    fn = functools.partial(record_square, log=str(log))
    first = paralela.map(fn, range(40), workers=2, chunksize=4, run_dir=run_dir)
    assert sorted(logged(log)) == list(range(40))
    second = paralela.map(fn, range(40), workers=2, chunksize=4, run_dir=run_dir)
    assert second == first == [i * i for i in range(40)]
    assert (second.summary.computed_items, second.summary.resumed_items) == (0, 40)
    assert sorted(logged(log)) == list(range(40))  # nothing ran again
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_items"] == 40


def test_a_missing_chunk_is_all_that_is_computed_again(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    fn = functools.partial(record_square, log=str(log))
    paralela.map(fn, range(40), workers=2, chunksize=4, run_dir=run_dir)
    (run_dir / "chunks" / "000000000012-000000000016.pkl").unlink()
    log.unlink()
    again = paralela.map(fn, range(40), workers=2, chunksize=3, run_dir=run_dir)
    assert again == [i * i for i in range(40)]
    assert sorted(logged(log)) == [12, 13, 14, 15]
    assert (again.summary.computed_items, again.summary.resumed_items) == (4, 36)
    ranges = [(r.start, r.end) for r in store_at_any(run_dir).finished().values()]
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(40))  # new chunks fit the gap; no overlap


def test_failed_items_are_not_stored_and_run_again(tmp_path: Path) -> None:
    run_dir, log, poison = tmp_path / "run", tmp_path / "log", tmp_path / "poison"
    poison.touch()
    fn = functools.partial(record_or_fail, log=str(log), poison=str(poison))
    with pytest.raises(MapError):
        paralela.map(fn, range(20), workers=2, chunksize=4, on_error="collect", run_dir=run_dir)
    poison.unlink()
    log.unlink()
    again = paralela.map(fn, range(20), workers=2, chunksize=4, run_dir=run_dir)
    assert again == [i * i for i in range(20)]
    assert sorted(logged(log)) == [4, 5, 6, 7]  # only the chunk that failed


def test_another_function_is_refused_before_any_work(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    paralela.map(
        functools.partial(record_square, log=str(log)), range(10), workers=2, run_dir=run_dir
    )
    log.unlink()
    with pytest.raises(FingerprintMismatchError, match="function differ"):
        paralela.map(
            functools.partial(record_cube, log=str(log)), range(10), workers=2, run_dir=run_dir
        )
    assert not log.exists()


def test_other_inputs_are_refused_before_any_work(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    fn = functools.partial(record_square, log=str(log))
    paralela.map(fn, range(10), workers=2, chunksize=5, run_dir=run_dir)
    log.unlink()
    with pytest.raises(FingerprintMismatchError, match=r"Items 0\.\.4 differ"):
        paralela.map(fn, range(100, 110), workers=2, chunksize=5, run_dir=run_dir)
    assert not log.exists()
    with pytest.raises(FingerprintMismatchError, match="the input is shorter"):
        paralela.map(fn, range(7), workers=2, chunksize=5, run_dir=run_dir)


def test_other_shared_data_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paralela.map(_add_shared, range(5), workers=2, shared=1, run_dir=run_dir)
    with pytest.raises(FingerprintMismatchError, match="shared differ"):
        paralela.map(_add_shared, range(5), workers=2, shared=2, run_dir=run_dir)


def test_a_longer_input_computes_only_the_new_items(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    fn = functools.partial(record_square, log=str(log))
    paralela.map(fn, range(10), workers=2, chunksize=5, run_dir=run_dir)
    log.unlink()
    longer = paralela.map(fn, range(15), workers=2, chunksize=5, run_dir=run_dir)
    assert longer == [i * i for i in range(15)]
    assert sorted(logged(log)) == list(range(10, 15))


# -- several processes, one directory ---------------------------------------------

HELPER = """
import time


def slow_triple(x):
    time.sleep(0.003)
    return 3 * x
"""

WRITER = """
import json
import sys

import paralela
import runs_helper

results = paralela.map(
    runs_helper.slow_triple,
    range(int(sys.argv[2])),
    backend="threads",
    workers=2,
    chunksize=int(sys.argv[3]),
    run_dir=sys.argv[1],
)
print(json.dumps(list(results)))
"""


def test_several_processes_can_write_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 120
    (tmp_path / "runs_helper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "writer.py").write_text(textwrap.dedent(WRITER))
    run_dir = tmp_path / "run"
    writers = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "writer.py"), str(run_dir), str(n), str(size)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
        )
        for size in (3, 4, 5, 7)  # different chunk sizes: overlapping ranges on disk
    ]
    for writer in writers:
        out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0
        assert json.loads(out) == [3 * x for x in range(n)]
    assert temp_files(run_dir) == []
    assert temp_files(run_dir / "chunks") == []

    monkeypatch.syspath_prepend(str(tmp_path))
    import runs_helper  # the same function, so the same fingerprint

    store = store_at_any(run_dir)
    ranges = [(r.start, r.end) for r in store.finished().values()]
    covered = [i for start, end in ranges for i in range(start, end)]
    assert len(covered) == len(set(covered))  # what resume reads is disjoint
    again = paralela.map(runs_helper.slow_triple, range(n), backend="threads", run_dir=run_dir)
    assert again == [3 * x for x in range(n)]
    assert again.summary.resumed_items == len(covered)
    assert again.summary.computed_items == n - len(covered)


def _add_shared(x: int, shared: int) -> int:
    return x + shared


def store_at_any(run_dir: Path) -> RunStore:
    """Open a run directory whatever it was made for (to read its chunks)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return RunStore(run_dir, manifest["identity"], {})


def test_fingerprint_of_a_recursive_or_unpicklable_closure() -> None:
    lock = threading.Lock()

    def countdown(n: int) -> int:
        with lock:
            pass
        return 0 if n == 0 else countdown(n - 1)

    assert fingerprint_function(countdown) == fingerprint_function(countdown)
