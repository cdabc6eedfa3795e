"""One CLI: ``paralela --version``, each command's own exit codes in its ``--help``, and
unknown options refused the same way by every command (``sweep``, ``launch`` and
``scale``, which end with a program, included)."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import paralela
from paralela.cli import VERSION_OPTIONS, app
from paralela.cli import _app as cli_app
from paralela.cli import _errors as cli_errors

COMMANDS = {
    command.name or command.callback.__name__: command
    for command in app.registered_commands
    if command.callback
}


def flat(text: str) -> str:
    """``text`` on one line, without rich's panel borders."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


# -- --version -------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_prints_the_version_and_exits_0(option: str) -> None:
    result = invoke(option)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"paralela {paralela.__version__}\n"


def test_version_from_the_console_script_loads_no_command_module() -> None:
    # The entry point answers --version from the app alone: no command module (map,
    # sweep, ...) is imported, so it is as quick as `import typer`.
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules "
        "if m.startswith('paralela.cli.')), file=sys.stderr))\n"
        "sys.argv = ['paralela', '--version']\n"
        "from paralela.cli import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"paralela {paralela.__version__}\n"
    assert done.stderr.strip() == "['paralela.cli._app']"


def test_version_options_are_spelled_once() -> None:
    assert VERSION_OPTIONS == cli_app.VERSION_OPTIONS


# -- each command's exit codes ------------------------------------------------------------


def module_of(name: str) -> ModuleType:
    callback = COMMANDS[name].callback
    assert callback is not None
    return sys.modules[callback.__module__]


def options_of(name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def exit_names_used(module: ModuleType, seen: set[str] | None = None) -> set[str]:
    """The ``EXIT_*`` constants that ``module``'s code exits with (a ``fail`` call, a
    ``codes=`` table), and those of the CLI modules it imports (its helpers), the
    ``EXIT_CODES`` table itself left out."""
    seen = set() if seen is None else seen
    seen.add(module.__name__)
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "EXIT_CODES" for t in targets):
                tree.body.remove(node)
                break
    names = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id.startswith("EXIT_") and n.id != "EXIT_CODES"
    }
    for imported in ast.walk(tree):
        if isinstance(imported, ast.ImportFrom) and (imported.module or "").startswith(
            "paralela.cli._"
        ):
            helper = imported.module or ""
            if helper not in seen and helper not in ("paralela.cli._errors", "paralela.cli._app"):
                names |= exit_names_used(sys.modules[helper], seen)
    return names


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_lists_the_commands_own_exit_codes(name: str) -> None:
    table = module_of(name).EXIT_CODES
    codes = [code for code, _ in table]
    result = invoke(name, "--help")
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert cli_errors.exit_codes_help(table).removesuffix(".") in text
    # Every command exits 0, 2 (Click's usage errors) and, stopped, 130 and 143.
    for always in (0, cli_errors.EXIT_USAGE, 130, 143):
        assert always in codes, (name, codes)
    assert codes == sorted(codes), codes
    # What the command's code exits with is listed, ...
    used = {getattr(cli_errors, n) for n in exit_names_used(module_of(name))}
    assert used <= set(codes), (name, used - set(codes))
    # ... and the epilog names only options this command has (not map's --on-error).
    epilog = cli_errors.exit_codes_help(table)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", epilog))
    assert named <= options_of(name), (name, named - options_of(name))


def test_mapreduce_predict_and_serve_no_longer_print_maps_exit_codes() -> None:
    for name in ("mapreduce", "predict", "serve"):
        text = flat(invoke(name, "--help").stdout)
        assert "--on-error" not in text
        assert "the function raised" not in text
    assert "5 the ranks did not meet" in flat(invoke("launch", "--help").stdout)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_says_what_it_does(name: str) -> None:
    # The CLI reference is generated from these texts: none may be missing.
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    for param in command.params:
        assert len(getattr(param, "help", None) or "") >= 10, (name, param.opts)


# -- unknown options ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refuses_an_unknown_option(name: str) -> None:
    result = invoke(name, "--no-such-thing", "x")
    assert result.exit_code == 2, result.output
    assert "No such option: --no-such-thing" in flat(result.output)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["sweep", "--trial", "2"], "No such option: --trial (Possible options:"),
        (["sweep", "--trail", "3", "--", "echo"], "No such option: --trail (Possible options:"),
        (
            ["launch", "--nporc", "2", "train.py"],
            "No such option: --nporc (Possible options: --nproc)",
        ),
        (
            ["scale", "--wrkers", "1,2", "--", "true"],
            "No such option: --wrkers (Possible options: --workers)",
        ),
        (["launch", "--nproc=2", "--bogus=1", "train.py"], "No such option: --bogus"),
    ],
)
def test_a_mistyped_option_before_the_program_is_refused_with_close_matches(
    args: list[str], said: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert said in text
    if args[1] in ("--trial", "--trail"):
        assert "--trials" in text  # the option meant is offered


def context(name: str, args: list[str]) -> Any:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return command.make_context(name, list(args))


def test_what_follows_the_program_is_the_programs() -> None:
    ctx = context("launch", ["--nproc", "2", "train.py", "--epochs", "3", "--nproc", "9"])
    assert ctx.params["nproc"] == 2
    assert ctx.params["program"] == ["train.py", "--epochs", "3", "--nproc", "9"]
    ctx = context("launch", ["-m", "--", "pkg.train", "--lr", "0.1"])
    assert ctx.params["module"] is True
    assert ctx.params["program"] == ["pkg.train", "--lr", "0.1"]


def test_a_sweeps_trial_command_keeps_its_options() -> None:
    ctx = context("sweep", ["--trials", "2", "--", "python", "t.py", "--lr", "{lr}"])
    assert ctx.params["trials"] == 2
    assert ctx.args == ["python", "t.py", "--lr", "{lr}"]
    ctx = context("sweep", ["-n", "2", "python", "t.py", "--trials", "{n}"])
    assert ctx.params["trials"] == 2
    assert ctx.args == ["python", "t.py", "--trials", "{n}"]
    ctx = context("scale", ["--workers", "1,2", "--", "paralela", "map", "-w", "{workers}"])
    assert ctx.args == ["paralela", "map", "-w", "{workers}"]
    ctx = context("scale", ["-w", "1,2", "mywork:run"])
    assert ctx.args == ["mywork:run"]


def test_the_program_commands_share_one_setting() -> None:
    from paralela.cli._options import PROGRAM_AFTER_OPTIONS

    for name in ("sweep", "launch", "scale"):
        assert COMMANDS[name].context_settings == PROGRAM_AFTER_OPTIONS


def test_run_through_the_console_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "paralela", "launch", "--nporc", "2", "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "No such option: --nporc (Possible options: --nproc)" in flat(done.stderr)
    assert "cannot find the program" not in done.stderr.lower()
