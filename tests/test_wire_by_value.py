"""What goes to a worker by reference (the C pickler) and what by value (cloudpickle).

The driver pickles a task with the C pickler when everything it refers to is found again
by module and name in a fresh interpreter, and with cloudpickle otherwise. A function or
class of the user's ``__main__`` would unpickle in the worker as the worker's own
``__main__`` (which is not the user's script): it must go by value. These run real
scripts in fresh interpreters, so that ``__main__`` is the script's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import json, sys
import paralela

OFFSET = 100


class Box:
    def __init__(self, value):
        self.value = value


def from_main(x):
    return x + OFFSET


def unbox(box):
    return box.value * 2


def make_adder(n):
    def add(x):
        return x + n
    return add


results = {
    "main_function": list(paralela.map(from_main, [1, 2, 3], workers=2)),
    "main_class_items": list(paralela.map(unbox, [Box(1), Box(5)], workers=2)),
    "lambda": list(paralela.map(lambda x: x * 3, [1, 2], workers=2)),
    "closure": list(paralela.map(make_adder(7), [1, 2], workers=2)),
    "builtin": list(paralela.map(abs, [-1, -2], workers=2)),
}
print(json.dumps(results))
"""


def run_script(tmp_path: Path, text: str) -> str:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_what_main_defines_goes_by_value_and_runs_in_the_workers(tmp_path: Path) -> None:
    results = json.loads(run_script(tmp_path, SCRIPT))
    assert results == {
        "main_function": [101, 102, 103],
        "main_class_items": [2, 10],
        "lambda": [3, 6],
        "closure": [8, 9],
        "builtin": [1, 2],
    }


def test_an_importable_function_goes_by_reference_without_cloudpickle(tmp_path: Path) -> None:
    (tmp_path / "byref_job.py").write_text("def double(x):\n    return 2 * x\n")
    out = run_script(
        tmp_path,
        """
        import json, sys
        import paralela, byref_job
        got = list(paralela.map(byref_job.double, [1, 2, 3], workers=2))
        print(json.dumps([got, "cloudpickle" in sys.modules]))
        """,
    )
    assert json.loads(out) == [[2, 4, 6], False]


def test_by_reference_only_for_what_a_fresh_interpreter_finds_again() -> None:
    from paralela.backends._wire import _by_reference

    def local() -> None:
        pass

    assert _by_reference(json.dumps)
    assert _by_reference(Path)
    assert _by_reference(Path.exists)  # a method, by its qualified name
    assert not _by_reference(local)  # <locals>
    assert not _by_reference(lambda: None)
    fake_main = type("Fake", (), {"__module__": "__main__"})
    assert not _by_reference(fake_main)
