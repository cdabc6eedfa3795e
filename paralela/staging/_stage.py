"""``stage``: copy a dataset to node-local scratch (or results home) with a pool of threads.

::

    make_plan ─ SRC, DEST checked (ConfigError before anything is copied)
    lock DEST ─ one stage at a time; load the manifest; clean up after a killed stage
    walk SRC  ─ one directory per task, in the threads (listing a network filesystem is
                a round trip per call, so it pays to overlap them)
    space     ─ enough free space in DEST for what is not up to date? (else ConfigError)
    transfer  ─ per file, in the threads: skip, or copy + verify + rename; the main
                thread records each finished file in the manifest as it comes
    result    ─ StageResult, or StageError / VerificationError naming the failed files
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TypeVar

from paralela.errors import ConfigError
from paralela.staging import _copy
from paralela.staging._manifest import Entry, Manifest, hold_lock, remove_temporaries
from paralela.staging._plan import Plan, job_for, list_dir, make_plan
from paralela.staging._result import StageError, StageResult, VerificationError

__all__ = ["default_workers", "stage"]

T = TypeVar("T")
R = TypeVar("R")

# Tasks queued per thread: enough that no thread waits for the main thread to hand it
# the next batch, few enough that a million files never become a million futures at once.
_QUEUE_PER_WORKER = 4
# Files go to the threads in batches of up to 32 files or 8 MiB: one future per file
# (a wake-up of the main thread, a GIL hand-over) doubled the time of 5,000 4 KiB files
# (2.8 s in one thread, against 1.4 s for the same copies in a plain loop); batches are
# smaller when there are few files, so that every thread still gets work.
_BATCH_FILES = 32
_BATCH_BYTES = 8 << 20


def default_workers() -> int:
    """Threads of a stage: ``4 x`` the usable CPUs, at least 8 and at most 32.

    Staging is I/O bound. On a network filesystem each open, ``stat`` and read of a
    small file is a round trip to a server (0.2-2 ms), and the threads overlap those
    waits: more threads in flight mean more files per second, up to what the server
    gives one client.
    On a local disk the copies are bound by creating files and by hashing; hashing
    releases the GIL, so up to one thread per CPU helps and more cost little: on 2
    CPUs, 4, 8 and 16 threads were within the noise of each other, and faster than 1
    thread on large files (``bench/bench_stage.py``). 32 caps the memory for buffers
    (1 MiB each) and the load on a shared server.
    """
    from paralela.resources import detect_cpus

    return max(8, min(32, 4 * detect_cpus().usable))


def _window(
    pool: ThreadPoolExecutor,
    fn: Callable[[T], R],
    items: Iterable[T],
    limit: int,
) -> Iterator[Future[R]]:
    """Run ``fn`` over ``items`` with at most ``limit`` queued; yield futures as they end."""
    it = iter(items)
    pending: set[Future[R]] = set()
    exhausted = False
    while True:
        while not exhausted and len(pending) < limit:
            try:
                pending.add(pool.submit(fn, next(it)))
            except StopIteration:
                exhausted = True
        if not pending:
            return
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        yield from done


@dataclass
class _Walk:
    jobs: list[_copy.Job] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Tally:
    """What the copies came to, added up in the main thread as batches finish."""

    copied: int = 0
    skipped: int = 0
    verified: int = 0
    bytes: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mismatch: bool = False
    fatal: str = ""  # the reason DEST can take no more files (disk full...)

    def add(self, outcomes: list[_copy.Outcome]) -> list[Entry]:
        """Count one batch's outcomes; the manifest records of the copied files."""
        copied = []
        for outcome in outcomes:
            if outcome.note:
                self.notes.append(outcome.note)
            if outcome.status == "copied" and outcome.entry is not None:
                copied.append(outcome.entry)
                self.verified += outcome.verified
                self.bytes += outcome.size
            elif outcome.status == "skipped":
                self.skipped += 1
            else:
                self.failures.append((outcome.rel, outcome.reason))
                self.mismatch = self.mismatch or outcome.mismatch
                if outcome.fatal and not self.fatal:
                    self.fatal = outcome.reason
        self.copied += len(copied)
        return copied


