"""The filesystems of the working, temporary and scratch directories, and their kind.

Where files live decides how they behave under load: a network filesystem (NFS,
Lustre, GPFS...) shared by many nodes is slow at many small files and at locking; a
tmpfs is fast but eats memory; a local disk is neither shared nor slow.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from paralela.resources._mounts import Mount, find_mount, read_mounts

__all__ = ["FilesystemInfo", "detect_filesystems", "filesystem_kind", "filesystem_of"]

_LOCAL = frozenset(
    {
        "ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "zfs", "f2fs", "jfs", "reiserfs",
        "bcachefs", "vfat", "exfat", "ntfs", "ntfs3", "fuseblk", "squashfs", "erofs", "iso9660",
    }
)  # fmt: skip
_TMPFS = frozenset({"tmpfs", "ramfs"})
_NETWORK = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph",
        "fuse.ceph", "fuse.cephfs", "fuse.sshfs", "glusterfs", "fuse.glusterfs", "pvfs2",
        "orangefs", "wekafs", "panfs", "afs", "ocfs2", "fuse.s3fs", "fuse.gcsfuse",
        "fuse.rclone", "fuse.juicefs", "fuse.lustre", "fuse.beegfs",
    }
)  # fmt: skip


def filesystem_kind(fstype: str) -> str:
    """Classify a filesystem type.

    Args:
        fstype: the type as the mount table gives it (``ext4``, ``nfs4``, ``fuse.sshfs``).

    Returns:
        ``"local"``, ``"tmpfs"``, ``"network"`` or ``"other"``.
    """
    if fstype in _LOCAL:
        return "local"
    if fstype in _TMPFS:
        return "tmpfs"
    if fstype in _NETWORK:
        return "network"
    return "other"


@dataclass(frozen=True)
class FilesystemInfo:
    """The filesystem that holds a directory.

    Attributes:
        role: what the directory is to paralela: ``"working"``, ``"temporary"`` or
            ``"scratch"`` (the Slurm job's node-local directory).
        path: the directory, resolved (``os.path.realpath``).
        mount_point: where its filesystem is mounted (``""`` when unknown).
        fstype: the filesystem type (``""`` when unknown).
        kind: ``"local"``, ``"tmpfs"``, ``"network"`` or ``"other"``.
        source: the device or server (``/dev/sda1``, ``server:/export``).
        free_bytes: space left for this user, ``None`` when it cannot be read.
        total_bytes: size of the filesystem, ``None`` when it cannot be read.
    """

    role: str
    path: str
    mount_point: str
    fstype: str
    kind: str
    source: str
    free_bytes: int | None
    total_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FilesystemInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        return cls(**data)


def filesystem_of(role: str, path: str, mounts: list[Mount]) -> FilesystemInfo:
    """Describe the filesystem that holds ``path``.

    Args:
        role: the directory's role, copied into the result.
        path: the directory; it is resolved first, so symbolic links lead to their target.
        mounts: the mount table (:func:`paralela.resources._mounts.read_mounts`).

    Returns:
        The filesystem; ``fstype`` is ``""`` and ``kind`` ``"other"`` when no mount
        holds the path, and the sizes are ``None`` when ``os.statvfs`` fails (for
        example a directory that does not exist yet).
    """
    real = os.path.realpath(path)
    mount = find_mount(real, mounts)
    free = total = None
    try:
        st = os.statvfs(real)
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        pass
    return FilesystemInfo(
        role=role,
        path=real,
        mount_point=mount.mount_point if mount else "",
        fstype=mount.fstype if mount else "",
        kind=filesystem_kind(mount.fstype) if mount else "other",
        source=mount.source if mount else "",
        free_bytes=free,
        total_bytes=total,
    )


def detect_filesystems(
    scratch: str | None = None, root: str | os.PathLike[str] = "/"
) -> tuple[FilesystemInfo, ...]:
    """Describe the filesystems of the working, the temporary and the scratch directory.

    Args:
        scratch: the Slurm job's node-local directory, if any.
        root: the directory that stands for ``/`` when reading the mount table.

    Returns:
        One entry per directory: working (``os.getcwd()``), temporary
        (``tempfile.gettempdir()``), and scratch when given.
    """
    import tempfile

    mounts = read_mounts(root)
    dirs = [("working", os.getcwd()), ("temporary", tempfile.gettempdir())]
    if scratch:
        dirs.append(("scratch", scratch))
    return tuple(filesystem_of(role, path, mounts) for role, path in dirs)
