"""Real small filesystems for tests of a full or read-only disk (CI runs as root)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mount_tmpfs(path: Path, options: str) -> None:
    """Mount a tmpfs with ``options`` (``"size=2m"``, ``"ro,size=64k"``) on ``path``;
    skip where this process may not mount (not root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)])
    if done.returncode != 0:
        pytest.skip("this machine does not allow a tmpfs mount")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem is full."""
    with pytest.raises(OSError, match="No space left") as info, open(path, "wb") as f:  # noqa: PT012
        while True:
            f.write(bytes(65536))
    assert info.value.errno == errno.ENOSPC


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs at ``tmp_path / "disk"``, unmounted after the test (skipped
    where this process may not mount one). Offered to every test by conftest."""
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "size=2m")
    yield disk
    unmount(disk)
