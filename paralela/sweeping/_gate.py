"""Pre-started interpreters for command trials of the form ``python SCRIPT.py ARGS...``.

::

    slot busy with trial n ──────────────────────────── n ends ─┐
    driver: take trial n+1 (asked ahead), start its process:    │
      python -c GATE SCRIPT.py ARGS  (trial n+1's argv and env) │
        imports paralela's report module and argparse & co      │
        (PRELOAD), compiles SCRIPT.py, waits on its gate ───────┤ driver opens the gate
                                                                └─> runs SCRIPT.py as
                                                                    its __main__

A fresh Python costs 30-60 ms before the first line of a script runs (interpreter, site,
the script's imports): time in which the slot is idle, 6-12 % of a 0.5 s trial. The driver
starts each slot's next process while the current trial runs, with the next trial's
arguments and environment (``CUDA_VISIBLE_DEVICES``, ``PARALELA_TRIAL_PARAMS``...) already
set, and holds it at a gate: a pipe it reads one byte from. It runs nothing of the user's
before the gate opens, so a trial still gets a fresh process of its own, and nothing on a
GPU happens while the slot's previous trial still holds it.

Before the gate the process also does what the script's first lines would do anyway and
what has no effect but loading code: it imports a few standard-library modules that
nearly every training script loads (:data:`PRELOAD`: ``argparse`` and what its first
parser loads, ``math``; only from the standard library's own directory, never a module
of the user's that would shadow one), and reads and compiles the script (compiled again
after the gate if the file changed meanwhile). For the benchmark's trial script (an
argparse script) on its VM, that took the time from the gate's opening to the script's
first line of work from ~11 ms to ~1.5 ms. It
then freezes what it has loaded (``gc.freeze()``): Python's collections, and the one at
its exit, skip those objects, which never become garbage; without it the exit's full
collection walked them all, ~2-3 ms of each trial's end (and its CPU). The script's own
objects are collected as always, at its exit too; what it can see of the freeze is only
through ``gc`` itself (``gc.get_freeze_count()``; ``gc.get_objects()`` leaves frozen
objects out).

When the gate closes without opening (the sweep stopped, the driver died), the process
exits without running the script. Only plain ``python SCRIPT.py ...`` commands (any
``python*`` interpreter, no interpreter options) are started this way; any other command
starts when its slot frees, as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = [
    "ENV_GATE_FD",
    "GATE_CODE",
    "PRELOAD",
    "PREPARE_CODE",
    "RUN_CODE",
    "WAIT_CODE",
    "gated_argv",
    "is_python_script",
]

ENV_GATE_FD = "PARALELA_GATE_FD"

# The standard-library modules loaded before the gate (see the module docstring): a
# command trial gets its parameters on its command line, and ``argparse`` is how nearly
# every Python training script reads them; its first parser loads ``shutil`` (the help
# formatter's terminal width) and ``locale`` (through ``gettext``). ``math``: numpy and
# torch load it, as do most numeric scripts. Measured with ``python -X importtime`` on
# the benchmark's VM, on top of paralela's report module: argparse 2.1 ms (gettext
# included), shutil 2.4 ms (fnmatch, zlib, bz2, lzma), locale 1.0 ms, math 0.3 ms; and a
# first ``ArgumentParser`` with its ``parse_args`` took 5 ms with them unloaded, 0.5 ms
# loaded. ``typing`` (4-5 ms, with ``re``): numpy, torch and nearly every typed script
# load it; paralela's report module no longer does (it is a function-trial worker's
# start too), and without it here the gate's opening to the benchmark script's first
# line of work went from ~1.3 ms to ~7 ms. Kept short on purpose: a module the script
# does not load costs its import's CPU in every trial (with CPU-bound trials on every
# core, that CPU is the trials');
# ``json`` (2 ms), ``pathlib`` (3.5 ms), ``dataclasses`` (6 ms, with ``inspect``) and
# ``logging`` (7 ms) would each cost more than they save for a script without them.
# Only files of the standard library's own directory load: any other module they would
# load (the user's ``shutil.py`` beside the script or on ``PYTHONPATH``, a module this
# Python lacks) stops the preloading, and the script then imports what it would have
# imported, after the gate.
PRELOAD = ("argparse", "shutil", "locale", "math", "typing")

# Runs as ``python -c GATE_CODE SCRIPT ARGS...``. Before the gate: sys.path[0] = the
# script's (real) directory, as ``python SCRIPT`` sets it; what every trial imports
# anyway to report (if this interpreter has paralela); the PRELOAD modules; the script's
# source, read and compiled (compiled again after the gate if the file changed
# meanwhile, or did not compile: the error is then the script's own, as Python shows
# it); gc.freeze() of all that. Nothing of the script runs. After the gate: the
# script, as ``python SCRIPT ARGS...`` runs it (CPython's own steps, without runpy and
# pkgutil, which would cost each trial ~3 ms of CPU more): sys.argv, a fresh __main__
# module with an absolute __file__, its exit code; an exception is printed by
# sys.excepthook from the script's first frame, as Python does.
PREPARE_CODE = """\
import os, sys
script = os.path.join(os.getcwd(), sys.argv[1])
if not getattr(sys.flags, "safe_path", False):
    sys.path[0] = os.path.dirname(os.path.realpath(script))
try:
    import paralela.sweeping._report
except ImportError:
    pass
class Refused(BaseException):
    pass
class StdlibOnly:
    from importlib.machinery import PathFinder
    home = os.path.dirname(os.__file__) + os.sep
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = cls.PathFinder.find_spec(name, path, target)
        origin = getattr(spec, "origin", None) or ""
        if not origin.startswith(cls.home) or origin[len(cls.home):].startswith(
            ("site-packages", "dist-packages")
        ):
            raise Refused(name)
        return spec
if StdlibOnly.PathFinder in sys.meta_path:
    sys.meta_path.insert(sys.meta_path.index(StdlibOnly.PathFinder), StdlibOnly)
    try:
        for name in PRELOAD_NAMES:
            __import__(name)
    except (Refused, Exception):
        pass
    finally:
        sys.meta_path.remove(StdlibOnly)
def stamp():
    seen = os.stat(script)
    return seen.st_ino, seen.st_dev, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns
try:
    with open(script, "rb") as source:
        compiled = stamp(), compile(source.read(), script, "exec")
except Exception:
    compiled = None
import gc
gc.freeze()
"""

# Waits at the gate (the pipe read end ``gate``): a closed gate exits unrun.
WAIT_CODE = """\
opened = os.read(gate, 1) == b"g"
os.close(gate)
if not opened:
    os._exit(0)
"""

# Runs the script as ``python SCRIPT ARGS...`` would (``sys.argv``: ``-c SCRIPT ARGS...``).
RUN_CODE = """\
sys.argv = sys.argv[1:]
main = type(sys)("__main__")
main.__file__ = script
main.__cached__ = None
main.__builtins__ = __builtins__
sys.modules["__main__"] = main
try:
    if compiled is not None and compiled[0] == stamp():
        code = compiled[1]
    else:
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
PREPARE_CODE = PREPARE_CODE.replace("PRELOAD_NAMES", repr(PRELOAD))

GATE_CODE = PREPARE_CODE + f'gate = int(os.environ.pop("{ENV_GATE_FD}"))\n' + WAIT_CODE + RUN_CODE

_PYTHON = re.compile(r"python[0-9.]*|\{python\}")  # {python}: the sweep's own


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
