"""Pre-started interpreters for command trials of the form ``python SCRIPT.py ARGS...``.

::

    slot busy with trial n ──────────────────────────── n ends ─┐
    driver: take trial n+1 (asked ahead), start its process:    │
      python -c GATE SCRIPT.py ARGS  (trial n+1's argv and env) │
        imports paralela's report module, waits on its gate ────┤ driver opens the gate
                                                                └─> runs SCRIPT.py as
                                                                    its __main__

A fresh Python costs 30-60 ms before the first line of a script runs (interpreter, site,
the script's imports): time in which the slot is idle, 6-12 % of a 0.5 s trial. The driver
starts each slot's next process while the current trial runs, with the next trial's
arguments and environment (``CUDA_VISIBLE_DEVICES``, ``PARALELA_TRIAL_PARAMS``...) already
set, and holds it at a gate: a pipe it reads one byte from. It runs nothing of the user's
before the gate opens, so a trial still gets a fresh process of its own, and nothing on a
GPU happens while the slot's previous trial still holds it.

When the gate closes without opening (the sweep stopped, the driver died), the process
exits without running the script. Only plain ``python SCRIPT.py ...`` commands (any
``python*`` interpreter, no interpreter options) are started this way; any other command
starts when its slot frees, as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = ["ENV_GATE_FD", "GATE_CODE", "gated_argv", "is_python_script"]

ENV_GATE_FD = "PARALELA_GATE_FD"

# Runs as ``python -c GATE_CODE SCRIPT ARGS...``. Before the gate: what every trial
# imports anyway to report (if this interpreter has paralela). After it: the script, as
# ``python SCRIPT ARGS...`` runs it (CPython's own steps, without runpy and pkgutil,
# which would cost each trial ~3 ms of CPU more): sys.argv, sys.path[0] = the script's
# (real) directory, a fresh __main__ module with an absolute __file__, its exit code; an
# exception is printed by sys.excepthook from the script's first frame, as Python does.
GATE_CODE = """\
import os, sys
gate = int(os.environ.pop("PARALELA_GATE_FD"))
try:
    import paralela.sweeping._report
except ImportError:
    pass
opened = os.read(gate, 1) == b"g"
os.close(gate)
if not opened:
    os._exit(0)
sys.argv = sys.argv[1:]
if not getattr(sys.flags, "safe_path", False):
    sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
script = os.path.join(os.getcwd(), sys.argv[0])
main = type(sys)("__main__")
main.__file__ = script
main.__cached__ = None
main.__builtins__ = __builtins__
sys.modules["__main__"] = main
try:
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)
except Exception as error:
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != script:
        frames = frames.tb_next
    sys.excepthook(type(error), error.with_traceback(frames), frames)
    sys.exit(1)
"""

_PYTHON = re.compile(r"python[0-9.]*")


def is_python_script(argv: Sequence[str]) -> bool:
    """Whether the command is ``python SCRIPT.py ARGS...`` with a script that exists."""
    if len(argv) < 2 or _PYTHON.fullmatch(os.path.basename(argv[0])) is None:
        return False
    script = argv[1]
    return (
        script.endswith(".py")
        and not script.startswith("-")
        and "{" not in script
        and os.path.isfile(script)
    )


def gated_argv(filled: Sequence[str]) -> list[str]:
    """The pre-started form of a filled-in ``python SCRIPT.py ARGS...`` command."""
    return [filled[0], "-c", GATE_CODE, *filled[1:]]
