"""Where a stage reads and writes, checked before any file is copied; and the source walk.

::

    stage ~/data            read ~/data/**            write $SCRATCH/paralela-stage-USER/data/
    stage ~/data.h5         read ~/data.h5            write $SCRATCH/paralela-stage-USER/data.h5
    stage --back ~/results  read $SCRATCH/paralela-stage-USER/results/**   write ~/results/

SCRATCH is ``$SLURM_TMPDIR`` (a site convention, set by a prolog on some clusters), else
``$TMPDIR`` inside a Slurm job, else :func:`tempfile.gettempdir` (Slurm 22.05 sets
``TMPDIR`` for the first task of a step only).
"""

from __future__ import annotations

import getpass
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from paralela.errors import ConfigError
from paralela.staging._copy import Job
from paralela.staging._manifest import LOCK_NAME, MANIFEST_NAME, TMP_PREFIX

__all__ = [
    "Listing",
    "Plan",
    "default_dest",
    "job_for",
    "list_dir",
    "make_plan",
    "scratch_dir",
    "stage_root",
]


def scratch_dir(env: Mapping[str, str] | None = None) -> Path:
    """The node-local scratch directory of this job (or this machine's temporary one).

    Args:
        env: the environment to read; ``os.environ`` when ``None``.

    Returns:
        ``$SLURM_TMPDIR`` where set; else ``$TMPDIR`` inside a Slurm job
        (``SLURM_JOB_ID`` set); else :func:`tempfile.gettempdir`.
    """
    env = os.environ if env is None else env
    if env.get("SLURM_TMPDIR"):
        return Path(env["SLURM_TMPDIR"])
    if env.get("SLURM_JOB_ID") and env.get("TMPDIR"):
        return Path(env["TMPDIR"])
    return Path(tempfile.gettempdir())


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        return str(os.getuid())


def stage_root(env: Mapping[str, str] | None = None) -> Path:
    """``SCRATCH/paralela-stage-USER``: per user, as ``/tmp`` is shared by every user."""
    return scratch_dir(env) / f"paralela-stage-{_user()}"


