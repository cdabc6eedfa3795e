"""Where this process's cgroup limits live, for cgroup v2 and v1.

::

    /proc/self/cgroup         0::/user.slice/job.scope       (v2)
                              4:memory:/slurm/uid_1/job_7    (v1, one line per hierarchy)
    /proc/self/mountinfo      ... /sys/fs/cgroup ... - cgroup2 cgroup2 rw
                              ... /sys/fs/cgroup/memory ... - cgroup cgroup rw,memory
          │
          ▼
    cgroup_dirs("memory")  →  [<mount>/slurm/uid_1/job_7, <mount>/slurm/uid_1,
                               <mount>/slurm, <mount>]          (leaf first)

A limit set on any ancestor applies too, so readers take the smallest limit along the
path. Every reader takes a ``root`` directory (``/`` on a live system) for tests.
"""

from __future__ import annotations

import os
from pathlib import Path

from paralela.resources._mounts import Mount, read_mounts

__all__ = ["cgroup_dirs", "read_int_file", "read_text_file"]


def _proc_cgroup_lines(root: Path) -> list[tuple[str, tuple[str, ...], str]]:
    """Parse ``/proc/self/cgroup`` into (hierarchy id, controllers, cgroup path)."""
    try:
        text = (root / "proc/self/cgroup").read_text()
    except FileNotFoundError:
        return []
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        lines.append((hier, tuple(c for c in controllers.split(",") if c), path))
    return lines


def _leaf_dir(root: Path, mount: Mount, cgroup_path: str) -> tuple[Path, Path]:
    """Map a cgroup path onto the mounted hierarchy; returns (leaf, mount directory)."""
    top = root / mount.mount_point.lstrip("/")
    mount_root = mount.root.rstrip("/")
    if cgroup_path == mount.root or cgroup_path.startswith(mount_root + "/"):
        rel = cgroup_path[len(mount_root) :].strip("/")
    else:
        # Inside some containers the cgroup path is not below the mounted root (the
        # container sees only its own cgroup, mounted as the top): use the top.
        rel = ""
    if ".." in rel.split("/"):
        rel = ""
    return (top / rel if rel else top), top


def cgroup_dirs(controller: str, root: str | os.PathLike[str] = "/") -> list[Path]:
    """The cgroup directories whose ``controller`` limits apply to this process.

    A controller attached to a v1 hierarchy is looked up there; otherwise the v2
    (unified) hierarchy is used. Directories are listed from this process's own cgroup
    up to the top of the mounted hierarchy; the caller reads whichever limit files
    exist in them.

    Args:
        controller: ``"cpu"`` or ``"memory"``.
        root: the directory that stands for ``/``.

    Returns:
        The directories, leaf first; empty when there is no cgroup information.
    """
    base = Path(root)
    lines = _proc_cgroup_lines(base)
    mounts = read_mounts(base)
    for _hier, controllers, path in lines:
        if controller in controllers:
            for mount in reversed(mounts):
                if mount.fstype == "cgroup" and controller in mount.super_options:
                    return _walk_up(*_leaf_dir(base, mount, path))
    for hier, controllers, path in lines:
        if hier == "0" and not controllers:
            for mount in reversed(mounts):
                if mount.fstype == "cgroup2":
                    return _walk_up(*_leaf_dir(base, mount, path))
    return []


def _walk_up(leaf: Path, top: Path) -> list[Path]:
    dirs = [leaf]
    while dirs[-1] != top and top in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def read_text_file(path: Path) -> str | None:
    """The stripped content of a cgroup file, or ``None`` when it does not exist or cannot
    be read (a controller not enabled at that level, or no permission)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_int_file(path: Path) -> int | None:
    """A cgroup file holding one integer; ``None`` when absent, ``max`` or not a number.

    The files are written by the kernel; a value that cannot be read sets no limit.
    """
    text = read_text_file(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
