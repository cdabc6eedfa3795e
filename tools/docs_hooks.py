"""MkDocs hook: links from docs/ to the repository's other files (examples, benchmarks).

The guide pages link to ``../examples/train_ps.py`` or ``../bench/results/stage.md``:
right on GitHub, and in a checkout, but outside ``docs_dir``, so MkDocs cannot follow
them (``--strict`` fails on them). This hook copies every such file into the site
under ``repo/`` (a Python script as a file, a Markdown page as a page) and points the
link there, so the site is whole on its own. A link to a file that does not exist is
left as it is, and ``mkdocs build --strict`` fails on it as on any broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

PREFIX = "repo"

# [text](target) and [text](target#anchor); not images' data URLs, not absolute URLs.
_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _outside_targets(page_src: str, docs_dir: Path, root: Path, markdown: str) -> dict[str, str]:
    """{link as written: the repository path it names} for links that leave docs_dir."""
    found = {}
    page_dir = (docs_dir / page_src).parent
    for match in _LINK.finditer(markdown):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        resolved = (page_dir / target).resolve()
        if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(root):
            continue
        if resolved.is_file():
            found[target] = resolved.relative_to(root).as_posix()
    return found


def on_files(files: Any, config: Any) -> Any:
    """Add every repository file a page links to, under ``repo/``."""
    from mkdocs.structure.files import File, InclusionLevel

    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    wanted: set[str] = set()
    for file in files.documentation_pages():
        if file.abs_src_path is None:
            continue
        markdown = Path(file.abs_src_path).read_text(encoding="utf-8")
        wanted.update(_outside_targets(file.src_uri, docs_dir, root, markdown).values())
    for path in sorted(wanted):
        copy = File.generated(
            config,
            f"{PREFIX}/{path}",
            abs_src_path=str(root / path),
            inclusion=InclusionLevel.NOT_IN_NAV,  # reached by its links, not the nav
        )
        files.append(copy)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the links that leave docs_dir at the copies ``on_files`` added; fill in
    the API index's table of top-level names."""
    if page.file.src_uri == API_INDEX:
        markdown = _fill_api_index(markdown)
    if page.file.abs_src_path is None:
        return markdown
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    targets = _outside_targets(page.file.src_uri, docs_dir, root, markdown)
    if not targets:
        return markdown
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        path = targets.get(match.group(2))
        if path is None:
            return match.group(0)
        new = posixpath.relpath(f"{PREFIX}/{path}", page_dir or ".")
        return f"{match.group(1)}{new}{match.group(3)}"

    return _LINK.sub(rewrite, markdown)


# --- the API reference's index: every top-level name, linked to where it is documented ---

API_INDEX = "reference/api/index.md"
NAMES_MARKER = "<!-- paralela-top-level-names -->"


def top_level_table() -> str:
    """A table of ``paralela.__all__``, each name cross-referenced to its package's page.

    The links are mkdocstrings cross-references (``[name][paralela.mapping.map]``):
    a name that no reference page documents fails ``mkdocs build --strict``.
    """
    import paralela

    lazy: dict[str, str] = vars(paralela)["_LAZY"]
    rows = ["| Name | Where it lives |", "|---|---|"]
    for name in paralela.__all__:
        module = lazy.get(name)
        if module is None:  # __version__
            continue
        # a private module's names are documented under paralela itself (config.md)
        target = f"paralela.{name}" if "._" in module else f"{module}.{name}"
        shown = "paralela" if "._" in module else module
        rows.append(f"| [`paralela.{name}`][{target}] | `{shown}` |")
    return "\n".join(rows)


def _fill_api_index(markdown: str) -> str:
    return markdown.replace(NAMES_MARKER, top_level_table())