def default_dest(src: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Path:
    """Where ``stage(src)`` copies to by default.

    Returns:
        ``SCRATCH/paralela-stage-USER/NAME`` for a directory (NAME: the last part of
        ``src``), ``SCRATCH/paralela-stage-USER`` (which then holds NAME) for a file.
    """
    path = Path(src).expanduser()
    root = stage_root(env)
    return root if path.is_file() else root / os.path.basename(os.path.abspath(path))


@dataclass(frozen=True)
class Plan:
    """Where one stage reads and writes.

    Attributes:
        read_root: the directory files are read from (symbolic links resolved).
        write_root: the directory files are written to (holds manifest and lock).
        single: the one file's name when SRC is a file; ``None`` for a directory.
        path: the staged directory or file (what the user's program should open).
        back: whether this copies results home.
    """

    read_root: Path
    write_root: Path
    single: str | None
    path: Path
    back: bool


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


def _check_owned(root: Path) -> None:
    """Refuse a default stage root in a shared ``/tmp`` that someone else made."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(
            f"{root} is a symbolic link or belongs to another user; paralela will not "
            "stage into it. Pass DEST explicitly."
        )


def _make_dir(path: Path, what: str, private_parent: Path | None) -> None:
    try:
        if private_parent is not None:
            _check_owned(private_parent)
            private_parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise ConfigError(f"{what} {path} exists and is not a directory.") from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot create {what} {path} ({exc.strerror or exc}); pass a directory you can write."
        ) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable; pass a directory you can write.")


def make_plan(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str] | None,
    *,
    back: bool,
    env: Mapping[str, str] | None = None,
    create: bool = True,
) -> Plan:
    """Check SRC and DEST and work out the directories to read and write.

    Args:
        src: the dataset (a directory or a file) on the home or shared filesystem.
        dest: the copy; default :func:`default_dest`.
        back: copy from DEST to SRC instead.
        env: the environment for :func:`scratch_dir`.
        create: create the directory to be written (``False`` for ``verify_stage``).

    Raises:
        ConfigError: SRC (or, with ``back``, the scratch copy) does not exist or is not a
            file or directory; one of SRC and DEST contains the other; DEST cannot be
            created or written.
    """
    home = Path(os.path.abspath(Path(src).expanduser()))
    private = None if dest is not None else stage_root(env)
    if not back:
        if not home.exists():
            raise ConfigError(f"SRC {home} does not exist; nothing to stage.")
        if not (home.is_dir() or home.is_file()):
            raise ConfigError(f"SRC {home} is neither a directory nor a regular file.")
    if dest is not None:
        scratch = Path(os.path.abspath(Path(dest).expanduser()))
    elif home.exists() or private is None:
        scratch = default_dest(home, env)
    else:  # --back to a SRC not made yet: a file if a file of that name was staged
        scratch = private if (private / home.name).is_file() else private / home.name
    if home.exists():
        single = home.name if home.is_file() else None
    else:
        single = home.name if back and (scratch / home.name).is_file() else None
    if back:
        copy = scratch / single if single else scratch
        if not copy.exists():
            raise ConfigError(
                f"nothing to copy back: {copy} does not exist (was it staged in this job? "
                "node-local scratch is emptied when a job ends)."
            )
    read_root = Path(os.path.realpath(scratch if back else (home.parent if single else home)))
    write_root = (home.parent if single else home) if back else scratch
    if single is None:
        a, b = os.path.realpath(read_root), os.path.realpath(write_root)
        if _inside(a, b) or _inside(b, a):
            raise ConfigError(
                f"SRC {home} and DEST {scratch} overlap (one contains the other); pick a "
                "DEST outside SRC."
            )
    elif os.path.realpath(read_root / single) == os.path.realpath(write_root / single):
        raise ConfigError(f"SRC {home} and its copy would be the same file; pick another DEST.")
    if create:
        _make_dir(write_root, "SRC" if back else "DEST", None if back else private)
    elif not write_root.is_dir():
        raise ConfigError(f"nothing staged at {write_root}: it is not a directory.")
    path = home if back else (scratch / single if single else scratch)
    return Plan(read_root, write_root, single, path, back)


@dataclass
class Listing:
    """What one directory of the source holds (one step of the parallel walk)."""

    jobs: list[Job] = field(default_factory=list)
    subdirs: list[tuple[str, str, tuple[int, int]]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"


def job_for(plan: Plan, rel: str, st: os.stat_result) -> Job:
    """The copy job of the file ``rel`` (relative to both roots), from its ``stat``."""
    return Job(
        rel=rel,
        src=os.path.join(plan.read_root, rel),
        dst=os.path.join(plan.write_root, rel),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        mode=st.st_mode,
    )


def list_dir(plan: Plan, rel: str) -> Listing:
    """List one directory of the source: its files (with ``stat``) and subdirectories.

    Symbolic links are followed (the copy holds the data, not the link). Broken links,
    pipes, sockets and devices are skipped with a warning; an unreadable entry is a
    problem (reported as a failure at the end). The manifest, the lock and temporary
    copies of a staged directory are never copied.
    """
    out = Listing()
    directory = os.path.join(plan.read_root, rel)
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError as exc:
        out.problems.append((rel or ".", f"cannot list the directory: {exc.strerror or exc}"))
        return out
    for entry in entries:
        name = entry.name
        if name.startswith(TMP_PREFIX) or (not rel and name in (MANIFEST_NAME, LOCK_NAME)):
            continue
        path = f"{rel}/{name}" if rel else name
        try:
            st = entry.stat(follow_symlinks=True)
        except FileNotFoundError:
            if entry.is_symlink():
                target = os.readlink(entry.path)
                out.warnings.append(f"{path}: broken symbolic link (to {target}), skipped.")
            continue  # deleted while listed
        except OSError as exc:
            out.problems.append((path, exc.strerror or str(exc)))
            continue
        if stat.S_ISDIR(st.st_mode):
            out.subdirs.append((path, entry.path, (st.st_dev, st.st_ino)))
        elif stat.S_ISREG(st.st_mode):
            out.jobs.append(job_for(plan, path, st))
        else:
            out.warnings.append(f"{path}: {_kind(st.st_mode)}, not a regular file; skipped.")
    return out
