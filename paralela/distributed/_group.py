"""One attempt of a launch: start the ranks, copy their output, see who dies first, stop.

::

    launcher ─┬─ rank 0  python -c BOOTSTRAP prog...  (own session)  ─ stdout+stderr ─┐
              ├─ rank 1  ...                                                          │
              │   pump thread per rank: log file rank-N.log + "[rank N] " on console ◄┘
              └─ waiter thread per rank: (rank, exit code) into one queue, in exit order

The queue gives the exit order, so the rank that died *first* is the one reported,
not the peer that failed a moment later because its collective lost a partner.
Each rank runs in its own session; :meth:`RankGroup.stop` sends SIGTERM to every
rank's process group, then SIGKILL after a grace period (``paralela.backends.stop_groups``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from paralela.backends import kill_group, stop_groups
from paralela.distributed._bootstrap import BOOTSTRAP
from paralela.distributed._env import RankSpec
from paralela.distributed._joining import POLL_S, JoinWatch
from paralela.errors import RendezvousError

__all__ = ["RankGroup", "RankProcess"]


@dataclass
class RankProcess:
    """One running rank and what is known about it."""

    spec: RankSpec
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int  # where this attempt's lines start in the log file
    started: float = field(default_factory=time.time)
    ended: float | None = None
    returncode: int | None = None
    error_file: Path | None = None  # where torch's ``@record`` writes the rank's exception
    join_file: Path | None = None  # where the rank says it entered / joined the group

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines this rank wrote during this attempt."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.log_offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        kept = text.rstrip().splitlines()[-lines:]
        return "\n".join(kept)

    def recorded_error(self) -> str | None:
        """The exception ``@record`` wrote for this rank, with its traceback, if any.

        torch.distributed.elastic's format: ``{"message": {"message": "ValueError: ...",
        "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}}``.
        """
        if self.error_file is None:
            return None
        try:
            data = json.loads(self.error_file.read_text(errors="replace"))
        except (OSError, ValueError):
            return None
        message = data.get("message") if isinstance(data, dict) else None
        if isinstance(message, str):
            return message
        if not isinstance(message, dict):
            return None
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = str(stack) if stack else str(message.get("message", ""))
        return text.rstrip() or None

    def record(self) -> dict[str, object]:
        """What the run record keeps of this rank."""
        return {
            "rank": self.spec.rank,
            "local_rank": self.spec.local_rank,
            # Slurm's node name tells apart emulated nodes that share one host name.
            "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "pid": self.proc.pid,
            "start": self.started,
            "end": self.ended,
            "returncode": self.returncode,
            "log": str(self.log_path),
        }


class RankGroup:
    """The ranks of one attempt, started together and stopped together."""

    def __init__(
        self,
        specs: Sequence[RankSpec],
        argv: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        log_dir: Path,
        console: IO[bytes] | None,
        prefix: bool,
    ) -> None:
        self._exits: queue.Queue[RankProcess] = queue.Queue()
        self._console = console
        self._console_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.ranks: list[RankProcess] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for spec, env in zip(specs, envs, strict=True):
                self.ranks.append(self._start(spec, argv, env, log_dir, prefix))
        except BaseException:
            self.stop(grace=0.0)
            raise

    def _start(
        self,
        spec: RankSpec,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        prefix: bool,
    ) -> RankProcess:
        log_path = log_dir / f"rank-{spec.rank}.log"
        log = open(log_path, "ab")  # noqa: SIM115  (closed by the pump thread)
        offset = log.tell()
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP, *argv],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        header = (
            f"=== paralela launch: rank {spec.rank}, attempt {spec.restart + 1}, "
            f"pid {proc.pid}, {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n"
        )
        log.write(header.encode())
        log.flush()
        error_file = env.get("TORCHELASTIC_ERROR_FILE")
        join_file = env.get("PARALELA_JOIN_FILE")
        rank = RankProcess(
            spec=spec,
            proc=proc,
            log_path=log_path,
            log_offset=offset,
            error_file=Path(error_file) if error_file else None,
            join_file=Path(join_file) if join_file else None,
        )
        tag = f"[rank {spec.rank}] ".encode() if prefix else b""
        pump = threading.Thread(target=self._pump, args=(rank, log, tag), daemon=True)
        waiter = threading.Thread(target=self._wait, args=(rank, pump), daemon=True)
        pump.start()
        waiter.start()
        self._threads += [pump, waiter]
        return rank

    def _pump(self, rank: RankProcess, log: IO[bytes], tag: bytes) -> None:
        """Copy the rank's output to its log and, prefixed, to the console."""
        assert rank.proc.stdout is not None
        with log, rank.proc.stdout as out:
            for line in iter(out.readline, b""):
                log.write(line)
                log.flush()
                if self._console is not None:
                    with self._console_lock, contextlib.suppress(OSError, ValueError):
                        self._console.write(tag + line)
                        self._console.flush()

    def _wait(self, rank: RankProcess, pump: threading.Thread) -> None:
        rank.returncode = rank.proc.wait()
        rank.ended = time.time()
        pump.join(timeout=5.0)  # its last lines belong in the log before anyone reads it
        self._exits.put(rank)

    def wait_first_failure(
        self, *, done_when_exits: int | None = None, rendezvous_timeout: float | None = None
    ) -> RankProcess | None:
        """Block until every rank ended (``None``) or one failed (that rank, the first).

        Args:
            done_when_exits: a rank whose success ends the job even while others still
                run (TensorFlow's chief: its parameter servers serve forever); the
                caller then stops the rest.
            rendezvous_timeout: watch the ranks join torch's process group: a rank that
                ends without joining while another waits for it, or no rank entering
                or joining for this many seconds, raises (see ``JoinWatch``).

        Raises:
            RendezvousError: the process group cannot complete; the caller stops the rest.
        """
        watch = JoinWatch(self.ranks, rendezvous_timeout) if rendezvous_timeout else None
        running = len(self.ranks)
        while running:
            polling = watch is not None and not watch.complete
            try:
                rank: RankProcess | None = self._exits.get(timeout=POLL_S if polling else None)
            except queue.Empty:
                rank = None
            if rank is not None:
                running -= 1
                if rank.returncode != 0:
                    return rank
                if rank.spec.rank == done_when_exits:
                    return None
            problem = watch.check() if watch is not None else None
            if problem is not None:
                raise RendezvousError(problem)
        return None

    def stop(self, grace: float) -> None:
        """SIGTERM every live rank's process group, SIGKILL what is left of it after
        ``grace`` (its children too, once the rank itself has exited); what is left in
        the groups of ranks that had already exited gets SIGKILL at once."""
        live = [r for r in self.ranks if r.proc.poll() is None]
        # Each rank leads its own session (pgid == pid); the waiter threads reap them.
        stop_groups([r.proc.pid for r in live], grace)
        for rank in self.ranks:
            if rank not in live:  # the rank's own children (data loader workers...)
                kill_group(rank.proc.pid)
            rank.proc.wait()
        for thread in self._threads:
            thread.join(timeout=5.0)
