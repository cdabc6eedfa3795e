"""The CLI reference page, generated from the Typer app itself, so that it cannot drift.

It walks the Click command tree of ``paralela.cli.app`` (``typer.main.get_command``):
the root group, then every sub-command in the order ``paralela --help`` lists them,
each with its usage line, its help, its arguments and options (names, metavar,
default, help and constraints, as ``--help`` prints them) and its epilog (the exit
codes). Hidden options are left out, as ``--help`` leaves them out.

Used three ways:

* as a MkDocs hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds the page
  ``reference/cli.md`` to every build, generated afresh, so ``make docs`` always
  documents the CLI as it is;
* from a shell: ``python tools/cli_reference.py [-o FILE]`` prints it (or writes it);
* from ``tests/test_cli_reference.py``, which checks that every option of every
  command is on the page.
"""

from __future__ import annotations

import argparse
import enum
import html
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"

INTRO = """\
# CLI reference

Every command of `paralela`, every option, its default and its help, generated from
the command line itself (`tools/cli_reference.py` walks the Typer app when the site is
built), so this page cannot miss an option or drift from `paralela COMMAND --help`.
The guide to the command line is [Command line](../cli.md).
"""


@dataclass(frozen=True)
class Section:
    """One command's part of the page: its path (``paralela map``) and its Markdown."""

    path: str
    command: Any  # a Click command (Typer vendors its own Click: duck-typed here)
    markdown: str


def root_command() -> Any:
    """The Click group behind ``paralela``."""
    import typer

    from paralela.cli import app

    command = typer.main.get_command(app)
    if not hasattr(command, "list_commands"):
        raise TypeError(f"paralela.cli.app is a {type(command).__name__}, not a command group")
    return command


def walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """``command`` and every visible sub-command below it, depth first, in help order."""
    yield command, ctx
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from walk(sub, sub.context_class(sub, info_name=name, parent=ctx))


def is_argument(param: Any) -> bool:
    """A positional argument (else an option)."""
    return bool(param.param_type_name == "argument")


def visible_params(command: Any, ctx: Any) -> list[Any]:
    """The parameters ``--help`` shows (``--help`` itself included), in its order."""
    return [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]


def sections(root: Any = None) -> list[Section]:
    """One section per command of ``root`` (default: paralela's), the root group first."""
    if root is None:
        root = root_command()
    ctx = root.context_class(root, info_name=root.name or "paralela")
    return [
        Section(sub_ctx.command_path, command, _section(command, sub_ctx))
        for command, sub_ctx in walk(root, ctx)
    ]


def generate(root: Any = None) -> str:
    """The whole page, Markdown, for ``root`` (a Click group; default: paralela's)."""
    parts = [INTRO]
    all_sections = sections(root)
    parts.append("| Command | What it does |\n|---|---|")
    parts.extend(
        f"| [`{s.path}`](#{anchor(s.path)}) | {_cell(_first_sentence(s.command))} |"
        for s in all_sections[1:]
    )
    parts.append("")
    parts.extend(s.markdown for s in all_sections)
    return "\n".join(parts).rstrip("\n") + "\n"


def anchor(path: str) -> str:
    """The heading id Python-Markdown's toc gives ``## paralela map``: ``paralela-map``."""
    return re.sub(r"[^\w-]+", "-", path.lower()).strip("-")


# --- one command ---------------------------------------------------------------------


def _section(command: Any, ctx: Any) -> str:
    lines = [f"## {ctx.command_path}", ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines += ["```text", f"{ctx.command_path} {usage}".rstrip(), "```", ""]
    for paragraph in _paragraphs(command.help or ""):
        lines += [_text(paragraph), ""]
    params = visible_params(command, ctx)
    arguments = [p for p in params if is_argument(p)]
    options = [p for p in params if not is_argument(p)]
    if arguments:
        lines += ["**Arguments**", "", "| Argument | Help |", "|---|---|"]
        lines += [_argument_row(p, ctx) for p in arguments]
        lines.append("")
    if options:
        lines += ["**Options**", "", "| Option | Default | Help |", "|---|---|---|"]
        lines += [_option_row(p, ctx) for p in options]
        lines.append("")
    if command.epilog:
        for paragraph in _paragraphs(command.epilog):
            lines += [_text(paragraph), ""]
    return "\n".join(lines)


def _argument_row(param: Any, ctx: Any) -> str:
    name, help_text = _help_record(param, ctx)
    return f"| `{_code(name)}` | {_cell(help_text)} |"


def _option_row(param: Any, ctx: Any) -> str:
    name, help_text = _help_record(param, ctx)
    return f"| `{_code(name)}` | {_cell(default_text(param))} | {_cell(help_text)} |"


def _help_record(param: Any, ctx: Any) -> tuple[str, str]:
    """The two columns ``--help`` prints for ``param``: names with metavar, and help."""
    record = param.get_help_record(ctx)
    if record is None:  # an argument without help (plain Click)
        return param.make_metavar(ctx), ""
    return record[0], record[1]


def default_text(param: Any) -> str:
    """The default as a reader needs it: ``required``, a value, or blank (the help says)."""
    if param.required:
        return "required"
    default: Any = param.default
    if callable(default) or default is None:
        return ""
    if getattr(param, "is_flag", False):
        if param.secondary_opts:  # --x/--no-x
            chosen = param.opts if default else param.secondary_opts
            return _longest(chosen)
        return "on" if default else "off"
    if isinstance(default, enum.Enum):
        default = default.value
    if isinstance(default, (list, tuple)):
        return ", ".join(str(v) for v in default)
    return str(default)


def _longest(names: list[str]) -> str:
    return max(names, key=len)


def _first_sentence(command: Any) -> str:
    text = (command.short_help or command.help or "").split("\n\n")[0]
    match = re.match(r"(.+?\.)(\s|$)", text, flags=re.DOTALL)
    return (match.group(1) if match else text).replace("\n", " ")


# --- Markdown escaping -------------------------------------------------------------------


def _paragraphs(text: str) -> list[str]:
    """Click's paragraphs: blank-line separated; a ``\\b`` paragraph keeps its lines."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        if paragraph.startswith("\b"):
            out.append("  \n".join(line for line in paragraph[1:].strip("\n").splitlines()))
        else:
            out.append(" ".join(paragraph.split()))
    return [p for p in out if p]


_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]|])")


def _text(text: str) -> str:
    """Plain text, shown as written: HTML and Markdown markup characters escaped."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(text, quote=False))


def _cell(text: str) -> str:
    """Text in a table cell: on one line, escaped."""
    return _text(" ".join(text.split()))


def _code(text: str) -> str:
    """Text in a code span in a table (Python-Markdown keeps a pipe there as it is)."""
    return text.replace("`", "'")


# --- as a MkDocs hook ----------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add ``reference/cli.md``, generated from the app, to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=generate()))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="write the page here (default: stdout)")
    args = parser.parse_args(argv)
    page = generate()
    if args.output is None:
        sys.stdout.write(page)
    else:
        args.output.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