def _walk(plan: Plan, pool: ThreadPoolExecutor) -> _Walk:
    """Every file of the source, listed one directory per task in ``pool``."""
    out = _Walk()
    if plan.single is not None:
        try:
            st = os.stat(plan.read_root / plan.single)
        except OSError as exc:
            out.problems.append((plan.single, exc.strerror or str(exc)))
            return out
        out.jobs.append(job_for(plan, plan.single, st))
        return out
    root_st = os.stat(plan.read_root)
    seen = {(root_st.st_dev, root_st.st_ino)}
    pending = {pool.submit(list_dir, plan, "")}
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            listing = future.result()
            out.jobs.extend(listing.jobs)
            out.problems.extend(listing.problems)
            out.warnings.extend(listing.warnings)
            for rel, _path, key in listing.subdirs:
                if key in seen:
                    out.warnings.append(
                        f"{rel}: a directory reached a second time (a symbolic link loop, or "
                        "a second link to it); skipped."
                    )
                    continue
                seen.add(key)
                out.dirs.append(rel)
                pending.add(pool.submit(list_dir, plan, rel))
    out.warnings.sort()  # the listings finish in any order
    # Largest first: a big file started last would leave the other threads idle.
    out.jobs.sort(key=lambda job: (-job.size, job.rel))
    return out


