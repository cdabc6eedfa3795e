"""Filesystems: mount tables with nfs/lustre/tmpfs lines, longest prefix, kinds, statvfs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from paralela.resources import FilesystemInfo
from paralela.resources._filesystems import detect_filesystems, filesystem_kind, filesystem_of
from paralela.resources._mounts import (
    find_mount,
    parse_mountinfo,
    parse_proc_mounts,
    read_mounts,
)

CLUSTER_MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 22 0:23 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=8G
40 22 0:45 / /home rw,relatime shared:30 - nfs4 nas01:/export/home rw,vers=4.2,proto=tcp
41 22 0:46 / /scratch rw,relatime shared:31 master:7 - lustre 10.0.0.1@o2ib:/scratch rw,flock
42 41 0:47 / /scratch/fast rw,relatime shared:32 - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs
43 22 0:48 /data /my\\040data rw,relatime shared:33 - gpfs gpfs1 rw
44 22 0:49 / /mnt/remote rw,relatime - fuse.sshfs ana@host:/ rw,user_id=1000
45 22 0:23 / /tmp rw,nosuid,nodev shared:6 - xfs /dev/nvme0n1 rw
"""


def test_parse_mountinfo_fields() -> None:
    mounts = parse_mountinfo(CLUSTER_MOUNTINFO)
    assert len(mounts) == 9
    home = mounts[3]
    assert (home.mount_point, home.fstype, home.source) == ("/home", "nfs4", "nas01:/export/home")
    assert "vers=4.2" in home.super_options
    lustre = mounts[4]  # has two optional fields before the separator
    assert (lustre.fstype, lustre.source) == ("lustre", "10.0.0.1@o2ib:/scratch")
    gpfs = mounts[6]
    assert (gpfs.root, gpfs.mount_point) == ("/data", "/my data")  # \040 is a space


def test_parse_mountinfo_skips_lines_without_separator() -> None:
    assert parse_mountinfo("garbage line\n\n22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")[0].fstype == (
        "ext4"
    )


@pytest.mark.parametrize(
    ("path", "mount_point", "fstype"),
    [
        ("/home/ana/project", "/home", "nfs4"),
        ("/home", "/home", "nfs4"),
        ("/homework", "/", "ext4"),  # a prefix only at a path boundary
        ("/scratch/ana", "/scratch", "lustre"),
        ("/scratch/fast/run1", "/scratch/fast", "beegfs"),
        ("/my data/x", "/my data", "gpfs"),
        ("/tmp/x", "/tmp", "xfs"),  # the later of two mounts on /tmp covers the first
        ("/usr/lib", "/", "ext4"),
    ],
)
def test_longest_prefix_match(path: str, mount_point: str, fstype: str) -> None:
    mount = find_mount(path, parse_mountinfo(CLUSTER_MOUNTINFO))
    assert mount is not None
    assert (mount.mount_point, mount.fstype) == (mount_point, fstype)


def test_no_mounts_no_match() -> None:
    assert find_mount("/x", []) is None


@pytest.mark.parametrize(
    ("fstype", "kind"),
    [
        ("ext4", "local"),
        ("xfs", "local"),
        ("btrfs", "local"),
        ("overlay", "local"),
        ("zfs", "local"),
        ("tmpfs", "tmpfs"),
        ("ramfs", "tmpfs"),
        ("nfs", "network"),
        ("nfs4", "network"),
        ("lustre", "network"),
        ("gpfs", "network"),
        ("beegfs", "network"),
        ("cifs", "network"),
        ("smb3", "network"),
        ("ceph", "network"),
        ("fuse.sshfs", "network"),
        ("glusterfs", "network"),
        ("pvfs2", "network"),
        ("wekafs", "network"),
        ("proc", "other"),
        ("fuse.portal", "other"),
    ],
)
def test_kinds(fstype: str, kind: str) -> None:
    assert filesystem_kind(fstype) == kind


def test_proc_mounts_fallback(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_text(
        "/dev/sda1 / ext4 rw,relatime 0 0\nnas:/vol /data nfs rw,vers=3 0 0\n"
    )
    mounts = read_mounts(tmp_path)
    assert [(m.mount_point, m.fstype) for m in mounts] == [("/", "ext4"), ("/data", "nfs")]
    assert parse_proc_mounts("short line\n") == []
    assert read_mounts(tmp_path / "nothing") == []


def test_filesystem_of_resolves_links_and_reads_free_space(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    mounts = parse_mountinfo(f"50 1 0:1 / {real} rw - nfs4 server:/x rw\n")
    info = filesystem_of("working", str(link), mounts)
    assert info.path == str(real)
    assert (info.fstype, info.kind, info.mount_point) == ("nfs4", "network", str(real))
    assert info.free_bytes is not None
    assert info.total_bytes is not None
    assert 0 < info.free_bytes <= info.total_bytes


def test_filesystem_of_a_missing_directory_has_no_sizes() -> None:
    info = filesystem_of("scratch", "/no/such/dir", parse_mountinfo(CLUSTER_MOUNTINFO))
    assert (info.fstype, info.free_bytes, info.total_bytes) == ("ext4", None, None)
    assert FilesystemInfo.from_dict(info.to_dict()) == info


def test_detect_filesystems_on_this_machine(tmp_path: Path) -> None:
    found = detect_filesystems(scratch=str(tmp_path))
    assert [f.role for f in found] == ["working", "temporary", "scratch"]
    assert found[0].path == os.path.realpath(os.getcwd())
    assert found[1].path == os.path.realpath(tempfile.gettempdir())
    for fs in found:
        assert fs.fstype  # this machine has a mount table
        assert fs.kind in ("local", "tmpfs", "network", "other")
        assert fs.free_bytes is not None
        assert fs.free_bytes > 0
