"""An item's failure as the map raises it, and back: the user's own exception with the
item attached (:func:`user_error`), and the record a packed cluster task sends back for
it (:func:`failure_record`)."""

from __future__ import annotations

from paralela.backends import RemoteTraceback
from paralela.errors import TaskError, add_note
from paralela.tasks import ItemFailure

__all__ = ["failure_record", "task_error", "user_error"]


def task_error(f: ItemFailure) -> TaskError:
    error = TaskError(
        f.message,
        index=f.index,
        item_repr=f.item_repr,
        remote_traceback=f.traceback,
        exc_type=f.exc_type,
    )
    error.exception = f.exception
    return error


def user_error(f: ItemFailure, isolated: bool) -> BaseException:
    """The exception to raise for a failed item: the user's own, of its own type, with
    the item attached (``paralela_index``, ``paralela_item_repr`` and a note) and, from
    another process, the remote traceback as its ``__cause__``. A :class:`TaskError`
    when it could not be rebuilt here, or is not an ``Exception`` (a ``KeyboardInterrupt``
    or ``SystemExit`` raised by the function must not pass for a Ctrl-C or an exit)."""
    exc = f.exception
    if not isinstance(exc, Exception) or isinstance(exc, TaskError):
        return task_error(f)
    try:
        exc.paralela_index = f.index  # type: ignore[attr-defined]
        exc.paralela_item_repr = f.item_repr  # type: ignore[attr-defined]
    except Exception:  # an exception type that refuses attributes
        return task_error(f)
    add_note(exc, f"paralela: raised by fn on item {f.index} ({f.item_repr})")
    if isolated and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(f.traceback)
    return exc


def failure_record(exc: BaseException) -> ItemFailure | None:
    """The item failure that :func:`user_error` raised as ``exc`` (``None``: not one)."""
    if isinstance(exc, TaskError):
        if exc.index is None:
            return None
        return ItemFailure(
            exc.index, exc.exc_type, str(exc.args[0]), exc.item_repr, exc.remote_traceback,
            exc.exception,
        )  # fmt: skip
    index = getattr(exc, "paralela_index", None)
    if not isinstance(index, int):
        return None
    cause = exc.__cause__
    tb = cause.tb if isinstance(cause, RemoteTraceback) else ""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    item = str(getattr(exc, "paralela_item_repr", ""))
    return ItemFailure(index, kind, str(exc), item, tb or repr(exc), exc)
