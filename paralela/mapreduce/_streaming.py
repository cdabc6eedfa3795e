"""Commands as mapper, combiner and reducer, as Hadoop Streaming runs them: programs that
read lines on stdin and write ``key<TAB>value`` lines on stdout, run unchanged.

::

    map task, per batch of lines (batched=True, up to 16 MiB):
        lines ──stdin──> mapper command ──stdout──> "key\\tvalue" lines
              [──sorted by key──> combiner command ──stdout──> "key\\tvalue" lines]
              ──parse──> (key, value) pairs ──> the shuffle (as any mapper's)
    reduce task, per partition:
        merged pairs, sorted by key ──"key\\tvalue" lines──> reducer command (stdin, from a
        thread) ──stdout──> "key\\tvalue" lines ──parse──> the part file

A line splits at its first tab: ``key<TAB>value``; a line without a tab is a key with
the value ``None`` (written back to a command as the key alone), as Hadoop's
``TextOutputFormat`` does. Keys and values are text: a command's output must be UTF-8.
A command line is split as a shell would (``shlex``), but no shell runs it: write
``bash -c '...'`` for pipes. It runs in the working directory the driver had when the
job was given, with the worker's environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from paralela.errors import ConfigError, UserFunctionError

__all__ = ["Command", "CommandFailed", "CommandMapper", "CommandReducer", "stream_reduce"]

#: Characters of a failed command's stderr quoted in its error.
STDERR_TAIL = 2000


class CommandFailed(Exception):
    """A command exited with a non-zero status (its stderr's tail in the message)."""


class Command:
    """A command line, checked now: its program must exist.

    Its identity (what a run directory's resume compares) covers the command line and
    the contents of every file it names, so an edited ``mapper.py`` is seen.

    Raises:
        ConfigError: an empty command, unbalanced quotes, or a program not found.
    """

    def __init__(self, command: str, role: str) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"The {role} command {command!r} cannot be split: {exc}.") from None
        if not argv:
            raise ConfigError(f"The {role} command is empty; give a program to run.")
        if shutil.which(argv[0]) is None:
            raise ConfigError(
                f"The {role} command {command!r}: program {argv[0]!r} not found (not on PATH, "
                "or not executable). Give its path, or run a script with its interpreter "
                "('python3 mapper.py')."
            )
        self.command = command
        self.role = role
        self.argv = argv
        # Where it runs: the driver's working directory now, whichever process runs it
        # later (a pool's worker started elsewhere, a Slurm task).
        self.cwd = os.getcwd()
        self.files = _digest_files(argv, self.cwd)

    def run(self, data: bytes) -> bytes:
        """Run the command with ``data`` on stdin; its stdout.

        Raises:
            CommandFailed: it exited non-zero (or was killed).
        """
        with tempfile.TemporaryFile() as err:
            done = subprocess.run(
                self.argv, input=data, stdout=subprocess.PIPE, stderr=err, cwd=self.cwd
            )
            if done.returncode != 0:
                raise CommandFailed(self._failure(done.returncode, err))
        return done.stdout

    def _failure(self, returncode: int, err: BinaryIO) -> str:
        err.seek(0)
        tail = err.read()[-STDERR_TAIL:].decode("utf-8", "replace").strip()
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited {returncode}"
        said = f"; its stderr ends:\n{tail}" if tail else " (nothing on stderr)"
        return f"the {self.role} command {self.command!r} {how}{said}"

    def identity(self) -> str:
        """The command line and the sha256 of each file it names (what a resume compares)."""
        files = ", ".join(f"{path} sha256:{digest[:16]}" for path, digest in self.files.items())
        return f"command {self.command!r}" + (f" ({files})" if files else "")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.command!r})"


class CommandMapper:
    """A batched mapper that pipes each batch of lines through a command (and the
    command's pairs through a combiner command, sorted by key, when one is given)."""

    def __init__(self, mapper: Command, combiner: Command | None) -> None:
        self.mapper = mapper
        self.combiner = combiner
        self.__name__ = self.__qualname__ = f"command {mapper.command!r}"

    def __call__(self, lines: list[Any]) -> list[tuple[str, str | None]]:
        pairs = parse(self.mapper.run(_encode_lines(lines)), self.mapper)
        if self.combiner is None or not pairs:
            return pairs
        pairs.sort(key=_key_of)
        return parse(self.combiner.run(b"".join(map(_encode_pair, pairs))), self.combiner)

    def identity(self) -> str:
        combiner = "" if self.combiner is None else f" | combiner {self.combiner.identity()}"
        return self.mapper.identity() + combiner

    def __repr__(self) -> str:
        return f"CommandMapper({self.mapper.command!r})"


