"""The CLI reference page (tools/cli_reference.py): every command, every option, as --help.

The page is generated from the Typer app at every site build, so it cannot drift; these
tests check the generator itself: that every visible option of every command is on the
page with its names, its help and its default, that each command's exit codes (its
epilog) are there, that the Markdown renders to the same text (escaping: ``|``, ``<``,
``*`` in help), and that an option added to an app shows up without anyone writing it.
"""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from typing import Any

import markdown
import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools/cli_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cli_reference"] = module
    spec.loader.exec_module(module)
    return module


class _Text(HTMLParser):
    """The text of an HTML page, and of each table row and paragraph on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[str] = []
        self._current: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("tr", "p", "pre", "h2"):
            self._current = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("tr", "p", "pre", "h2") and self._current is not None:
            self.blocks.append(" ".join("".join(self._current).split()))
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._current.append(data + " ")


def rendered_sections(page: str) -> dict[str, list[str]]:
    """{command path: the text blocks of its section}, from the page rendered to HTML."""
    parser = _Text()
    parser.feed(markdown.markdown(page, extensions=["tables", "fenced_code", "toc"]))
    out: dict[str, list[str]] = {}
    current = None
    for block in parser.blocks:
        if re.fullmatch(r"paralela( [\w-]+)*", block):
            current = block
            out[current] = []
        elif current is not None:
            out[current].append(block)
    return out


def squash(text: str) -> str:
    return " ".join(text.split())


def check_every_option(ref: ModuleType, root: Any, page: str) -> int:
    """Assert each command's options, help, defaults and epilog are in its section."""
    sections = rendered_sections(page)
    checked = 0
    ctx = root.context_class(root, info_name=root.name)
    for command, sub_ctx in ref.walk(root, ctx):
        blocks = sections.get(sub_ctx.command_path)
        assert blocks is not None, f"no section for {sub_ctx.command_path}"
        for param in ref.visible_params(command, sub_ctx):
            names, help_text = param.get_help_record(sub_ctx)
            rows = [b for b in blocks if f"{b} ".startswith(squash(names) + " ")]
            assert rows, f"{sub_ctx.command_path}: {names} is missing"
            if not ref.is_argument(param):
                for opt in [*param.opts, *param.secondary_opts]:
                    assert re.search(rf"(^|[ ,/]){re.escape(opt)}([ ,]|$)", names), (opt, names)
            row = rows[0]
            assert squash(help_text) in row, (names, help_text, row)
            assert squash(ref.default_text(param)) in row
            checked += 1
        if command.epilog:
            assert squash(command.epilog) in " ".join(blocks), sub_ctx.command_path
        if command.help:
            first = squash(command.help.split("\n\n")[0])
            assert first in blocks, sub_ctx.command_path
    return checked


def test_every_command_and_every_option_of_paralela_is_on_the_page(ref: ModuleType) -> None:
    root = ref.root_command()
    page = ref.generate()
    ctx = root.context_class(root, info_name="paralela")
    names = root.list_commands(ctx)
    for name in ("map", "mapreduce", "predict", "serve", "sweep", "compare", "launch"):
        assert name in names
    for name in names:
        assert f"## paralela {name}\n" in page
        assert f"[`paralela {name}`](#paralela-{name})" in page
    checked = check_every_option(ref, root, page)
    assert checked > 100  # every command's options, --help included


def test_an_option_added_to_an_app_appears_with_its_help_and_default(ref: ModuleType) -> None:
    app = typer.Typer(name="paralela", add_completion=False)

    @app.command(epilog="Exit codes: 0 ok; 2 a | b <bad>.")
    def run(
        item: str = typer.Argument(..., help="The <item> to *run*."),
        level: int = typer.Option(3, "--level", "-l", help="How deep | how far: a_b [x]."),
        mode: str = typer.Option("fast", help="fast or slow `mode`.", show_default=False),
        loud: bool = typer.Option(True, "--loud/--quiet", help="Say more."),
    ) -> None:
        """Run ITEM at a level.

        A second paragraph with data/*.csv and **stars**.
        """

    @app.command()
    def other() -> None:
        """The other command."""

    root = typer.main.get_command(app)
    page = ref.generate(root)
    assert "## paralela run\n" in page
    # ITEM, --level, --mode, --loud and --help; --help of the group and of other
    assert check_every_option(ref, root, page) == 7
    blocks = rendered_sections(page)["paralela run"]
    assert "item <str> The <item> to *run*. [required]" in blocks
    assert "-l, --level <int> 3 How deep | how far: a_b [x]. [default: 3]" in blocks
    assert "--mode <str> fast fast or slow `mode`." in blocks  # the default, not shown by --help
    assert "--loud / --quiet --loud Say more. [default: loud]" in blocks
    assert "A second paragraph with data/*.csv and **stars**." in blocks
    assert "Exit codes: 0 ok; 2 a | b <bad>." in blocks


def test_the_command_written_to_a_file_matches_the_page(ref: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    assert ref.main(["--output", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page == ref.generate()
    assert page.startswith("# CLI reference\n")
    assert html.escape("<") not in page.split("\n## ")[0]  # the intro is plain Markdown
