"""MkDocs hook: links from docs/ to the repository's other files (examples, benchmarks).

The guide pages link to ``../examples/train_ps.py`` or ``../bench/results/stage.md``:
right on GitHub, and in a checkout, but outside ``docs_dir``, so MkDocs cannot follow
them (``--strict`` fails on them). This hook copies every such file into the site
under ``repo/`` (a Python script as a file, a Markdown page as a page) and points the
link there, so the site is whole on its own. A copied page's own links are followed
the same way (``examples/README.md`` links every example and lesson page). A link to a
file that does not exist is left as it is, and ``mkdocs build --strict`` fails on it as
on any broken link.

It also fills in the API index's table of ``paralela.__all__`` (``top_level_table``).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

PREFIX = "repo"

# [text](target) and [text](target#anchor); not images' data URLs, not absolute URLs.
_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _resolve(source: Path, markdown: str, docs_dir: Path, root: Path) -> dict[str, str]:
    """{link as written: where it points in the site} for the links of the page whose
    original file is ``source`` that need help: into docs/ from a copied page (a
    docs-relative path), or out of docs/ to an existing repository file (``repo/...``)."""
    found = {}
    for match in _LINK.finditer(markdown):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        resolved = (source.parent / target).resolve()
        if not resolved.is_relative_to(root):
            continue
        if resolved.is_relative_to(docs_dir):
            if not source.is_relative_to(docs_dir):  # a copied page linking back into docs/
                found[target] = resolved.relative_to(docs_dir).as_posix()
        elif resolved.is_file():
            found[target] = f"{PREFIX}/{resolved.relative_to(root).as_posix()}"
    return found


def _paths(config: Any) -> tuple[Path, Path]:
    docs_dir = Path(config["docs_dir"]).resolve()
    return docs_dir, Path(config["config_file_path"]).resolve().parent


def on_files(files: Any, config: Any) -> Any:
    """Add every repository file a page links to, under ``repo/``; a copied Markdown
    page's own links are followed too."""
    from mkdocs.structure.files import File, InclusionLevel

    docs_dir, root = _paths(config)
    queue = [Path(f.abs_src_path) for f in files.documentation_pages() if f.abs_src_path]
    added: set[str] = set()
    while queue:
        source = queue.pop()
        markdown = source.read_text(encoding="utf-8")
        for uri in _resolve(source, markdown, docs_dir, root).values():
            if not uri.startswith(f"{PREFIX}/") or uri in added:
                continue
            added.add(uri)
            path = root / uri.removeprefix(f"{PREFIX}/")
            copy = File.generated(
                config,
                uri,
                abs_src_path=str(path),
                inclusion=InclusionLevel.NOT_IN_NAV,  # reached by its links, not the nav
            )
            files.append(copy)
            if path.suffix == ".md":
                queue.append(path)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the links ``_resolve`` finds at their place in the site; fill in the API
    index's table of top-level names."""
    if page.file.src_uri == API_INDEX:
        markdown = _fill_api_index(markdown)
    if page.file.abs_src_path is None:
        return markdown
    docs_dir, root = _paths(config)
    targets = _resolve(Path(page.file.abs_src_path), markdown, docs_dir, root)
    if not targets:
        return markdown
    page_dir = posixpath.dirname(page.file.src_uri) or "."

    def rewrite(match: re.Match[str]) -> str:
        uri = targets.get(match.group(2))
        if uri is None:
            return match.group(0)
        return f"{match.group(1)}{posixpath.relpath(uri, page_dir)}{match.group(3)}"

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
