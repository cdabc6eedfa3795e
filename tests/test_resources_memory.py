"""Memory: cgroup v1/v2 limits from fake trees, and psutil on the real machine."""

from __future__ import annotations

from pathlib import Path

from paralela.resources import MemoryInfo
from paralela.resources._memory import cgroup_memory, detect_memory

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw"
V1_MEM_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory"
GIB = 1024**3


def make_tree(root: Path, cgroup: str, mountinfo: list[str], files: dict[str, str]) -> Path:
    """A fake '/' holding /proc/self/cgroup, /proc/self/mountinfo and cgroup files."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text("\n".join(mountinfo) + "\n")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def test_v2_limit_and_usage(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "0::/job\n",
        [V2_MOUNT],
        {"sys/fs/cgroup/job/memory.max": str(2 * GIB), "sys/fs/cgroup/job/memory.current": "4096"},
    )
    assert cgroup_memory(root) == (2 * GIB, 4096)


def test_v2_max_is_no_limit(tmp_path: Path) -> None:
    root = make_tree(tmp_path, "0::/job\n", [V2_MOUNT], {"sys/fs/cgroup/job/memory.max": "max"})
    assert cgroup_memory(root) == (None, None)


def test_ancestor_limit_applies(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "0::/user/job\n",
        [V2_MOUNT],
        {
            "sys/fs/cgroup/user/job/memory.max": "max",
            "sys/fs/cgroup/user/job/memory.current": "100",
            "sys/fs/cgroup/user/memory.max": str(GIB),
        },
    )
    assert cgroup_memory(root) == (GIB, 100)


def test_v1_limit_in_bytes(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "4:memory:/slurm/job_9\n",
        [V1_MEM_MOUNT],
        {
            "sys/fs/cgroup/memory/slurm/job_9/memory.limit_in_bytes": str(3 * GIB),
            "sys/fs/cgroup/memory/slurm/job_9/memory.usage_in_bytes": str(GIB),
        },
    )
    assert cgroup_memory(root) == (3 * GIB, GIB)


def test_v1_unlimited_sentinel_is_no_limit(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "4:memory:/\n",
        [V1_MEM_MOUNT],
        {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"},
    )
    assert cgroup_memory(root) == (None, None)


def test_limit_above_physical_memory_is_not_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, "0::/j\n", [V2_MOUNT], {"sys/fs/cgroup/j/memory.max": str(1 << 60)})
    info = detect_memory(root)
    assert info.cgroup_limit is None
    assert info.limit == info.total


def test_limit_below_physical_memory_is_reported(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "0::/j\n",
        [V2_MOUNT],
        {"sys/fs/cgroup/j/memory.max": str(64 * 1024**2), "sys/fs/cgroup/j/memory.current": "0"},
    )
    info = detect_memory(root)
    assert info.cgroup_limit == 64 * 1024**2
    assert info.limit == 64 * 1024**2
    assert info.free <= 64 * 1024**2


def test_free_is_capped_by_the_cgroup_room() -> None:
    info = MemoryInfo(total=16 * GIB, available=10 * GIB, cgroup_limit=4 * GIB, cgroup_usage=GIB)
    assert info.free == 3 * GIB
    assert MemoryInfo(16 * GIB, 10 * GIB, None, None).free == 10 * GIB
    assert MemoryInfo.from_dict(info.to_dict()) == info


def test_detect_memory_on_this_machine() -> None:
    info = detect_memory()
    assert info.total > 0
    assert 0 < info.available <= info.total
    assert 0 < info.free <= info.total
