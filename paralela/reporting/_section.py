"""What a report shows of one run: facts, a timeline, tables, images and notes.

Each kind of run has a loader (``_map``, ``_sweep``, ``_launch``, ``_scale``) that reads
its files into a :class:`Section`; ``_charts`` draws its figures and ``_html`` lays the
page out. Loaders do not import matplotlib, so they are cheap to test.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.reporting._timeline import Timeline

__all__ = ["Image", "Part", "Section", "Table", "fmt_seconds", "read_json"]


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass(frozen=True)
class Image:
    """A PNG: drawn for the report (``name`` becomes ``report-<name>.png``) or copied
    from the run directory (``source`` says from where)."""

    name: str
    title: str
    png: bytes
    caption: str = ""
    source: str = ""


@dataclass(frozen=True)
class Part:
    """One share of the lanes' time in the overhead breakdown, and how it is measured."""

    label: str
    how: str


@dataclass
class Section:
    """One run of a report.

    Attributes:
        kind: ``"map"``, ``"sweep"``, ``"launch"`` or ``"scale"``.
        path: the run directory.
        title: the section's heading.
        facts: (name, value) pairs shown at the top.
        timeline: the Gantt chart's data, when the run recorded timings.
        parts: the names and definitions of the four shares of lane time
            (``busy``, ``startup``, ``between``, ``waiting``), worded for this kind.
        tables, images, notes: shown in that order after the timeline.
        data: kind-specific numbers embedded in the page's JSON.
        source: the object the section was read into, for its charts (a scale
            section's ``ScalingResult``); not embedded.
    """

    kind: str
    path: Path
    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    timeline: Timeline | None = None
    parts: dict[str, Part] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    images: list[Image] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    source: Any = None


def read_json(path: Path, what: str) -> Any:
    """The JSON in ``path``.

    Raises:
        ConfigError: the file cannot be read or is not JSON (names the file and what
            wrote it).
    """
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Cannot read {path} ({exc}); it should be the {what}. If the run was "
            "interrupted while writing it, run it again, or move the file away."
        ) from exc


def fmt_seconds(seconds: float | None) -> str:
    """``0.042 s``, ``3.21 s``, ``2 min 05 s``; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 10:
        return f"{seconds:.3g} s" if seconds < 1 else f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