def _batches(jobs: list[_copy.Job], workers: int) -> Iterator[list[_copy.Job]]:
    """Consecutive groups of ``jobs`` (largest first) for the threads."""
    per_batch = max(1, min(_BATCH_FILES, len(jobs) // (workers * _QUEUE_PER_WORKER)))
    batch: list[_copy.Job] = []
    size = 0
    for job in jobs:
        if batch and (len(batch) >= per_batch or size + job.size > _BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(job)
        size += job.size
    if batch:
        yield batch


def _matches_source(job: _copy.Job, known: Entry | None) -> bool:
    return known is not None and (known.src, known.size, known.mtime_ns) == (
        job.src,
        job.size,
        job.mtime_ns,
    )


def _refuse_others_files(plan: Plan, jobs: list[_copy.Job], ours: Set[str]) -> None:
    """Refuse DEST files that a copy would replace and paralela did not write: not in
    DEST's manifest (``ours``: recorded, or dropped by a verify), and not a copy of its
    source either (a stage killed before it recorded a copy leaves one with the source's
    size and time)."""
    found = []
    for job in jobs:
        if job.rel in ours:  # paralela's copy (changed since: copied anew, as documented)
            continue
        try:
            st = os.lstat(job.dst)
        except OSError:  # nothing there (or unreadable: the copy will say why)
            continue
        if not (
            stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (job.size, job.mtime_ns)
        ):
            found.append(job.rel)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"{plan.write_root} holds files paralela did not write where the stage would "
            f"put its copies ({shown}): they differ from the source and no stage recorded "
            "them. Nothing was copied. Move them away, stage to another place, or pass "
            "overwrite=True (--overwrite) to replace them."
        )


def _check_space(plan: Plan, jobs: list[_copy.Job], known: Mapping[str, Entry]) -> None:
    """Refuse to start when what must be copied cannot fit in DEST."""
    todo = [job for job in jobs if not _matches_source(job, known.get(job.rel))]
    if not todo:
        return
    replaced = sum(known[job.rel].size for job in todo if job.rel in known)
    need = max(0, sum(job.size for job in todo) - replaced) + max(job.size for job in todo)
    try:
        st = os.statvfs(plan.write_root)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if need > free:
        from paralela.resources import format_bytes

        raise ConfigError(
            f"not enough space in {plan.write_root}: {len(todo)} file(s) to copy need about "
            f"{format_bytes(need)}, {format_bytes(free)} is free. Free some space, pick "
            "another DEST, or stage a smaller part of SRC."
        )


def _resolve_checksum(checksum: str, manifest: Manifest) -> str:
    if checksum == "auto":
        # BLAKE2b is in every Python and fast without CPU extensions; SHA-256 is faster
        # where the CPU has SHA instructions (623 vs 339 MiB/s on this project's CI).
        # Keep what the manifest used, so that nothing is copied again only for that.
        return manifest.algorithm or "blake2b"
    _copy.new_hash(checksum)  # raises ConfigError for an unknown name
    return checksum


def _dest_warnings(plan: Plan, total: int) -> list[str]:
    if plan.back:
        return []
    from paralela.resources import advise_filesystems

    return [a.message for a in advise_filesystems(scratch=[plan.write_root], staged_bytes=total)]


def stage(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str] | None = None,
    *,
    back: bool = False,
    workers: int | None = None,
    verify: bool = True,
    checksum: str = "auto",
    env: Mapping[str, str] | None = None,
    lock_timeout: float | None = None,
    on_wait: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> StageResult:
    """Copy a dataset to node-local scratch in parallel, verified; or results home.

    Every file is read once and hashed while it is written under a temporary name,
    then read back and compared (size and checksum), and only then renamed to its
    name: a stage that is killed never leaves a partial file under a real name. A
    manifest in DEST (``.paralela-stage.jsonl``) records each copied file; the next
    stage skips files whose source has the same size and modification time and whose
    copy is untouched, and copies changed files anew. Files are never deleted from DEST,
    and a file there that paralela did not write (not in the manifest, and not a copy of
    its source either: another size or time) is never replaced unless ``overwrite``.

    Args:
        src: the dataset on the shared filesystem: a directory, or a single file.
        dest: where to copy it. Default ``SCRATCH/paralela-stage-USER/NAME`` for a
            directory (``SCRATCH/paralela-stage-USER`` holds a file), where SCRATCH is
            ``$SLURM_TMPDIR``, else ``$TMPDIR`` inside a Slurm job, else
            :func:`tempfile.gettempdir`. A directory DEST receives SRC's contents
            (like ``rsync SRC/ DEST/``); for a file SRC, it receives ``DEST/NAME``.
        back: copy from DEST to SRC instead (results made in scratch, home), with the
            same checks; each file is synced to disk before it is renamed.
        workers: threads; default :func:`default_workers`.
        verify: read each copy back and compare its checksum (default). Without it,
            the checksum of the bytes read is still recorded.
        checksum: ``"auto"`` (what DEST's manifest used, else ``"blake2b"``),
            ``"blake2b"`` or ``"sha256"``.
        env: environment for the default DEST; ``os.environ`` when ``None``.
        lock_timeout: seconds to wait while another stage writes the same DEST;
            ``None`` waits until it is done.
        on_wait: called once with who holds DEST's lock when this call must wait.
        overwrite: replace files in DEST that paralela did not write (``--overwrite``);
            by default such files are refused before anything is copied.

    Returns:
        What was copied, skipped and verified, and ``path``, the staged copy.

    Raises:
        ConfigError: before anything is copied: SRC missing, SRC and DEST overlapping,
            DEST not writable, not enough free space, an unknown checksum, ``workers < 1``,
            or DEST holds files paralela did not write where SRC's go (names a few).
        VerificationError: a copy did not match its source twice (deleted; not recorded).
        StageError: files could not be read or written (named with the reason; a full
            or read-only DEST stops the stage at once), or ``lock_timeout`` passed.
            Every other file was copied and recorded, so running the same stage again
            copies only what is missing.
        KeyboardInterrupt: re-raised after the threads stopped and the temporary files
            of unfinished copies were deleted; finished files stay recorded.
    """
    start = time.monotonic()
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}.")
    if checksum != "auto":
        _copy.new_hash(checksum)  # an unknown name: ConfigError before DEST is made
    plan = make_plan(src, dest, back=back, env=env)
    n = workers or default_workers()
    with hold_lock(plan.write_root, lock_timeout, on_wait) as lock_warnings:
        manifest = Manifest.load(plan.write_root)
        algorithm = _resolve_checksum(checksum, manifest)
        if not manifest.clean:
            remove_temporaries(plan.write_root)
        options = _Options(n, algorithm, verify=verify, durable=back, overwrite=overwrite)
        walk, tally = _copy_all(plan, manifest, options)
    total = sum(job.size for job in walk.jobs)
    result = StageResult(
        source=str(plan.read_root),
        dest=str(plan.write_root),
        path=str(plan.path),
        direction="back" if back else "stage",
        files_copied=tally.copied,
        files_skipped=tally.skipped,
        files_verified=tally.verified,
        bytes_copied=tally.bytes,
        bytes_total=total,
        seconds=time.monotonic() - start,
        workers=n,
        checksum=algorithm,
        warnings=tuple(walk.warnings + tally.notes + lock_warnings + _dest_warnings(plan, total)),
    )
    _raise_failures(plan, walk, tally, result)
    return result


@dataclass(frozen=True)
class _Options:
    """How the copies of one stage are made."""

    workers: int
    algorithm: str
    verify: bool
    durable: bool  # sync each file before its rename (staging back)
    overwrite: bool


def _copy_all(plan: Plan, manifest: Manifest, options: _Options) -> tuple[_Walk, _Tally]:
    """Walk SRC, check DEST, then copy in ``options.workers`` threads, recording each
    copy in the manifest as its batch finishes. A fatal error (DEST full) stops the
    threads; any exception (Ctrl-C) stops them, waits for them and closes the manifest
    as incomplete before it propagates."""
    n = options.workers
    stop = threading.Event()
    pool = ThreadPoolExecutor(n, thread_name_prefix="paralela-stage")
    begun = False
    try:
        walk = _walk(plan, pool)
        known = dict(manifest.entries)
        if not options.overwrite:
            _refuse_others_files(plan, walk.jobs, known.keys() | manifest.damaged)
        _check_space(plan, walk.jobs, known)
        tally = _Tally(failures=list(walk.problems))
        _make_dirs(plan, walk.dirs, tally)
        manifest.begin()
        begun = True

        def run_batch(batch: list[_copy.Job]) -> list[_copy.Outcome]:
            return _run_batch(batch, known, options, stop)

        batches = _batches(walk.jobs, n)
        for future in _window(pool, run_batch, batches, n * _QUEUE_PER_WORKER):
            manifest.record(tally.add(future.result()))
            if tally.fatal:
                stop.set()
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        if begun:
            manifest.finish(complete=False)
        raise
    pool.shutdown(wait=True)
    manifest.finish(complete=not tally.fatal)
    return walk, tally


def _make_dirs(plan: Plan, dirs: list[str], tally: _Tally) -> None:
    """Create SRC's directories in DEST; one that cannot be made is a failure."""
    for rel in sorted(dirs):
        try:
            os.makedirs(plan.write_root / rel, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or str(exc)
            tally.failures.append((rel, f"cannot create the directory: {why}"))


def _run_batch(
    batch: list[_copy.Job],
    known: Mapping[str, Entry],
    options: _Options,
    stop: threading.Event,
) -> list[_copy.Outcome]:
    """In a thread: copy a batch of files, until ``stop`` is set."""
    done = []
    for job in batch:
        entry = known.get(job.rel)
        try:
            out = _copy.transfer(
                job,
                entry,
                options.algorithm,
                verify=options.verify,
                durable=options.durable,
                stop=stop,
            )
        except _copy.Stopped:
            break
        done.append(out)
    return done


def _raise_failures(plan: Plan, walk: _Walk, tally: _Tally, result: StageResult) -> None:
    """Raise the stage's failures, ``result`` attached: a DEST that could take no more
    files, else files that did not verify, else files that could not be copied."""
    failures = sorted(tally.failures)
    if tally.fatal:
        raise StageError(
            f"stopped: {plan.write_root} cannot take more files ({tally.fatal}). "
            f"{tally.copied} file(s) were copied and recorded; free space (or pick "
            "another DEST) and run the same stage again to copy the rest.",
            failures,
            result,
        )
    if failures:
        kind = VerificationError if tally.mismatch else StageError
        raise kind(
            f"{len(failures)} of {len(walk.jobs)} file(s) could not be staged into "
            f"{plan.write_root} (every other file was). Fix the cause (permissions, a "
            "damaged disk or network) and run the same stage again: only these are copied.",
            failures,
            result,
        )
