"""Running one trial: a function in a pinned worker process, or a command as a process.

::

    function trial: backend.submit(run_function_trial, Broadcast(job), spec)
        worker: output to the trial's log; objective(params); report() -> storage;
                TrialPruned -> PRUNED; exception -> FAIL with its traceback
    command trial:  Popen(argv with {param} filled in, env = slot + trial variables,
                    own process group, output to the trial's log, a report pipe); a
                    python script's: forked from the sweep's prepared interpreter
                    (``_forker``), held at its gate (``_gate``) until its turn
        reader thread: report lines -> events; end of pipe + exit code -> event
        terminate(): SIGTERM to the group, SIGKILL to what is left of it after the
                     grace period, its leader gone or not (backends.stop_group, a thread)
    reaper:         one small process per sweep, told each command trial's group as it
                    starts and ends; when the driver dies (even by SIGKILL) its pipe
                    ends, and the reaper stops the groups left running
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from paralela.backends import stop_group
from paralela.errors import ConfigError
from paralela.sweeping._forker import Forked, Forker, forking_allowed
from paralela.sweeping._gate import ENV_GATE_FD, gated_argv
from paralela.sweeping._report import ENV_PARAMS, ENV_REPORT_FD, ENV_TRIAL_NUMBER

# A function trial's worker side lives in _worker_trial (its imports are light: a
# worker's first trial does not import json, pathlib, subprocess or this module).
from paralela.sweeping._worker_trial import (
    FunctionJob,
    TrialOutcome,
    TrialSpec,
    run_function_trial,
)

__all__ = [
    "CommandTrial",
    "FunctionJob",
    "Reaper",
    "TrialOutcome",
    "TrialSpec",
    "check_command",
    "command_outcome",
    "fill",
    "run_function_trial",
]

LOG_TAIL_BYTES = 2000


def log_tail(path: str | Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a log, for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# {name} with the characters a parameter name may hold; {{ and }} stand for { and }.
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_.-]*)\}")


def placeholders(argv: Sequence[str]) -> set[str]:
    """The parameter names that the command's ``{name}`` placeholders use."""
    return {m.group(1) for arg in argv for m in _PLACEHOLDER.finditer(arg) if m.group(1)}


PYTHON = "python"  # {python}: the driver's interpreter (sys.executable), unless a parameter


