"""Command trials of ``python SCRIPT.py ARGS...`` forked from one prepared interpreter.

::

    driver ── socketpair (SOCK_SEQPACKET) ──> forker: python -c FORKER_CODE SCRIPT.py
      start(argv, env changes,                  prepared once, as a gated trial is
            fds: log, report pipe, gate) ──>   (``_gate.PREPARE_CODE``), then, for each
      <── "p PID"                                request: fork; the child: its own
      <── "x PID EXITCODE" when it ends          process group, the trial's output,
                                                 environment and directory; waits at its
                                                 gate; runs SCRIPT.py as its __main__

A fresh interpreter costs a trial 30-40 ms of CPU before its script's first line
(interpreter, site, ``paralela``'s report module, ``argparse`` & co); the gate moves that
time out of the slot's idle time, but with CPU-bound trials on every core that CPU is
still the trials'. The forker pays it once per sweep: a child forked from it costs ~7 ms
of CPU (the fork, the pages it writes, its exit), measured on the benchmark's 2-core VM.

Each trial is still a process of its own, as ``python SCRIPT.py`` would start it: its own
process group (stopped as a whole, as before), ``sys.argv``, ``sys.path[0]``, a fresh
``__main__``, the trial's environment and working directory, its exit code. What it
shares with the other trials is what the forker loaded before any trial (the standard
library modules of ``_gate.PRELOAD`` and paralela's report module, none of them used)
and the interpreter's hash seed (``PYTHONHASHSEED``); ``random`` reseeds itself in a
forked child. An environment change that the interpreter reads only as it starts
(``PYTHON*``, the locale's, ``PATH``, ``LD_*``, ``TZ``...) makes that trial a fresh
interpreter instead, as does a forker that cannot start or fork; the forker needs Linux
(``os.pidfd_open``). ``PARALELA_FORK_TRIALS=0`` turns it off: every trial a fresh
interpreter, started ahead at its gate (``_gate``).

The forker lives in a session of its own and exits at the end of its socket (the driver
closed it, or died): the trials' process groups are the reaper's to stop, as always.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence

from paralela.errors import ConfigError
from paralela.sweeping._gate import PREPARE_CODE, RUN_CODE, WAIT_CODE
from paralela.sweeping._report import ENV_REPORT_FD

__all__ = ["ENV_FORK_TRIALS", "Forked", "Forker", "forking_allowed"]

ENV_FORK_TRIALS = "PARALELA_FORK_TRIALS"
_ENV_SOCKET = "PARALELA_FORKER_FD"

# How long the driver waits for the forker to be ready, or to answer a request, before
# it gives up on it (and starts trials as fresh interpreters).
READY_SECONDS = 30.0
REPLY_SECONDS = 10.0
# Exit code of a trial whose forker died before telling how the trial ended.
LOST_EXIT = 255

# Variables an interpreter reads only as it starts (or that its loader does): a trial
# whose environment changes one of them starts as a fresh interpreter.
_STARTUP_NAMES = frozenset({"PATH", "HOME", "TZ", "LANG", "LANGUAGE", "VIRTUAL_ENV"})
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LD_", "MALLOC_", "GLIBC_")

# The forker's loop, between the preparing (PREPARE_CODE) and the child's run
# (WAIT_CODE, RUN_CODE). Requests come with three descriptors: the trial's log, the
# report pipe's write end and the gate's read end. The child leaves the forker's loop
# (``child`` set) and goes on at the top level, so its interpreter ends as a script's
# does (atexit, flushing, SystemExit's code).
_LOOP_CODE = """\
control = _socket.socket(fileno=int(os.environ.pop("ENV_SOCKET")))
poller = select.poll()
poller.register(control.fileno(), select.POLLIN)
children = {}
child = None
space = _socket.CMSG_SPACE(3 * 4)
control.send(b"r")
while child is None:
    for fd, _ in poller.poll():
        if fd != control.fileno():
            pid = children.pop(fd)
            poller.unregister(fd)
            os.close(fd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            control.send(b"x %d %d" % (pid, code))
            continue
        try:
            message, extra, _, _ = control.recvmsg(1 << 20, space)
        except OSError:
            message, extra = b"", []
        fds = []
        for level, kind, data in extra:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(data[i:i + 4], sys.byteorder)
                        for i in range(0, len(data) - len(data) % 4, 4)]
        if not message or len(fds) != 3:
            os._exit(0)
        try:
            pid = os.fork()
        except OSError as error:
            for each in fds:
                os.close(each)
            control.send(b"e " + str(error).encode(errors="replace"))
            continue
        if pid == 0:
            child = marshal.loads(message), fds
            break
        for each in fds:
            os.close(each)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        pidfd = os.pidfd_open(pid)
        children[pidfd] = pid
        poller.register(pidfd, select.POLLIN)
        control.send(b"p %d" % pid)
