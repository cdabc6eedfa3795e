"""The mount table of this process: parsing ``/proc/self/mountinfo`` (or ``/proc/mounts``).

Both the filesystem report and the cgroup readers use it. Every reader takes a ``root``
directory (``/`` on a live system) so that tests can point it at a fake tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mount", "find_mount", "parse_mountinfo", "parse_proc_mounts", "read_mounts"]

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of the mount table.

    Attributes:
        root: the directory of the mounted filesystem that appears at ``mount_point``
            (``/`` for a whole filesystem; a sub-path for bind mounts and cgroups).
        mount_point: where it is mounted, as this process sees it.
        fstype: the filesystem type (``ext4``, ``nfs4``, ``cgroup2``, ``fuse.sshfs``...).
        source: the device or server (``/dev/sda1``, ``server:/export``).
        super_options: the per-filesystem options (for cgroup v1: the controllers).
    """

    root: str
    mount_point: str
    fstype: str
    source: str
    super_options: tuple[str, ...]


def _unescape(field: str) -> str:
    """Decode the kernel's octal escapes (``\\040`` is a space) in a mount table field."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse the text of ``/proc/<pid>/mountinfo``.

    A line reads ``id parent major:minor root mount-point options [optional...] - fstype
    source super-options``. Lines that do not have this shape are skipped: the file is
    written by the kernel, and one odd line should not hide the others.

    Args:
        text: the whole file.

    Returns:
        The mounts in file order (later mounts cover earlier ones at the same point).
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3:
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
                super_options=tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else (),
            )
        )
    return mounts


def parse_proc_mounts(text: str) -> list[Mount]:
    """Parse the text of ``/proc/mounts`` (``source mount-point fstype options 0 0``).

    This older format has no ``root`` field; it is taken as ``/``.

    Args:
        text: the whole file.

    Returns:
        The mounts in file order.
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mounts.append(
            Mount(
                root="/",
                mount_point=_unescape(fields[1]),
                fstype=fields[2],
                source=_unescape(fields[0]),
                super_options=tuple(fields[3].split(",")),
            )
        )
    return mounts


def read_mounts(root: str | os.PathLike[str] = "/") -> list[Mount]:
    """Read this process's mount table from ``<root>/proc/self/mountinfo``.

    Falls back to ``<root>/proc/mounts`` when mountinfo is missing (very old kernels).

    Args:
        root: the directory that stands for ``/``; tests pass a fake tree.

    Returns:
        The mounts, or an empty list where neither file exists (no ``/proc``): callers
        then report the filesystem type as unknown.
    """
    base = Path(root)
    try:
        return parse_mountinfo((base / "proc/self/mountinfo").read_text())
    except FileNotFoundError:
        pass
    try:
        return parse_proc_mounts((base / "proc/mounts").read_text())
    except FileNotFoundError:
        return []


def find_mount(path: str, mounts: list[Mount]) -> Mount | None:
    """Find the mount that holds ``path``: the longest mount point that is a prefix of it.

    Args:
        path: an absolute path, already resolved (``os.path.realpath``).
        mounts: the mount table, in file order; of several mounts on the same point
            the last one wins, as it covers the others.

    Returns:
        The mount, or ``None`` if no mount point is a prefix (an empty table).
    """
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best