def fill(arg: str, params: dict[str, Any]) -> str:
    """``arg`` with each ``{name}`` replaced by the parameter's value; by ``""`` for a
    parameter of an option the trial did not choose (a conditional space). ``{python}``
    (when no parameter has that name) is the interpreter running the sweep: the whole
    argument as it is, or shell-quoted inside a longer one (``sh -c "{python} t.py"``)."""
    if arg == "{" + PYTHON + "}" and PYTHON not in params:
        return sys.executable

    def value(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name == PYTHON and name not in params:
            return shlex.quote(sys.executable)
        return str(params[name]) if name in params else ""  # check_command knows the names

    return _PLACEHOLDER.sub(value, arg)


def check_command(argv: Sequence[str], param_names: Sequence[str]) -> None:
    """Refuse, before any trial runs, a command that cannot start or names unknown params."""
    if not argv:
        raise ConfigError("The trial command is empty; give it after '--'.")
    import shutil

    program = fill(argv[0], {}) if argv[0] == "{" + PYTHON + "}" else argv[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise ConfigError(
            f"Trial command not found: {argv[0]!r} is neither on PATH nor a file. "
            "Check the spelling, or give its full path."
        )
    forking_allowed()  # PARALELA_FORK_TRIALS: a value not understood, said now
    unknown = placeholders(argv) - {*param_names, PYTHON}
    if unknown:
        raise ConfigError(
            f"The trial command uses {', '.join('{' + u + '}' for u in sorted(unknown))}, "
            f"which the space does not define; its parameters are: {', '.join(param_names)}."
        )


def command_outcome(handle: Any, log_path: str | None, returncode: int) -> TrialOutcome:
    """How a command trial (a :class:`CommandTrial`, a Slurm trial) ended, from its exit
    code and what the driver saw of it (its reports, why the driver stopped it)."""
    values: list[float] | None
    if handle.failed is not None:  # stopped by the driver (a NaN report, trial_timeout)
        state, values, error = "FAIL", None, handle.failed
    elif handle.pruned:
        state, values, error = "PRUNED", None, None
    elif returncode != 0:
        how = handle.describe_exit(returncode)
        tail = log_tail(log_path or "")
        state, values, error = "FAIL", None, f"{how}; the end of its log:\n{tail}"
    elif handle.last_value is None:
        state, values = "FAIL", None
        error = (
            "the trial command exited 0 but reported no value; call "
            "paralela.report(value) in it (the last value reported is the result)"
        )
    else:
        state, values, error = "COMPLETE", [handle.last_value], None
    number, now = handle.spec.number, time.time()
    return TrialOutcome(  # (its reports came through the driver: wrote nothing itself)
        number, state, values, handle.started, now, error, returncode, handle.devices, wrote=False
    )


class CommandTrial:
    """One command trial's process; events go to ``events`` as tuples:
    ``("report", self, value, step)`` and finally ``("exit", self, returncode)``.

    ``gated``: start a ``python SCRIPT.py ...`` command now but hold it before the script
    (see ``_gate``) until :meth:`open_gate`; :meth:`close_gate` ends it unrun.
    ``forker``: fork a gated trial from this prepared interpreter (``_forker``) when it
    can, else start a fresh one.
    """

    def __init__(
        self,
        argv: Sequence[str],
        spec: TrialSpec,
        env: dict[str, str],
        events: SimpleQueue[tuple[Any, ...]],
        *,
        gated: bool = False,
        forker: Forker | None = None,
    ) -> None:
        self.spec = spec
        self.started = time.time()
        self.devices = env.get("CUDA_VISIBLE_DEVICES")
        self.last_value: float | None = None
        self.pruned = False
        self.failed: str | None = None  # why the driver stopped it (a NaN report)
        self._events = events
        self._gate: int | None = None
        self._stopper: threading.Thread | None = None
        filled = [fill(arg, spec.params) for arg in argv]
        child_env = {
            **env,
            ENV_PARAMS: json.dumps(spec.params),
            ENV_TRIAL_NUMBER: str(spec.number),
        }
        with open(spec.log_path, "ab") as log:
            log.write(f"$ {' '.join(filled)}\n".encode())
            log.flush()
            started: tuple[Forked | subprocess.Popen[bytes], int] | None = None
            if forker is not None and gated:
                started = self._fork(forker, filled, child_env, log.fileno())
            if started is None:
                started = self._spawn(filled, child_env, log, gated)
        self.process, report_r = started
        self._reader = threading.Thread(
            target=self._watch, args=(report_r,), name=f"paralela-trial-{spec.number}", daemon=True
        )
        self._reader.start()

    def _fork(
        self, forker: Forker, filled: list[str], env: dict[str, str], log: int
    ) -> tuple[Forked, int] | None:
        """Fork it from the sweep's prepared interpreter (``_forker``), held at its gate;
        ``None`` if the forker cannot: the caller starts a fresh interpreter."""
        report_r, report_w = os.pipe()
        gate_r, gate_w = os.pipe()
        try:
            process = forker.start(filled[1:], env, (log, report_w, gate_r))
        finally:
            os.close(report_w)
            os.close(gate_r)
        if process is None:  # (a child it may have forked exits at its closed gate)
            os.close(report_r)
            os.close(gate_w)
            return None
        self._gate = gate_w
        return process, report_r

    def _spawn(
        self, filled: list[str], env: dict[str, str], log: Any, gated: bool
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start it as a fresh interpreter (held at its gate if ``gated``, see ``_gate``)."""
        report_r, report_w = os.pipe()
        fds = [report_w]
        run = filled
        env = {**env, ENV_REPORT_FD: str(report_w)}
        if gated:
            gate_r, self._gate = os.pipe()
            fds.append(gate_r)
            env[ENV_GATE_FD] = str(gate_r)
            run = gated_argv(filled)
        try:
            process = subprocess.Popen(
                run,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=fds,
                start_new_session=True,  # its own group: stopping it stops its children
            )
        except BaseException:
            os.close(report_r)
            if self._gate is not None:
                os.close(self._gate)
                self._gate = None
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return process, report_r

    def open_gate(self) -> None:
        """Let a gated trial run its script now (its start time is now)."""
        self.started = time.time()
        if self._gate is not None:
            # A process that died at its gate ends as any trial does: its exit event.
            with contextlib.suppress(BrokenPipeError):
                os.write(self._gate, b"g")
            os.close(self._gate)
            self._gate = None

    def close_gate(self) -> None:
        """End a gated trial unrun: its process exits at the gate (code 0)."""
        if self._gate is not None:
            os.close(self._gate)
            self._gate = None

    def _watch(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as reports:
            for line in reports:
                try:
                    message = json.loads(line)
                    value, step = float(message["value"]), int(message["step"])
                except (ValueError, KeyError, TypeError):
                    continue  # not ours: the pipe is only written by paralela.report
                self._events.put(("report", self, value, step))
        self._events.put(("exit", self, self.process.wait()))

    def terminate(self, grace: float) -> None:
        """SIGTERM to the trial's process group, SIGKILL to what is left of it after
        ``grace``: the whole group, even once the command itself has exited (a child
        that ignores SIGTERM goes too). Runs in a thread; see :meth:`stopped`. A second
        call does nothing."""
        if self._stopper is not None:
            return
        self._stopper = threading.Thread(
            target=stop_group,
            args=(self.process.pid, grace),  # its own process group: pgid == pid
            name=f"paralela-stop-trial-{self.spec.number}",
            daemon=True,
        )
        self._stopper.start()

    @property
    def stopping(self) -> bool:
        """:meth:`terminate` was called (its group may still be going)."""
        return self._stopper is not None

    def stopped(self) -> bool:
        """No stop of its group is under way: it ended, SIGKILL included, or never began."""
        return self._stopper is None or not self._stopper.is_alive()

    def wait_stopped(self) -> None:
        """Wait until :meth:`terminate` is done (``grace`` seconds at most)."""
        if self._stopper is not None:
            self._stopper.join()

    def describe_exit(self, returncode: int) -> str:
        """How the process ended: ``"the trial command ended with exit code 3"``."""
        if isinstance(self.process, Forked) and self.process.lost:
            return (
                "the trial command's exit code is unknown: the sweep's trial forker was "
                "killed while it ran (PARALELA_FORK_TRIALS=0 starts each trial fresh)"
            )
        how = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
        return f"the trial command ended with {how}"


# The reaper: reads "+PGID" / "-PGID" (and "+jJOBID" / "-jJOBID" for trials that are
# Slurm jobs) lines from the driver; at the end of its input (the driver finished, or
# died) it cancels the jobs still listed and stops the groups still listed: SIGTERM,
# SIGKILL after the grace period (paralela.backends.stop_groups, imported from where the
# driver's paralela is, before the end: stopping is not delayed by the import). It
# ignores Ctrl-C (the driver handles that) and has its own session, so that a signal to
# the driver's process group does not take it down with the driver.
_REAPER_CODE = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.path.insert(0, sys.argv[2])
from paralela.backends import stop_groups
groups, jobs = set(), set()
for line in sys.stdin.buffer:
    key = line[1:].strip()
    if key[:1] == b"j":
        (jobs.add if line[:1] == b"+" else jobs.discard)(key[1:].decode())
    else:
        (groups.add if line[:1] == b"+" else groups.discard)(int(key))
if jobs:
    import subprocess
    try:
        subprocess.run(["scancel", *sorted(jobs)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
    except Exception:
        pass
stop_groups(groups, float(sys.argv[1]))
"""
# The directory the driver's paralela package is in (the reaper imports that one).
_PARALELA_ROOT = str(Path(__file__).resolve().parents[2])


class Reaper:
    """Stops the command trials a driver leaves running, even when it dies by SIGKILL.

    The driver tells it each trial's process group as the trial starts (:meth:`add`)
    and once it has ended (:meth:`discard`); :meth:`close` (or the driver's death) ends
    its input and it stops what is left: SIGTERM, then SIGKILL after ``grace`` seconds.
    """

    def __init__(self, grace: float) -> None:
        self._grace = grace
        self._process = subprocess.Popen(
            [sys.executable, "-c", _REAPER_CODE, str(grace), _PARALELA_ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _tell(self, line: str) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError, ValueError):  # the reaper died: nothing to tell
            stdin.write(line.encode())
            stdin.flush()

    def add(self, group: int) -> None:
        self._tell(f"+{group}\n")

    def discard(self, group: int) -> None:
        self._tell(f"-{group}\n")

    def add_job(self, job_id: str) -> None:
        """A trial's Slurm job: ``scancel``-ed if it is still listed at the end."""
        self._tell(f"+j{job_id}\n")

    def discard_job(self, job_id: str) -> None:
        self._tell(f"-j{job_id}\n")

    def close(self) -> None:
        """Stop the groups still listed and wait until the reaper has (at most ``grace``
        seconds and a little more)."""
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(timeout=self._grace + 10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
