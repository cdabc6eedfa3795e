"""paralela.loading: the one ``module:Name`` resolver (CLI functions, scale targets,
compare estimators); every problem is a ConfigError saying what to do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from paralela.errors import ConfigError
from paralela.loading import load_function, load_object


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("loadme", "broken", "fromfile"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "loadme.py").write_text("VALUE = 3\n\ndef square(x):\n    return x * x\n")
    (tmp_path / "broken.py").write_text("import not_installed_pkg_xyz\n")
    return tmp_path


def test_loads_a_function_from_the_current_directory(here: Path) -> None:
    assert load_function("loadme:square")(4) == 16
    assert sys.path[0] == str(here)


def test_loads_a_function_from_a_file(here: Path) -> None:
    (here / "sub").mkdir()
    (here / "sub" / "fromfile.py").write_text("def f(x):\n    return -x\n")
    assert load_function("sub/fromfile.py:f")(2) == -2


def test_loads_an_object_by_a_dotted_path() -> None:
    assert load_object("os.path.join", dotted=True) is __import__("os").path.join
    assert load_object("os.path:join", search_cwd=False) is __import__("os").path.join


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("loadme", "Expected MODULE:FUNC, got 'loadme'"),
        ("no_such_module_xyz:f", "Cannot import 'no_such_module_xyz'. No module named"),
        ("loadme:nope", "loadme has no attribute 'nope'. Functions defined there: square."),
        ("loadme:squar", "Did you mean 'square'?"),
        ("loadme:VALUE", "loadme:VALUE is not a function (it is of type int)"),
        ("missing.py:f", "No such file: missing.py"),
    ],
)
def test_each_problem_says_what_to_do(here: Path, spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_function(spec)
    assert message in str(info.value)
    assert info.value.__cause__ is None  # nothing raised while importing: no traceback


def test_an_import_that_raises_is_the_cause(here: Path) -> None:
    with pytest.raises(ConfigError, match="Importing 'broken' failed: No module named") as info:
        load_function("broken:f")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_who_leads_the_message() -> None:
    with pytest.raises(ConfigError, match=r"^Family 'x': cannot import 'no_such_module_xyz'"):
        load_object("no_such_module_xyz:Thing", who="Family 'x': ", search_cwd=False)
    with pytest.raises(ConfigError, match=r"^Family 'x': os has no attribute 'nope'"):
        load_object("os.nope", who="Family 'x': ", dotted=True)
