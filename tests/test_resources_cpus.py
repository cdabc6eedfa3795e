"""CPUs this process may use: affinity, and cgroup v1/v2 quotas read from fake trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paralela.resources import CpuInfo
from paralela.resources._cgroup import cgroup_dirs
from paralela.resources._cpus import cgroup_cpu_quota, detect_cpus

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw,nsdelegate"
V1_CPU_MOUNT = (
    "35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct"
)


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


def test_v2_quota_at_the_leaf(tmp_path: Path) -> None:
    job = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    root = make_tree(
        tmp_path,
        "0::/system.slice/slurmstepd.scope/job_42\n",
        [V2_MOUNT],
        {f"{job}/cpu.max": "150000 100000", "sys/fs/cgroup/system.slice/cpu.max": "max 100000"},
    )
    assert cgroup_cpu_quota(root) == 1.5


def test_v2_smallest_quota_along_the_path_wins(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "0::/a/b\n",
        [V2_MOUNT],
        {"sys/fs/cgroup/a/b/cpu.max": "400000 100000", "sys/fs/cgroup/a/cpu.max": "50000 50000"},
    )
    assert cgroup_cpu_quota(root) == 1.0


def test_v2_max_is_no_quota(tmp_path: Path) -> None:
    root = make_tree(tmp_path, "0::/a\n", [V2_MOUNT], {"sys/fs/cgroup/a/cpu.max": "max 100000"})
    assert cgroup_cpu_quota(root) is None


def test_v1_cfs_quota(tmp_path: Path) -> None:
    leaf = "sys/fs/cgroup/cpu,cpuacct/slurm/uid_1000/job_7"
    root = make_tree(
        tmp_path,
        "5:cpu,cpuacct:/slurm/uid_1000/job_7\n4:memory:/slurm/uid_1000/job_7\n",
        [V1_CPU_MOUNT],
        {f"{leaf}/cpu.cfs_quota_us": "250000", f"{leaf}/cpu.cfs_period_us": "100000"},
    )
    assert cgroup_dirs("cpu", root)[0] == root / leaf
    assert cgroup_cpu_quota(root) == 2.5


def test_v1_minus_one_is_no_quota(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        "5:cpu,cpuacct:/\n",
        [V1_CPU_MOUNT],
        {
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_cpu_quota(root) is None


def test_v1_wins_over_unified_mount_on_hybrid_systems(tmp_path: Path) -> None:
    # Like systemd's hybrid layout: cpu on v1, an empty unified v2 hierarchy beside it.
    unified = "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw"
    root = make_tree(
        tmp_path,
        "5:cpu,cpuacct:/job\n0::/job\n",
        [V1_CPU_MOUNT, unified],
        {
            "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us": "100000",
            "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_cpu_quota(root) == 1.0


def test_container_sees_its_cgroup_as_the_mount_root(tmp_path: Path) -> None:
    # Docker on cgroup v1: the container's cgroup is mounted as the top of the hierarchy.
    mount = "35 31 0:32 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"
    root = make_tree(
        tmp_path,
        "5:cpu:/docker/abc\n",
        [mount],
        {
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_dirs("cpu", root) == [root / "sys/fs/cgroup/cpu"]
    assert cgroup_cpu_quota(root) == 3.0


def test_no_cgroup_information_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_dirs("cpu", tmp_path) == []
    assert cgroup_cpu_quota(tmp_path) is None


@pytest.mark.parametrize(("quota", "usable"), [(None, 8), (2.5, 3), (0.2, 1), (16.0, 8), (4.0, 4)])
def test_usable_is_min_of_affinity_and_rounded_up_quota(quota: float | None, usable: int) -> None:
    info = CpuInfo.from_parts(16, tuple(range(8)), quota)
    assert info.usable == usable
    assert info.usable_ids == tuple(range(usable))


def test_affinity_is_sorted() -> None:
    info = CpuInfo.from_parts(8, (5, 1, 3), None)
    assert info.affinity == (1, 3, 5)
    assert info.usable == 3


def test_detect_cpus_on_this_machine() -> None:
    info = detect_cpus()
    allowed = os.sched_getaffinity(0)
    assert info.affinity == tuple(sorted(allowed))
    assert 1 <= info.usable <= len(allowed)
    assert info.logical == os.cpu_count()


def test_detect_cpus_follows_a_narrowed_affinity() -> None:
    before = os.sched_getaffinity(0)
    first = min(before)
    os.sched_setaffinity(0, {first})
    try:
        info = detect_cpus()
    finally:
        os.sched_setaffinity(0, before)
    assert info.affinity == (first,)
    assert info.usable == 1
