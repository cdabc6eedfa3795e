"""The processes backend's shared memory: arrays a function keeps stay valid, arenas
shrink when idle, every large array arrives read-only, and ``np.memmap`` inputs travel
by reference (the worker maps the file, nothing is copied)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy
import pytest

import paralela
from paralela.backends import ProcessBackend, zero_copy_available

MIB = 2**20
ARENA = "paralela-arena"

pytestmark = pytest.mark.skipif(not zero_copy_available(), reason="no memfd on this platform")

# -- run inside the workers ---------------------------------------------------------

KEPT: list[numpy.ndarray] = []


def keep_and_check(a: numpy.ndarray) -> list[tuple[float, float]]:
    """Keep ``a`` past the call; return (min, max) of every array kept so far."""
    KEPT.append(a)
    return [(float(k.min()), float(k.max())) for k in KEPT]


def forget_kept() -> int:
    KEPT.clear()
    return arena_mappings()


def arena_mappings() -> int:
    """Mappings of arena memory in this process."""
    with open("/proc/self/maps") as maps:
        return sum(ARENA in line for line in maps)


def writeable(a: numpy.ndarray) -> bool:
    return bool(a.flags.writeable)


def mapped_from(a: numpy.ndarray) -> tuple[bool, float, str]:
    """Whether ``a`` is writable, its sum, and the file its memory is a mapping of."""
    return bool(a.flags.writeable), float(a.sum()), mapping_of(a)[0]


def mapping_of(a: numpy.ndarray) -> tuple[str, str]:
    """The file ``a``'s memory is a mapping of, and that file's inode."""
    address = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return (fields[5].strip() if len(fields) > 5 else ""), fields[4]
    return "?", "?"


def mappings_of(path: str) -> int:
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip().endswith(path) for line in maps)


def first(a: numpy.ndarray) -> float:
    return float(a[0])


def fail_on(a: numpy.ndarray) -> None:
    raise ValueError(f"no thanks: {a[:2]}")


def drop_in_a_cycle(a: numpy.ndarray) -> float:
    cycle: list[object] = [a]
    cycle.append(cycle)  # only the garbage collector frees it
    return float(a[0])


# -- in the driver ------------------------------------------------------------------


def arena_bytes(pids: list[int]) -> int:
    """Bytes of every arena open in the processes ``pids`` (each memfd counted once)."""
    sizes: dict[int, int] = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except FileNotFoundError:
            continue
        for name in names:
            link = os.path.join(fd_dir, name)
            try:
                if ARENA in os.readlink(link):
                    st = os.stat(link)
                    sizes[st.st_ino] = st.st_size
            except FileNotFoundError:  # closed meanwhile
                continue
    return sum(sizes.values())


def arena_inodes() -> set[int]:
    """The arenas this process holds open."""
    fd_dir = "/proc/self/fd"
    inodes = set()
    for name in os.listdir(fd_dir):
        link = os.path.join(fd_dir, name)
        try:
            if ARENA in os.readlink(link):
                inodes.add(os.stat(link).st_ino)
        except FileNotFoundError:
            continue
    return inodes


def arena_fds() -> int:
    return len(arena_inodes())


@pytest.fixture
def one_worker() -> Iterator[ProcessBackend]:
    backend = ProcessBackend(1)
    try:
        yield backend
    finally:
        backend.shutdown(wait=True, cancel_futures=True)


# -- 9. an array the function keeps stays valid -------------------------------------


def test_arrays_a_function_keeps_are_never_overwritten(
    one_worker: ProcessBackend, poll: Callable[..., None]
) -> None:
    poll(lambda: len(one_worker.worker_pids()) == 1, what="the worker")
    fds_before = arena_fds()
    arrays = [numpy.full(MIB // 8, float(i)) for i in range(12)]
    futures = [one_worker.submit(keep_and_check, a) for a in arrays]  # queued: slots reused
    for i, future in enumerate(futures):
        seen = future.result(timeout=60)
        assert seen == [(float(j), float(j)) for j in range(i + 1)], f"after item {i}"
    # the driver replaced each retired arena and closed its own handle on the old one
    assert arena_fds() == fds_before
    # once the function lets go of them, the worker unmaps the retired arenas
    assert one_worker.submit(forget_kept).result(timeout=30) <= 2


def test_arrays_nobody_keeps_reuse_their_arena(
    one_worker: ProcessBackend, poll: Callable[..., None]
) -> None:
    poll(lambda: len(one_worker.worker_pids()) == 1, what="the worker")
    arenas = arena_inodes()
    for i in range(6):
        assert one_worker.submit(first, numpy.full(MIB // 8, float(i))).result(timeout=30) == i
        # nor do a failed call (its traceback held the array) or a reference cycle
        with pytest.raises(ValueError, match="no thanks"):
            one_worker.submit(fail_on, numpy.full(MIB // 8, float(i))).result(timeout=30)
        one_worker.submit(drop_in_a_cycle, numpy.full(MIB // 8, float(i))).result(timeout=30)
    assert arena_inodes() == arenas  # never replaced
    assert one_worker.submit(arena_mappings).result(timeout=30) <= 2


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: numpy.zeros(MIB // 8), False),  # contiguous, shared memory
        (lambda: numpy.asfortranarray(numpy.zeros((512, 256))), False),
        (lambda: numpy.zeros((1024, 256))[:, ::2], False),  # strided: same rule
        (lambda: numpy.zeros((4, 8192))[::2, ::2], False),  # strided, 64 KiB exactly
        (lambda: numpy.zeros(100), True),  # small: a private copy
        (lambda: numpy.zeros((64, 64))[:, ::2], True),
    ],
    ids=["contiguous", "fortran", "strided", "strided-64k", "small", "small-strided"],
)
def test_large_arrays_arrive_read_only_whatever_their_layout(
    process_backend: ProcessBackend, make: Callable[[], numpy.ndarray], expected: bool
) -> None:
    assert process_backend.submit(writeable, make()).result(timeout=30) is expected


def test_strided_arrays_arrive_intact(process_backend: ProcessBackend) -> None:
    a = numpy.random.default_rng(0).random((1024, 512))[::3, 1::2]
    _, total, _ = process_backend.submit(mapped_from, a).result(timeout=30)
    assert total == pytest.approx(float(a.sum()))


# -- 14. arenas shrink when idle ------------------------------------------------------


@pytest.mark.slow
def test_arenas_shrink_after_a_map_over_large_arrays(poll: Callable[..., None]) -> None:
    backend = ProcessBackend(2)
    try:
        n = 200 * 10**6 // 8  # 200 MB of float64

        def big() -> Iterator[numpy.ndarray]:
            for i in range(6):
                yield numpy.full(n, float(i))

        assert paralela.map(first, big(), backend=backend) == [float(i) for i in range(6)]
        pids = [os.getpid(), *backend.worker_pids()]
        assert arena_bytes(pids) > 64 * MIB  # they did grow
        poll(lambda: arena_bytes(pids) < 64 * MIB, timeout=1.0, what="the arenas to shrink")
        # shrunk arenas grow again, and the workers map them anew
        small = [numpy.full(MIB // 8, float(i)) for i in range(40)]
        assert paralela.map(first, small, backend=backend) == [float(i) for i in range(40)]
        assert paralela.map(first, big(), backend=backend) == [float(i) for i in range(6)]
    finally:
        backend.shutdown(wait=True)


# -- 16. np.memmap inputs go by reference ---------------------------------------------


@pytest.fixture
def data_file(tmp_path: Path) -> Iterator[tuple[str, numpy.memmap]]:
    path = str(tmp_path / "rows.dat")
    mm = numpy.memmap(path, dtype=numpy.float64, mode="w+", shape=(16, MIB // 8))
    mm[:] = numpy.arange(16.0)[:, None]
    mm.flush()
    yield path, mm
    del mm


def test_memmap_rows_are_mapped_from_their_file(
    process_backend: ProcessBackend, data_file: tuple[str, numpy.memmap]
) -> None:
    path, mm = data_file  # opened w+: writable here
    futures = [process_backend.submit(mapped_from, mm[i]) for i in range(16)]
    for i, future in enumerate(futures):
        is_writeable, total, where = future.result(timeout=30)
        assert (is_writeable, total, where) == (False, float(i) * (MIB // 8), path)
    # the workers map the file once each, not once per item
    assert {process_backend.submit(mappings_of, path).result(timeout=30) for _ in range(4)} == {1}


@pytest.mark.parametrize(
    "select",
    [
        lambda m: m[3:5],
        lambda m: m[:, ::2],  # strided
        lambda m: m[2:9:3, 7:-5],
        lambda m: m.T[5:-5],  # Fortran order
        lambda m: numpy.asarray(m[7]),  # a plain ndarray view of the file
        lambda m: m[4].view(numpy.int64)[100:],
    ],
    ids=["rows", "strided", "strided-offset", "transposed", "ndarray-view", "dtype-view"],
)
def test_memmap_views_arrive_intact_and_by_reference(
    process_backend: ProcessBackend,
    data_file: tuple[str, numpy.memmap],
    select: Callable[[numpy.memmap], numpy.ndarray],
) -> None:
    path, mm = data_file
    a = select(mm)
    is_writeable, total, where = process_backend.submit(mapped_from, a).result(timeout=30)
    assert (is_writeable, where) == (False, path)
    assert total == float(a.sum())


def test_npy_files_opened_with_mmap_mode_go_by_reference(
    process_backend: ProcessBackend, tmp_path: Path
) -> None:
    path = str(tmp_path / "rows.npy")
    numpy.save(path, numpy.arange(8 * MIB // 8, dtype=numpy.float32).reshape(8, -1))
    rows = numpy.load(path, mmap_mode="r+")
    results = paralela.map(mapped_from, [rows[i] for i in range(8)], backend=process_backend)
    assert results == [(False, float(rows[i].sum()), path) for i in range(8)]


def test_a_rewritten_file_is_mapped_again(process_backend: ProcessBackend, tmp_path: Path) -> None:
    path = str(tmp_path / "x.dat")
    for value in (1.0, 2.0):
        Path(path).unlink(missing_ok=True)  # a new file (new inode) under the same name
        mm = numpy.memmap(path, dtype=numpy.float64, mode="w+", shape=(MIB // 8,))
        mm[:] = value
        mm.flush()
        for _ in range(3):
            _, total, _ = process_backend.submit(mapped_from, mm).result(timeout=30)
            assert total == value * (MIB // 8)
        del mm


def test_idle_workers_let_go_of_deleted_files(
    process_backend: ProcessBackend, tmp_path: Path, poll: Callable[..., None]
) -> None:
    path = str(tmp_path / "gone.dat")
    mm = numpy.memmap(path, dtype=numpy.float64, mode="w+", shape=(4, MIB // 8))
    mm[:] = 1.0
    assert paralela.map(first, [mm[i] for i in range(4)], backend=process_backend) == [1.0] * 4
    del mm
    os.unlink(path)

    def still_mapped() -> bool:
        for pid in process_backend.worker_pids():
            with open(f"/proc/{pid}/maps") as maps:
                if any(path in line for line in maps):
                    return True
        return False

    poll(lambda: not still_mapped(), timeout=5.0, what="the workers to unmap the file")


# -- broadcasts: one shared block for every worker ------------------------------------


def broadcast_mapping(data: dict[str, numpy.ndarray]) -> tuple[bool, float, str, str]:
    """Whether the broadcast array is writable, its sum, the mapping it lies in, and that
    mapping's inode (the same block in every worker: the same inode)."""
    a = data["X"]
    return (bool(a.flags.writeable), float(a.sum()), *mapping_of(a))