class CommandReducer:
    """Marks a reducer command: a reduce task streams its whole partition through it."""

    def __init__(self, reducer: Command) -> None:
        self.reducer = reducer
        self.__name__ = self.__qualname__ = f"command {reducer.command!r}"

    def __call__(self, key: Any, values: Iterator[Any]) -> Any:
        raise TypeError("a reducer command reduces whole partitions (see stream_reduce)")

    def identity(self) -> str:
        return self.reducer.identity()

    def __repr__(self) -> str:
        return f"CommandReducer({self.reducer.command!r})"


def stream_reduce(
    reducer: CommandReducer, segments: list[Any], combiner: Any, partition: int
) -> Iterator[tuple[str, str | None]]:
    """The pairs the reducer command writes for one partition: the partition's merged
    pairs go to its stdin as sorted ``key<TAB>value`` lines, from a thread, while its
    stdout is read here.

    Raises:
        UserFunctionError: the command exited non-zero or wrote a line that is not
            UTF-8 (function="reducer", ``where`` the partition).
        OSError: a spill file cannot be read (as ``reduce_partition`` raises).
    """
    from paralela.mapreduce._merge import reduce_partition

    command = reducer.reducer
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            command.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=command.cwd
        )
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None
        assert stdout is not None
        failure: list[BaseException] = []

        closed = False  # the command stopped reading (``head``): its exit status decides

        def write(key: Any, values: Iterator[Any]) -> None:
            nonlocal closed
            if not closed:
                try:
                    stdin.writelines(_encode_pair((key, value)) for value in values)
                except BrokenPipeError:
                    closed = True

        def feed() -> None:
            try:
                for _ in reduce_partition(segments, write, combiner=combiner):
                    pass
            except BaseException as exc:  # a damaged spill: raised in the task
                failure.append(exc)
            finally:
                with contextlib.suppress(BrokenPipeError):
                    stdin.close()

        writer = threading.Thread(target=feed, name=f"paralela-reduce-{partition}", daemon=True)
        writer.start()
        try:
            for number, line in enumerate(stdout, 1):
                yield _parse_line(line, command, number)
            returncode = proc.wait()
        except CommandFailed as exc:
            raise _reduce_error(str(exc), partition) from None
        finally:
            if proc.poll() is None:  # stopped early: the caller failed or closed us
                proc.kill()
                proc.wait()
            writer.join()
            stdout.close()
        if failure:
            raise failure[0]
        if returncode != 0:
            raise _reduce_error(command._failure(returncode, err), partition)


def _reduce_error(message: str, partition: int) -> UserFunctionError:
    return UserFunctionError(
        f"{message[:1].upper()}{message[1:]}\n  in the reduce task of partition {partition}",
        function="reducer",
        where=f"partition {partition}",
    )


def parse(output: bytes, command: Command) -> list[tuple[str, str | None]]:
    """The pairs of a command's output lines."""
    return [
        _parse_line(line, command, number)
        for number, line in enumerate(output.splitlines(keepends=True), 1)
    ]


def _parse_line(line: bytes, command: Command, number: int) -> tuple[str, str | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandFailed(
            f"the {command.role} command {command.command!r} wrote line {number} that is "
            f"not UTF-8 ({exc.reason} at byte {exc.start}): {line[:80]!r}; commands exchange "
            "text lines: write UTF-8"
        ) from None
    text = text.removesuffix("\n").removesuffix("\r")
    key, tab, value = text.partition("\t")
    return (key, value) if tab else (key, None)


def _key_of(pair: tuple[str, str | None]) -> str:
    return pair[0]


def _encode_lines(lines: Iterable[Any]) -> bytes:
    text = "".join(f"{line}\n" for line in lines)
    return text.encode("utf-8", "surrogateescape")


def _encode_pair(pair: tuple[Any, Any]) -> bytes:
    key, value = pair
    text = f"{key}\n" if value is None else f"{key}\t{value}\n"
    return text.encode("utf-8", "surrogateescape")


def _digest_files(argv: list[str], cwd: str) -> dict[str, str]:
    """sha256 of each argument that names a regular file (the scripts a command runs)."""
    found = {}
    for i, path in enumerate(argv):
        if i == 0 and os.sep not in path:
            continue  # a program found on PATH (python3, cat): its name counts, not its bytes
        full = os.path.join(cwd, path)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                found[path] = hashlib.sha256(f.read()).hexdigest()
    return found