request, (log, report, gate) = child
try:
    os.setpgid(0, 0)
    control.close()
    for pidfd in children:
        os.close(pidfd)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.set_inheritable(report, True)
    for name in request["unset"]:
        os.environ.pop(name, None)
    os.environ.update(request["set"])
    os.environ["ENV_REPORT_FD"] = str(report)
    sys.argv = ["-c", *request["argv"]]
    for name in own:
        sys.modules.pop(name, None)
except BaseException as error:
    os.write(2, b"paralela: the trial could not be set up in its forked process: %s\\n"
             % repr(error).encode(errors="replace"))
    os._exit(127)
del poller, children, child, control, request, log, report, own
"""

# Before the preparing: what the loop needs, none of it from the script's directory
# (``sys.path[0]``, the working directory for ``-c``), and only builtin or extension
# modules; the child forgets them (``own``), so that its script imports them afresh.
_HEAD_CODE = """\
import os, sys, marshal
if not hasattr(os, "pidfd_open"):
    os._exit(3)
first = sys.path.pop(0)
loaded = set(sys.modules)
import _socket, select
own = set(sys.modules) - loaded
sys.path.insert(0, first)
del first, loaded
"""

FORKER_CODE = (
    _HEAD_CODE
    + PREPARE_CODE
    + _LOOP_CODE.replace("ENV_SOCKET", _ENV_SOCKET).replace("ENV_REPORT_FD", ENV_REPORT_FD)
    + WAIT_CODE
    + RUN_CODE
)


def forking_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether command trials may be forked: ``PARALELA_FORK_TRIALS`` unset or ``1``
    (also ``yes``, ``true``, ``on``); ``0`` (``no``, ``false``, ``off``) turns it off."""
    value = (os.environ if environ is None else environ).get(ENV_FORK_TRIALS, "1")
    key = value.strip().lower()
    if key in ("1", "yes", "true", "on"):
        return True
    if key in ("0", "no", "false", "off"):
        return False
    raise ConfigError(
        f"{ENV_FORK_TRIALS}={value!r} is not understood: set it to 1 (fork each python "
        "script trial from one prepared interpreter, the default) or 0 (start a fresh "
        "interpreter for each trial)."
    )


def _startup_variable(name: str) -> bool:
    return name in _STARTUP_NAMES or name.startswith(_STARTUP_PREFIXES)


class Forked:
    """A trial process the forker started: what the driver uses of a ``Popen``."""

    def __init__(self, pid: int, forker: Forker) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.lost = False  # its exit code went with the forker (LOST_EXIT)
        self._forker = forker
        try:  # to see it end even if the forker dies (it is not the driver's child)
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, as ``Popen.wait`` gives it (``-N``: ended by signal N); once it
        ended, :data:`LOST_EXIT` if the forker died before telling how.
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        forker = self._forker
        with forker._cv:
            if not forker._cv.wait_for(
                lambda: self.returncode is not None or forker._broken, timeout
            ):
                raise subprocess.TimeoutExpired(f"trial process {self.pid}", timeout or 0.0)
            if self.returncode is not None:
                self._close()
                return self.returncode
        if self._pidfd is not None:  # the forker is gone: wait for the process itself
            # (another thread may wait on it too: the descriptor is closed by __del__)
            ended, _, _ = select.select([self._pidfd], [], [], timeout)
            if not ended:
                raise subprocess.TimeoutExpired(f"trial process {self.pid}", timeout or 0.0)
        with forker._cv:
            if self.returncode is None:
                self.returncode, self.lost = LOST_EXIT, True
            return self.returncode

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close()


