"""``{python}`` in a sweep's trial command: the interpreter running the sweep
(``sys.executable``), not whatever ``python`` comes first on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paralela.errors import ConfigError
from paralela.sweeping._trials import check_command, fill

pytestmark = pytest.mark.timeout(90)

TRIAL = """\
import sys

import paralela

x = float(sys.argv[sys.argv.index("--x") + 1])
with open("interpreters.txt", "a") as out:
    out.write(sys.executable + "\\n")
paralela.report((x - 1.0) ** 2)
"""


def test_fill_gives_the_interpreter_quoted_inside_a_longer_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/opt/my env/bin/python")
    assert fill("{python}", {}) == "/opt/my env/bin/python"  # an argument of its own
    assert fill("{python} t.py --x {x}", {"x": 2}) == "'/opt/my env/bin/python' t.py --x 2"
    assert fill("{python}", {"python": "3.12"}) == "3.12"  # a parameter of that name wins
    assert fill("{{python}}", {}) == "{python}"


def test_check_command_takes_python_as_known() -> None:
    check_command(["{python}", "t.py", "--x", "{x}"], ["x"])
    with pytest.raises(ConfigError, match=r"uses \{pyton\}"):
        check_command(["{python}", "t.py", "{pyton}"], ["x"])


def sweep(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml", "--no-plots",
         "--json", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=80, check=False,
    )  # fmt: skip


def test_a_sweep_runs_its_trials_with_its_own_interpreter(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text("x: {type: float, low: -2.0, high: 3.0}\n")
    (tmp_path / "trial.py").write_text(TRIAL)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\necho 'not this python' >&2\nexit 3\n")
    (fake / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    env.update(PATH=f"{fake}:/usr/bin:/bin", CUDA_VISIBLE_DEVICES="")
    done = sweep(tmp_path, env, "-n", "3", "-w", "1", "-d", "out", "--", "{python}", "trial.py",
                 "--x", "{x}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 3
    used = (tmp_path / "interpreters.txt").read_text().split("\n")[:-1]
    assert used == [sys.executable] * 3

    # Inside a shell command it is quoted: sh -c "{python} trial.py ..." runs too.
    done = sweep(tmp_path, env, "-n", "1", "-d", "out2", "--", "sh", "-c",
                 "{python} trial.py --x {x}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "interpreters.txt").read_text().split("\n")[:-1] == [sys.executable] * 4
