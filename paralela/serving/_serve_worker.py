"""A model worker of ``paralela serve``, started as
``python -c "from paralela.serving._serve_worker import main; main()" SOCKET_FD``.

::

    server ──("init", sys_path, model)──> Model() + setup(device) ──> ("ready", pid, device, s)
                                                        or raises ──> ("failed", message)
    server ──("batch", inputs)──> predict(inputs) ──> ("ok", [JSON bytes per output])
                                  a batch that raises: each input alone, so that one bad
                                  input fails only its own request ──> ("ok", [...]) with
                                  ("error", message) in the place of the inputs that failed
    end of file (the server is gone, even SIGKILLed) ──> exit at once, even mid-batch

The environment (``CUDA_VISIBLE_DEVICES``, thread limits) is the slot's, set by the server
before the process starts; the device given to ``setup`` follows from it. Outputs are
encoded to JSON here, in parallel with the server's event loop, which only joins bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Failed", "encode_outputs", "main"]


class Failed:
    """An input whose prediction failed; the server answers its request with ``status``:
    500, or the ``status_code`` of the HTTP exception the model raised (FastAPI's and
    Starlette's ``HTTPException``, as LitServe APIs raise to refuse a request)."""

    __slots__ = ("message", "status")

    def __init__(self, message: str, status: int = 500) -> None:
        self.message = message
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (Failed, (self.message, self.status))

    @classmethod
    def of(cls, error: BaseException) -> Failed:
        """The failure a model's error means (a ModelError's cause is the user's own)."""
        cause = error.__cause__
        status = getattr(cause, "status_code", None)
        if isinstance(status, int) and 400 <= status < 600:
            return cls(str(getattr(cause, "detail", None) or cause), status)
        return cls(str(error))


def _default(value: Any) -> Any:
    from paralela.serving._predict_output import plain

    converted = plain(value)
    if converted is value:
        raise TypeError(f"an output of type {type(value).__name__} is not JSON")
    return converted


def encode_outputs(outputs: list[Any], output_model: Any = None) -> list[bytes | Failed]:
    """Each output as JSON bytes; an output JSON cannot hold (NaN, an object) is a
    :class:`Failed` naming why. With an ``output_model``, each output is validated by it."""
    encoded: list[bytes | Failed] = []
    for output in outputs:
        try:
            if output_model is not None:
                output = output_model.model_validate(output).model_dump(mode="json")
            encoded.append(
                json.dumps(output, default=_default, allow_nan=False, separators=(",", ":"))
                .encode()
            )  # fmt: skip
        except Exception as exc:
            encoded.append(Failed(f"the model's output cannot be sent as JSON: {exc}"))
    return encoded


def _predict(model: Any, inputs: list[Any], input_model: Any, output_model: Any) -> list[Any]:
    from paralela.serving._model import ModelError

    if input_model is not None:
        inputs = [input_model.model_validate(item) for item in inputs]
    try:
        return encode_outputs(model.predict(inputs), output_model)
    except ModelError as exc:
        if len(inputs) == 1:
            return [Failed.of(exc)]
    # One input broke the batch: run each alone, so the others still get their answer.
    results: list[Any] = []
    for item in inputs:
        try:
            results.extend(encode_outputs(model.predict([item]), output_model))
        except ModelError as exc:
            results.append(Failed.of(exc))
    return results


def _read_forever(conn: Connection, inbox: queue.SimpleQueue[bytes]) -> None:
    try:
        while True:
            inbox.put(conn.recv_bytes())
    except (EOFError, OSError):
        from paralela.backends import kill_descendants

        kill_descendants()  # the server is gone: nobody wants the answers
        os._exit(0)


def _ignore_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C reaches the whole process group; the server stops its workers itself."""


def main() -> None:
    """Entry point: the server connection's file descriptor in argv."""
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, _ignore_sigint)
    conn = Connection(fd)
    inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_read_forever, args=(conn, inbox), daemon=True).start()

    _, sys_path, model_bytes = pickle.loads(inbox.get())
    sys.path[:] = sys_path
    started = time.perf_counter()
    try:
        from paralela.backends import mark_process_worker
        from paralela.serving._model import LoadedModel
        from paralela.serving._predict_task import worker_device

        mark_process_worker(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
        cls = pickle.loads(model_bytes)
        device = worker_device()
        model = LoadedModel(cls, device)
    except BaseException as exc:
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        conn.send_bytes(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}", detail)))
        conn.close()
        os._exit(1)
    input_model = getattr(cls, "input_model", None)
    output_model = getattr(cls, "output_model", None)
    setup_seconds = time.perf_counter() - started
    conn.send_bytes(pickle.dumps(("ready", os.getpid(), device, setup_seconds)))
    while True:
        inputs = pickle.loads(inbox.get())
        try:
            reply = ("ok", _predict(model, inputs, input_model, output_model))
        except BaseException as exc:  # the validation of an input, or worse
            reply = ("ok", [Failed(f"{type(exc).__name__}: {exc}")] * len(inputs))
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
