"""Griffe extension for the API reference: Sphinx roles in docstrings become links.

paralela's docstrings name other objects the Sphinx way (``:func:`paralela.imap```,
``:class:`~paralela.backends.Slot```), which Markdown would show as written. This
extension (``extensions:`` of mkdocstrings in ``mkdocs.yml``) turns each into an
*optional* cross-reference: a link where the reference documents the object, plain code
where it does not (a private helper), never a broken link. ``~`` shows the last name
only, as in Sphinx.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|exc|data|obj):`(~?)([^`]+?)`")


def _link(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if tilde else target
    code = f"<code>{html.escape(shown)}</code>"
    if not re.fullmatch(r"[\w.]+", target):  # not an identifier: show it as code only
        return code
    return f'<autoref identifier="{target}" optional>{code}</autoref>'


def convert(text: str) -> str:
    """``text`` with every Sphinx role replaced by an optional cross-reference."""
    return _ROLE.sub(_link, text)


class SphinxRoles(griffe.Extension):
    """Rewrites each object's docstring as it is loaded."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ":`" in obj.docstring.value:
            obj.docstring.value = convert(obj.docstring.value)