def test_a_broadcast_data_set_lies_once_in_shared_memory_for_every_worker() -> None:
    """A broadcast's large arrays (paralela.compare's data set) are written once into a
    shared block that each worker maps read-only: two workers, one copy."""
    X = numpy.arange(4 * MIB // 8, dtype=numpy.float64)
    shared = paralela.backends.Broadcast({"X": X, "small": numpy.ones(3)})
    backend = ProcessBackend(workers=2)
    try:
        seen: dict[int, tuple[bool, float, str, str]] = {}
        for _ in range(20):  # until both workers have answered
            futures = [backend.submit(_pid_and_mapping, shared) for _ in range(4)]
            for f in futures:
                pid, found = f.result(timeout=60)
                seen[pid] = found
            if len(seen) == 2:
                break
        assert len(seen) == 2
        for writable, total, name, _ in seen.values():
            assert not writable
            assert total == float(X.sum())
            assert ARENA in name
        assert len({inode for *_, inode in seen.values()}) == 1  # one block for both
    finally:
        backend.shutdown()


def _pid_and_mapping(data: dict[str, numpy.ndarray]) -> tuple[int, tuple[bool, float, str, str]]:
    import time

    time.sleep(0.05)  # let the other worker take the next task
    return os.getpid(), broadcast_mapping(data)
