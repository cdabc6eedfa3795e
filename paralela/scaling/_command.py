"""A command as a scaling target: the worker count put into its arguments, each run
timed as a whole process, its output kept in a log.

::

    paralela map f:g -i items.jsonl -o out.jsonl --run-dir runs/x
      ──> python -m paralela map --workers 4 f:g -i items.jsonl -o out.jsonl
              --run-dir WORKSPACE/runs/w4-r2          (a fresh store: nothing resumes)
    python train.py --procs {workers} --size {scale}  ──> placeholders filled
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paralela.backends import kill_group, stop_group
from paralela.errors import ConfigError
from paralela.scaling._model import ScalingError

__all__ = ["CommandTarget"]

WORKERS = "{workers}"
SCALE = "{scale}"
LOG_TAIL_LINES = 15
# Seconds a stopped command (Ctrl-C) gets to exit after SIGTERM before SIGKILL.
TERM_GRACE = 5.0


def _paralela_index(argv: list[str]) -> int | None:
    """Index of the sub-command of a ``paralela ...`` (or ``python -m paralela ...``)."""
    if argv and argv[0] == "paralela":
        return 1
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == "paralela":
        return 3
    return None


def _option_value(args: list[str], name: str, end: int) -> int | None:
    """Index of the value of ``--name VALUE`` (or of the ``--name=VALUE`` token)."""
    for i, token in enumerate(args[:end]):
        if token == name and i + 1 < end:
            return i + 1
        if token.startswith(name + "="):
            return i
    return None


def _set_option(args: list[str], names: tuple[str, ...], value: str, end: int) -> bool:
    for name in names:
        i = _option_value(args, name, end)
        if i is not None:
            args[i] = f"{name}={value}" if args[i].startswith(name + "=") else value
            return True
    return False


def _fill(text: str, workers: int, scale: float) -> str:
    shown = str(int(scale)) if float(scale).is_integer() else f"{scale:g}"
    return text.replace(WORKERS, str(workers)).replace(SCALE, shown)


@dataclass
class CommandTarget:
    """A command run once per measurement, in a fresh process each time."""

    argv: list[str]
    weak: bool
    timeout: float | None = None
    workspace: Path | None = None
    keep: bool = False
    kind: str = "command"

    @property
    def command(self) -> list[str]:
        return list(self.argv)

    @property
    def describe(self) -> str:
        return shlex.join(self.argv)

    def validate(self, workers: int, needs_run_dir: bool = False) -> None:
        """Check the command before anything runs.

        Raises:
            ConfigError: empty, not found, no way to pass the count, (weak) no
                ``{scale}``, or (``needs_run_dir``) not a paralela command with
                ``--run-dir``.
        """
        if not self.argv:
            raise ConfigError("The command is empty: give it after '--'.")
        sub = _paralela_index(self.argv)
        if sub is None and shutil.which(self.argv[0]) is None:
            raise ConfigError(
                f"Command {self.argv[0]!r} not found on PATH. Give the full path, or "
                "'python script.py ...'."
            )
        text = " ".join(self.argv)
        if WORKERS not in text and sub is None:
            raise ConfigError(
                "The command must take the worker count: put {workers} where it goes, e.g. "
                "-- python train.py --procs {workers}. (A paralela command gets --workers N.)"
            )
        if sub is not None and len(self.argv) <= sub:
            raise ConfigError("Name the paralela sub-command to measure, e.g. paralela map ...")
        if self.weak and SCALE not in text:
            raise ConfigError(
                "Weak scaling grows the work with the workers: put {scale} where the command "
                "decides its size, e.g. --input items-x{scale}.jsonl or --samples {scale}000 "
                "({scale} is workers / the smallest count)."
            )
        _, has_run_dir = self.build(workers, 1.0, None)
        if needs_run_dir and not has_run_dir:
            raise ConfigError(
                "Timing the map alone reads each run's summary.json: give the paralela map "
                "command a --run-dir (each run gets a fresh one)."
            )

    def build(self, workers: int, scale: float, run_dir: Path | None) -> tuple[list[str], bool]:
        """The arguments for one run, and whether they name a ``--run-dir``."""
        args = [_fill(a, workers, scale) for a in self.argv]
        sub = _paralela_index(self.argv)
        if sub is None:
            return args, False
        if args[0] == "paralela":  # this Python's paralela, whatever PATH holds
            args[:1] = [sys.executable, "-m", "paralela"]
            sub = 3
        end = args.index("--") if "--" in args else len(args)
        if WORKERS not in " ".join(self.argv) and not _set_option(
            args, ("--workers", "-w"), str(workers), end
        ):
            args[sub + 1 : sub + 1] = ["--workers", str(workers)]
            end += 2
        has_run_dir = _option_value(args, "--run-dir", end) is not None
        if has_run_dir and run_dir is not None:
            _set_option(args, ("--run-dir",), str(run_dir), end)
        return args, has_run_dir

    def run(
        self, workers: int, scale: float, tag: str, label: str
    ) -> tuple[float, str | None, float | None]:
        """Run once; returns the wall seconds, the per-run map directory (relative to
        the workspace, when it is kept) and that map's own wall seconds.

        Raises:
            ScalingError: the command failed or timed out.
        """
        assert self.workspace is not None
        map_dir = self.workspace / "runs" / tag
        args, has_run_dir = self.build(workers, scale, map_dir)
        logs = self.workspace / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{tag}.log"
        with open(log_path, "wb") as log:
            log.write(("$ " + shlex.join(args) + "\n").encode())
            log.flush()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its workers are stopped with it
            )
            try:
                code = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                raise ScalingError(
                    f"The command did not finish within {self.timeout} s at {label}; it "
                    f"was killed. Its log: {log_path}\n{_tail(log_path)}"
                ) from None
            except BaseException:
                _stop(proc)
                raise
            seconds = time.perf_counter() - t0
        if code != 0:
            raise ScalingError(
                f"The command exited with code {code} at {label}: {shlex.join(args)}\n"
                f"Its log ({log_path}), last lines:\n{_tail(log_path)}"
            )
        if not has_run_dir:
            return seconds, None, None
        map_seconds = _map_wall(map_dir)
        shown = str(map_dir.relative_to(self.workspace)) if self.keep else None
        return seconds, shown, map_seconds


def _map_wall(run_dir: Path) -> float | None:
    try:
        data = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        return float(data["wall_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the command's process group, SIGKILL what is left of it after
    :data:`TERM_GRACE` (its workers too, once the command itself has exited)."""
    stop_group(proc.pid, TERM_GRACE, leader=proc)  # its own session: pgid == pid
    proc.wait()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join("  " + line for line in kept)
