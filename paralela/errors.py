"""paralela's exceptions.

Every error says what happened, what is allowed, and what to do::

    ParalelaError
    ├── ConfigError (ValueError)        bad option or input, raised before work starts
    │   └── UnpicklableError            a function or argument cannot travel to a worker
    │                                   (also a pickle.PicklingError, as with Pool)
    ├── TaskError                       the user's function raised an exception that
    │                                   cannot be re-raised as itself (see TaskError)
    ├── MapError                        on_error="collect": every TaskError of a run
    ├── WorkerDiedError                 a worker died (signal, exit code) more often than allowed
    ├── RunStoreError                   the run directory cannot be used
    │   └── FingerprintMismatchError    the run directory belongs to another function or input
    ├── DistributedError                a distributed run (launch, strategies) cannot go on
    │   ├── RendezvousError             ranks did not all meet before the timeout
    │   └── RankFailedError             a rank of a launch died; the others were stopped
    ├── MapReduceError                  a MapReduce job cannot go on
    │   ├── InputError (ValueError)     an input is missing, unreadable or malformed (file, line)
    │   └── UserFunctionError           the mapper, combiner or reducer raised or returned
    │                                   something unusable (names the record or key)
    ├── StageError                      staging a dataset failed (paralela.staging)
    │   └── VerificationError           a copy does not match its source's checksum
    └── MissingExtraError (ImportError) an optional dependency is not installed

(``StageError`` and ``VerificationError`` live in ``paralela.staging``, next to the code
that raises them, as ``SweepError`` in ``paralela.sweeping``, ``CompareError`` (no
candidate of a comparison completed) in ``paralela.comparing``, ``ScalingError`` in
``paralela.scaling``, ``ModelError`` (a served or predicting model failed) in
``paralela.serving`` and the Slurm backend's ``SlurmCommandError`` in
``paralela.backends.slurm``.)
"""

from __future__ import annotations

import _pickle as pickle  # pickle.py's PicklingError is this one; a worker skips re
from collections.abc import Iterable, Sequence

# typing is not imported at run time: every worker process imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ConfigError",
    "DistributedError",
    "FingerprintMismatchError",
    "InputError",
    "MapError",
    "MapReduceError",
    "MissingExtraError",
    "ParalelaError",
    "RankFailedError",
    "RendezvousError",
    "RunStoreError",
    "TaskError",
    "UnpicklableError",
    "UserFunctionError",
    "WorkerDiedError",
    "add_note",
    "describe_exit",
    "did_you_mean",
]


class ParalelaError(Exception):
    """Base class of every error paralela raises on purpose."""


class ConfigError(ParalelaError, ValueError):
    """An option or an input is not valid; raised before any work starts where possible."""


class UnpicklableError(ConfigError, pickle.PicklingError):
    """A function, argument or item cannot be serialised to reach a worker. Also a
    ``pickle.PicklingError``, so code written for ``multiprocessing.Pool`` catches it."""


