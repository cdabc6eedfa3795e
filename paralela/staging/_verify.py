"""``verify_stage``: read every file of a staged copy again and compare it with the manifest."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from paralela.errors import ConfigError
from paralela.staging import _copy
from paralela.staging._manifest import Entry, Manifest, hold_lock
from paralela.staging._plan import make_plan
from paralela.staging._result import StageResult, VerificationError
from paralela.staging._stage import default_workers

__all__ = ["verify_stage"]


def _check_entry(root: str, entry: Entry) -> str:
    """Why the copy of ``entry`` no longer matches its record; ``""`` when it does."""
    path = os.path.join(root, entry.path)
    try:
        size, checksum = _copy.hash_file(path, entry.algorithm)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if size != entry.size:
        return f"size {size}, recorded {entry.size}"
    if checksum != entry.checksum:
        return f"{entry.algorithm} checksum differs from the one recorded when it was copied"
    return ""


def verify_stage(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str] | None = None,
    *,
    back: bool = False,
    workers: int | None = None,
    env: Mapping[str, str] | None = None,
    lock_timeout: float | None = None,
) -> StageResult:
    """Read every file of a staged copy again and compare it with the manifest.

    Args:
        src: SRC as given to :func:`stage`.
        dest: DEST as given to :func:`stage` (default: the same default).
        back: check the copy made home by ``stage(..., back=True)`` (in SRC).
        workers: threads; default :func:`default_workers`.
        env: environment for the default DEST.
        lock_timeout: as for :func:`stage`.

    Returns:
        The files checked (``files_verified``) and their bytes.

    Raises:
        ConfigError: nothing was staged there (no manifest).
        VerificationError: files are missing or differ from what was copied (named).
            They are dropped from the manifest, so the next :func:`stage` copies them
            anew even when their size and modification time look unchanged.
    """
    start = time.monotonic()
    plan = make_plan(src, dest, back=back, env=env, create=False)
    n = workers or default_workers()
    with hold_lock(plan.write_root, lock_timeout):
        manifest = Manifest.load(plan.write_root)
        if not manifest.path.exists():
            raise ConfigError(
                f"nothing staged at {plan.write_root}: it has no manifest "
                f"(.paralela-stage.jsonl). Run paralela stage first."
            )
        entries = list(manifest.entries.values())
        if plan.single is not None:
            entries = [e for e in entries if e.path == plan.single]
        root = str(plan.write_root)
        with ThreadPoolExecutor(n, thread_name_prefix="paralela-verify") as pool:
            reasons = list(pool.map(lambda e: _check_entry(root, e), entries))
        bad = [(e.path, why) for e, why in zip(entries, reasons, strict=True) if why]
        for rel, _why in bad:
            manifest.forget(rel)
        manifest.finish(complete=False)
    result = StageResult(
        source=str(plan.read_root),
        dest=root,
        path=str(plan.path),
        direction="verify",
        files_copied=0,
        files_skipped=0,
        files_verified=len(entries) - len(bad),
        bytes_copied=0,
        bytes_total=sum(e.size for e in entries),
        seconds=time.monotonic() - start,
        workers=n,
        checksum=manifest.algorithm or "blake2b",
    )
    if bad:
        raise VerificationError(
            f"{len(bad)} of {len(entries)} staged file(s) in {root} do not match what was "
            "copied. They were dropped from the manifest: run the same paralela stage "
            "again to copy them anew.",
            bad,
            result,
        )
    return result
