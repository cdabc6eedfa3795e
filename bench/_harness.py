"""Shared helpers for paralela's benchmarks: timing, child processes, machine facts, tables.

Every engine runs in a fresh child process (``run_child``), one after another, so no
engine's daemons compete with another's. Inside the child, ``time_reps`` does one
warm-up run and then the timed repetitions; the parent turns the raw seconds into
Markdown tables (``md_table``, ``sig``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
import platform
import pty
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
TAIL_CHARS = 4000


# --------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """Wall-clock seconds of one warm-up run (``cold``) and of the timed repetitions."""

    cold: float
    times: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """Slowest / fastest repetition - 1."""
        return max(self.times) / min(self.times) - 1.0


def time_reps(
    run: Callable[[int], Any],
    reps: int,
    check: Callable[[int, Any], None] | None = None,
    before: Callable[[int], None] | None = None,
) -> Timing:
    """Time ``run(rep)``: one warm-up (``rep == -1``), then ``reps`` timed repetitions.

    ``before(rep)`` runs untimed ahead of each call (fresh directories and the like);
    ``check(rep, result)`` runs untimed after it and raises if the result is wrong.
    """
    timing = Timing(cold=0.0)
    for rep in range(-1, reps):
        if before is not None:
            before(rep)
        t0 = time.perf_counter()
        result = run(rep)
        elapsed = time.perf_counter() - t0
        if check is not None:
            check(rep, result)
        del result
        if rep < 0:
            timing.cold = elapsed
        else:
            timing.times.append(elapsed)
    return timing


# ------------------------------------------------------------------ child processes


@dataclass
class ChildRun:
    returncode: int | None  # None: killed after the timeout
    wall: float
    tail: str


_COMPILED: list[bool] = []


def compile_paralela() -> None:
    """Write the ``.pyc`` files of the paralela package measured here, once per run.

    An installed package has them (pip compiles what it installs, as it did for every
    peer); a development checkout under PYTHONDONTWRITEBYTECODE=1 (a common setting) has
    none, and every child, its workers included, would compile paralela from source: the
    rows would time the bytecode compiler (~1 ms per module, in each process).
    """
    if _COMPILED:
        return
    _COMPILED.append(True)
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("paralela")
    if spec is not None and spec.origin is not None:
        compileall.compile_dir(str(Path(spec.origin).parent), quiet=1)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with ``bench/`` first on PYTHONPATH (workers inherit it).

    Bytecode caching is on (PYTHONDONTWRITEBYTECODE removed) and paralela is compiled
    first (:func:`compile_paralela`), as for an installed package: every engine's
    modules then load from ``.pyc`` files alike.
    """
    compile_paralela()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def run_child(
    cmd: Sequence[str],
    *,
    timeout: float,
    tty: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> ChildRun:
    """Run ``cmd`` to completion and return its exit code, wall time and output tail.

    With ``tty=True`` the child's stdout and stderr are a pseudo-terminal (120x40), so
    progress bars that draw only on a terminal do draw; the parent drains it.
    """
    env = env if env is not None else child_env()
    if not tty:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.output or b""
            return ChildRun(None, time.perf_counter() - t0, _tail(out))
        return ChildRun(proc.returncode, time.perf_counter() - t0, _tail(proc.stdout))

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**env, "TERM": env.get("TERM", "xterm-256color") or "xterm-256color"}
    chunks: list[bytes] = []
    t0 = time.perf_counter()
    proc_tty = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True
    )
    os.close(slave)

    def drain() -> None:
        kept = 0
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO once every writer of the slave side has gone
                return
            if not data:
                return
            chunks.append(data)
            kept += len(data)
            if kept > 8 * TAIL_CHARS:  # keep only the tail
                joined = b"".join(chunks)[-2 * TAIL_CHARS :]
                chunks[:] = [joined]
                kept = len(joined)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    code: int | None
    try:
        code = proc_tty.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc_tty.kill()
        proc_tty.wait()
        code = None
    wall = time.perf_counter() - t0
    reader.join(timeout=5)
    with contextlib.suppress(OSError):
        os.close(master)
    return ChildRun(code, wall, _tail(b"".join(chunks)))


def _tail(data: bytes) -> str:
    return data.decode("utf-8", "replace")[-TAIL_CHARS:]


# ---------------------------------------------------------------------- the machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return _gib(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return "unknown"


def _shm_size() -> str:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return "none"
    return _gib(st.f_blocks * st.f_frsize)


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_lines(packages: Iterable[str]) -> list[str]:
    """Markdown bullet lines describing this machine and the software versions."""
    import multiprocessing

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    versions = ", ".join(f"{p} {package_version(p)}" for p in packages)
    return [
        f"- CPU: {_cpu_model()} x{os.cpu_count()} logical CPUs "
        f"(nproc={len(os.sched_getaffinity(0))}), "
        f"RAM {_mem_total()}, /dev/shm {_shm_size()}, kernel {platform.release()}",
        f"- Python {platform.python_version()} ({sys.executable}); multiprocessing default "
        f"start method: {multiprocessing.get_start_method()}",
        f"- {versions}",
        f"- Run captured: {now}",
    ]


# ------------------------------------------------------------------------ formatting


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, thousands separated; '-' for None."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    decimals = digits - 1 - int(f"{ax:e}".split("e")[1])
    return f"{x:.{decimals}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(
    out: str | os.PathLike[str], sections: list[str], total: float, log: Callable[[str], None]
) -> None:
    """Write a benchmark's markdown ``sections`` to ``out`` (its table under
    ``bench/results/``), ending with the run's whole wall time ``total`` in seconds."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [*sections, f"_Total benchmark wall time: {total:.0f} s._"]
    path.write_text("\n\n".join(body) + "\n")
    log(f"wrote {path} ({total:.0f} s)")