class TaskError(ParalelaError):
    """The user's function raised an exception that cannot be re-raised as itself.

    ``paralela.map`` re-raises the function's exception as its own type; it raises a
    ``TaskError`` only when that exception cannot be rebuilt in the driver (it does not
    pickle, or its class does not import there) or is not an ``Exception`` (a
    ``KeyboardInterrupt`` or ``SystemExit`` raised by the function). ``MapError.failures``
    holds one ``TaskError`` per failed item, as a record.

    Attributes:
        index: position of the failing item in the input.
        item_repr: a short ``repr`` of that item.
        remote_traceback: the traceback as formatted in the worker.
        exc_type: the qualified name of the original exception type.
        exception: the original exception, rebuilt in the driver (``None`` when it could
            not be).
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None,
        item_repr: str,
        remote_traceback: str,
        exc_type: str,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.item_repr = item_repr
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.exception: BaseException | None = None

    def __str__(self) -> str:
        where = f"item {self.index} ({self.item_repr})" if self.index is not None else "a task"
        return (
            f"{self.exc_type} in {where}: {self.args[0]}\n\n"
            f"Remote traceback:\n{self.remote_traceback.rstrip()}"
        )

    def __reduce__(self) -> Any:
        return (
            _rebuild_task_error,
            (self.args[0], self.index, self.item_repr, self.remote_traceback, self.exc_type),
        )


def _rebuild_task_error(
    message: str, index: int | None, item_repr: str, tb: str, exc_type: str
) -> TaskError:
    return TaskError(
        message, index=index, item_repr=item_repr, remote_traceback=tb, exc_type=exc_type
    )


class MapError(ParalelaError):
    """Raised after a run with ``on_error="collect"`` in which some items failed.

    Attributes:
        failures: one :class:`TaskError` per failed item, in input order.
        results: the full result list, with ``None`` where an item failed.
        summary: the run's :class:`~paralela.MapSummary` (``None`` if not known).
    """

    def __init__(
        self, failures: Sequence[TaskError], results: list[Any], summary: Any = None
    ) -> None:
        self.failures = list(failures)
        self.results = results
        self.summary = summary
        first = self.failures[0] if self.failures else None
        head = f"{len(self.failures)} of {len(results)} items failed"
        detail = f"; the first one:\n{first}" if first is not None else ""
        super().__init__(head + detail)

    def __reduce__(self) -> Any:
        return (MapError, (self.failures, self.results, self.summary))


def describe_exit(exitcode: int | None) -> str:
    """Turn a process exit code into words: ``"killed by SIGKILL"``, ``"exit code 3"``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        import signal  # here: signal.py's enums cost a worker ~1.5 ms at start-up

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = ""
        if -exitcode == signal.SIGKILL:
            hint = " (often the out-of-memory killer, or someone ran kill -9)"
        elif -exitcode == signal.SIGSEGV:
            hint = " (a crash in compiled code)"
        return f"killed by {name}{hint}"
    return f"exit code {exitcode}"


class WorkerDiedError(ParalelaError):
    """A worker process died while it ran a chunk, and retries are used up.

    Attributes:
        exitcode: the worker's exit code (negative: the signal that killed it).
        indices: the input positions of the items that were in the dead worker's chunk.
        attempts: how many times the chunk was tried.
    """

    def __init__(
        self,
        exitcode: int | None,
        *,
        indices: Sequence[int] = (),
        attempts: int = 1,
        pid: int | None = None,
    ) -> None:
        self.exitcode = exitcode
        self.indices = list(indices)
        self.attempts = attempts
        self.pid = pid
        span = ""
        if self.indices:
            lo, hi = self.indices[0], self.indices[-1]
            span = f" while running items {lo}..{hi}" if hi != lo else f" while running item {lo}"
        who = f"worker (pid {pid})" if pid is not None else "worker"
        super().__init__(
            f"A {who} died{span}: {describe_exit(exitcode)}; tried {attempts} time(s). "
            "If it ran out of memory, use fewer workers or smaller items; "
            "raise retries= to try more often."
        )

    def __reduce__(self) -> Any:
        return (
            _rebuild_worker_died,
            (self.exitcode, self.indices, self.attempts, self.pid, self.args),
        )


def _rebuild_worker_died(
    exitcode: int | None, indices: list[int], attempts: int, pid: int | None, args: tuple[Any, ...]
) -> WorkerDiedError:
    error = WorkerDiedError(exitcode, indices=indices, attempts=attempts, pid=pid)
    error.args = args  # keeps a message that was replaced after construction
    return error


class RunStoreError(ParalelaError):
    """The run directory cannot be used as asked."""


class FingerprintMismatchError(RunStoreError):
    """The run directory holds results of another function or other inputs."""


class DistributedError(ParalelaError):
    """A distributed run cannot go on: a rank is missing, died, or was misconfigured."""


class RendezvousError(DistributedError):
    """Ranks did not all meet before the timeout; the message names the missing ones."""