class Forker:
    """One sweep's forker for the script ``script`` run by ``python`` (see the module).

    Started at once, ready in the background; :meth:`start` returns ``None`` (the caller
    then starts a fresh interpreter) whenever it cannot fork that trial.
    """

    def __init__(self, python: str, script: str) -> None:
        self.script = os.path.abspath(script)
        self._base = dict(os.environ)
        self._cwd = os.getcwd()
        self._lock = threading.Lock()  # one request at a time
        self._cv = threading.Condition()
        self._replies: list[bytes] = []
        self._running: dict[int, Forked] = {}  # forked, not known to have ended
        self._codes: dict[int, int] = {}  # ended before start() had its Forked
        self._ready = False
        self._broken = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        try:
            self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [python, "-c", FORKER_CODE, script],
                env={**self._base, _ENV_SOCKET: str(theirs.fileno())},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # Ctrl-C is the driver's: it stops the trials
            )
        except OSError:
            self._process = None
            self._broken = True
        finally:
            theirs.close()
        if self._process is not None:
            threading.Thread(target=self._read, name="paralela-forker", daemon=True).start()

    @classmethod
    def for_script(cls, python: str, script: str) -> Forker | None:
        """A forker for ``python script ...``, unless ``PARALELA_FORK_TRIALS=0``."""
        return cls(python, script) if forking_allowed() else None

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], fds: tuple[int, int, int]
    ) -> Forked | None:
        """Fork ``python argv...`` (``argv[0]``: the script) with ``env``, its output to
        ``fds[0]``, reporting to ``fds[1]``, waiting at the gate ``fds[2]``; ``None``
        when this trial cannot be forked (the caller starts a fresh interpreter)."""
        if not argv or os.path.abspath(argv[0]) != self.script or os.getcwd() != self._cwd:
            return None
        base = self._base
        changed = {k: v for k, v in env.items() if base.get(k) != v and k != ENV_REPORT_FD}
        unset = [k for k in base if k not in env]
        if any(_startup_variable(name) for name in [*changed, *unset]):
            return None
        # (no directory: the forker's is the driver's, checked above, and its children's)
        request = {"argv": list(argv), "set": changed, "unset": unset}
        message = marshal.dumps(request, 4)  # (format 4: read by every Python 3)
        with self._lock:
            if not self._wait_ready():
                return None
            try:
                socket.send_fds(self._socket, [message], list(fds))
            except OSError:
                self._give_up()
                return None
            reply = self._reply()
        if reply is None or not reply.startswith(b"p "):
            if reply is None:
                self._give_up()
            return None
        forked = Forked(int(reply[2:]), self)
        with self._cv:
            code = self._codes.pop(forked.pid, None)
            if code is None:
                self._running[forked.pid] = forked
            else:
                forked.returncode = code
        return forked

    def close(self) -> None:
        """End the forker (the trials it forked go on: they are the reaper's)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._socket.close()

    # -- the driver's side of the socket ----------------------------------------------

    def _read(self) -> None:
        sock = self._socket
        while True:
            try:
                message = sock.recv(256)
            except OSError:
                message = b""
            with self._cv:
                if not message:
                    self._broken = True
                    self._cv.notify_all()
                    return
                if message == b"r":
                    self._ready = True
                elif message.startswith(b"x "):
                    pid, code = (int(x) for x in message[2:].split())
                    forked = self._running.pop(pid, None)
                    if forked is None:
                        self._codes[pid] = code
                    else:
                        forked.returncode = code
                else:  # "p PID" or "e WHY": the reply to the request under way
                    self._replies.append(message)
                self._cv.notify_all()

    def _wait_ready(self) -> bool:
        with self._cv:
            self._cv.wait_for(lambda: self._ready or self._broken, timeout=READY_SECONDS)
            if not self._ready and not self._broken:
                self._broken = True  # too slow to start: not worth waiting for again
            return self._ready and not self._broken

    def _reply(self) -> bytes | None:
        with self._cv:
            self._cv.wait_for(lambda: self._replies or self._broken, timeout=REPLY_SECONDS)
            return self._replies.pop(0) if self._replies else None

    def _give_up(self) -> None:
        with self._cv:
            self._broken = True
            self._cv.notify_all()
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.kill()
