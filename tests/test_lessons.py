"""Every lesson in examples/lessons/ runs in its short mode, like a gallery.

A lesson is a script (``python examples/lessons/X.py``) that measures one technique and
prints at least one line ``RESULT: <headline figure>``; its page, docs/lessons/<slug>.md,
shows the figures of a full run. Scripts are discovered, so a new lesson is tested the
moment it lands. Timings are printed, never asserted: speed lives in bench/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "examples" / "lessons"
PAGES = ROOT / "docs" / "lessons"
SCRIPTS = sorted(LESSONS.glob("*.py")) if LESSONS.is_dir() else []
LESSON_TIMEOUT = 100  # seconds; within pytest-timeout's 120


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_lesson_runs_in_its_short_mode(script: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    # A session of its own: a lesson that hangs is killed with everything it started (a
    # server, workers), and its output so far is shown.
    proc = subprocess.Popen(
        [sys.executable, str(script), "--quick"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LESSON_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"{script.name} --quick ran past {LESSON_TIMEOUT} s (its short mode should take "
            f"seconds)\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left running, if anything
    output = f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert proc.returncode == 0, f"{script.name} --quick exited {proc.returncode}\n{output}"
    results = [line for line in stdout.splitlines() if line.startswith("RESULT: ")]
    assert results, f"{script.name} printed no 'RESULT: ' line\n{output}"
    assert all(line.removeprefix("RESULT: ").strip() for line in results), output
    # Temporary files live in temp dirs the script removes, never in the working directory.
    assert list(tmp_path.iterdir()) == [], f"{script.name} left files behind"


def test_every_lesson_script_says_what_it_teaches_and_has_a_page() -> None:
    assert SCRIPTS, "no lesson scripts in examples/lessons/"
    for script in SCRIPTS:
        text = script.read_text()
        assert text.startswith('"""'), f"{script.name} has no module docstring"
        assert "--quick" in text, f"{script.name} takes no --quick"
        assert "RESULT: " in text, f"{script.name} prints no RESULT line"
    index = (PAGES / "index.md").read_text()
    pages = {p.name for p in PAGES.glob("*.md")} - {"index.md"}
    for page in pages:
        assert f"({page})" in index, f"docs/lessons/index.md does not link {page}"
        text = (PAGES / page).read_text()
        assert "python examples/lessons/" in text, f"{page} gives no command to reproduce"
    # Each page names its script, and each script is named by a page.
    texts = [(PAGES / page).read_text() for page in pages]
    unnamed = [s.name for s in SCRIPTS if not any(s.name in text for text in texts)]
    assert not unnamed, f"no page in docs/lessons/ names {unnamed}"