class RankFailedError(DistributedError):
    """A rank of a launch died; the others were stopped.

    Attributes:
        rank: the global rank that failed first.
        exitcode: its exit code (negative: the signal that killed it).
        log_path: where its log is, when it has one.
    """

    def __init__(
        self, message: str, *, rank: int, exitcode: int | None, log_path: str | None = None
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.log_path = log_path

    def __reduce__(self) -> Any:
        return (_rebuild_rank_failed, (self.args, self.rank, self.exitcode, self.log_path))


def _rebuild_rank_failed(
    args: tuple[Any, ...], rank: int, exitcode: int | None, log_path: str | None
) -> RankFailedError:
    return RankFailedError(args[0] if args else "", rank=rank, exitcode=exitcode, log_path=log_path)


class MapReduceError(ParalelaError):
    """A MapReduce job cannot go on; the message says why and what to do."""


class InputError(MapReduceError, ValueError):
    """An input of a MapReduce job cannot be read: missing, unreadable, not UTF-8 or
    malformed. The message names the file and, where it has one, the line or record.

    Attributes:
        path: the file, or None for an in-memory input.
        where: the place in it ("line 12", "row group 3, row 7", "record 40"), or None.
    """

    def __init__(self, message: str, *, path: str | None = None, where: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.where = where

    def __reduce__(self) -> Any:
        return (_rebuild_input_error, (self.args, self.path, self.where))


def _rebuild_input_error(args: tuple[Any, ...], path: str | None, where: str | None) -> InputError:
    return InputError(args[0] if args else "", path=path, where=where)


class UserFunctionError(MapReduceError):
    """The mapper, combiner or reducer of a MapReduce job raised, or returned something
    that is not what it must return. The message names the function, the record or key
    and where the record came from; the user's exception is ``__cause__`` when there was
    one.

    Attributes:
        function: "mapper", "combiner" or "reducer".
        where: where the record came from ("corpus/a.txt line 12") or the key's repr.
    """

    def __init__(self, message: str, *, function: str, where: str | None = None) -> None:
        super().__init__(message)
        self.function = function
        self.where = where

    def __reduce__(self) -> Any:
        return (_rebuild_user_function_error, (self.args, self.function, self.where))


def _rebuild_user_function_error(
    args: tuple[Any, ...], function: str, where: str | None
) -> UserFunctionError:
    return UserFunctionError(args[0] if args else "", function=function, where=where)


class MissingExtraError(ParalelaError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed. "
            f"Install it with: pip install 'paralela[{extra}]'"
        )
        self.module = module
        self.extra = extra


def add_note(exc: BaseException, note: str) -> None:
    """Add a PEP 678 note (shown under the traceback) on every Python paralela supports."""
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'log'?`` for a mistyped ``word`` among ``choices`` (to append to
    an error's message), or ``""`` when no choice is close.

    A choice that is ``word`` with two neighbouring letters swapped is the one meant
    (``lgo`` -> ``log``, not the as-close ``low``); otherwise every choice as close as
    the closest is named (`` Did you mean 'lr' or 'l2'?``), not the first in the
    alphabet. Close is difflib's measure (a ratio of at least 0.6), as Click's.
    """
    unique = list(dict.fromkeys(str(choice) for choice in choices))
    swapped = [choice for choice in unique if _one_swap(word, choice)]
    if swapped:
        close = swapped
    else:
        import difflib  # only for an error's message: every worker imports this module

        ratios = {choice: difflib.SequenceMatcher(None, choice, word).ratio() for choice in unique}
        best = max((r for r in ratios.values() if r >= 0.6), default=None)
        close = [choice for choice, r in ratios.items() if r == best]
    if not close:
        return ""
    names = [repr(choice) for choice in close]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f" Did you mean {listed}?"


def _one_swap(word: str, choice: str) -> bool:
    """``choice`` is ``word`` with two neighbouring letters swapped."""
    if len(word) != len(choice) or word == choice:
        return False
    differ = [i for i, (a, b) in enumerate(zip(word, choice, strict=True)) if a != b]
    return (
        len(differ) == 2
        and differ[1] == differ[0] + 1
        and word[differ[0]] == choice[differ[1]]
        and word[differ[1]] == choice[differ[0]]
    )
