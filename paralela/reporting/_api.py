"""``write_report``: find the runs, read them, draw their charts, write one HTML page.

::

    RUN_DIR ── find_runs ──> [map | sweep | compare | launch | scale] ── load_* ──> Section each
                                                                                       │
    report-<run>-timeline.png, -breakdown.png, -scaling.png, -scores.png <── _charts ──┤
    report.html (inline CSS, the PNGs as data: URLs, the numbers as JSON) <────────────┘
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paralela._files import atomic_write
from paralela.errors import ConfigError
from paralela.reporting._compare import load_compare
from paralela.reporting._find import FoundRun, find_runs
from paralela.reporting._launch import load_launch
from paralela.reporting._map import load_map
from paralela.reporting._pipeline import load_pipeline
from paralela.reporting._scale import load_scale
from paralela.reporting._section import Image, Section
from paralela.reporting._sweep import load_sweep

__all__ = ["REPORT_FILE", "RunReport", "write_report"]

REPORT_FILE = "report.html"
LOADERS: dict[str, Callable[[Path], Section]] = {
    "map": load_map,
    "sweep": load_sweep,
    "compare": load_compare,
    "launch": load_launch,
    "scale": load_scale,
    "pipeline": load_pipeline,
}
NO_MATPLOTLIB = (
    "Charts not drawn: they need matplotlib, which is not installed "
    "(pip install 'paralela[sweep]'). The page's tables have the same numbers."
)


@dataclass(frozen=True)
class RunReport:
    """What :func:`write_report` wrote.

    Attributes:
        path: the HTML page (absolute).
        images: the PNG charts written next to it (``report-*.png``).
        runs: the runs it covers, one section each.
        problems: what it could not draw, and why (also shown on the page).
    """

    path: Path
    images: list[Path]
    runs: list[FoundRun]
    problems: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The page as a ``file://`` URL, to click in a terminal or paste in a browser."""
        return self.path.as_uri()


def write_report(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> RunReport:
    """Write the HTML report of a run directory, or of every run below a directory.

    The page is self-contained: styles inline, charts embedded as PNG ``data:`` URLs,
    nothing loaded from anywhere, so it opens from disk, in a mail or on a machine
    without network. The charts are also written next to it as ``report-*.png``.

    Args:
        run_dir: a map's ``run_dir`` (``summary.json``), a sweep's run directory
            (``trials.json``), a comparison's (``compare.json``), a launch's log
            directory (``launch.json``), a ``paralela scale`` directory
            (``scaling.json``), or a directory with several of these below it
            (``paralela demo`` writes one), which gives a section per run.
        out: the HTML file to write; a directory means ``report.html`` in it. Default:
            ``report.html`` in ``run_dir``.

    Returns:
        The page's path, the PNGs and what could not be drawn. Without matplotlib the
        page has tables but no charts, and :attr:`RunReport.problems` says so.

    Raises:
        ConfigError: ``run_dir`` does not exist, is not a run directory and holds none,
            a run's record is unreadable, or ``out`` cannot be written.
    """
    root = Path(run_dir).resolve() if Path(run_dir).exists() else Path(run_dir)
    runs = find_runs(root)
    sections = [_load(run) for run in runs]
    page = _out_path(root, out)
    figures, problems = _draw(sections, _slugs(root, runs))
    from paralela.reporting._html import render_page

    written: list[Path] = []
    names: dict[int, str] = {}
    try:
        page.parent.mkdir(parents=True, exist_ok=True)
        for image in (i for figs in figures for i in figs):
            file = page.parent / f"report-{image.name}.png"
            atomic_write(file, image.png)
            written.append(file)
            names[id(image)] = file.name
        atomic_write(page, render_page(root, sections, figures, names, problems).encode("utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"Cannot write the report to {page.parent}: {exc.strerror or exc}. Pass "
            "--out (out=) with a file in a directory you can write to."
        ) from exc
    return RunReport(page, written, runs, problems)


def _load(run: FoundRun) -> Section:
    try:
        return LOADERS[run.kind](run.path)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ConfigError(
            f"The {run.kind} record in {run.path} is incomplete or malformed "
            f"({type(exc).__name__}: {exc}). Was it written by another version of "
            "paralela, or edited? Run it again, or report the run directories you "
            "want, one by one."
        ) from exc


def _out_path(root: Path, out: str | os.PathLike[str] | None) -> Path:
    if out is None:
        return root / REPORT_FILE
    page = Path(out).absolute()
    if page.is_dir() or str(out).endswith(os.sep):
        page = page / REPORT_FILE
    if page.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(
            f"The report is an HTML page; give --out a file ending in .html, not {out}."
        )
    return page


def _slugs(root: Path, runs: list[FoundRun]) -> list[str]:
    """A file-name part per run: its kind alone, or its path below the collection."""
    if len(runs) == 1:
        return [runs[0].kind]
    slugs: list[str] = []
    for run in runs:
        rel = run.path.relative_to(root).as_posix() if run.path != root else run.kind
        slug = re.sub(r"[^A-Za-z0-9_.]+", "-", rel).strip("-.") or run.kind
        while slug in slugs:
            slug += "-2"
        slugs.append(slug)
    return slugs


def _draw(sections: list[Section], slugs: list[str]) -> tuple[list[list[Image]], list[str]]:
    try:
        from paralela.reporting import _charts

        _charts.load_matplotlib()
    except ImportError:
        return [[] for _ in sections], [NO_MATPLOTLIB]
    figures: list[list[Image]] = []
    for section, slug in zip(sections, slugs, strict=True):
        drawn = []
        if section.kind == "scale" and section.source is not None:
            drawn.append(
                Image(
                    f"{slug}-scaling",
                    "Speed-up and efficiency",
                    _charts.scaling_png(section.source),
                    "Measured speed-ups (the range of the repetitions as error bars), the "
                    "ideal line, and the fitted law with its confidence band, extended to "
                    "the predicted counts. Both axes are logarithmic.",
                )
            )
        if section.kind == "compare":
            from paralela.reporting._compare import scores_png

            drawn.append(
                Image(
                    f"{slug}-scores",
                    "Score distribution per family",
                    scores_png(section),
                    "Each family's candidates by mean score over the folds: the box spans "
                    "the middle half, a dot is a candidate (hollow: stopped before its "
                    "last fold), the star the family's best (orange: the best overall).",
                )
            )
        tl = section.timeline
        if tl is not None:
            drawn.append(
                Image(
                    f"{slug}-timeline",
                    f"Timeline of {section.title}",
                    _charts.gantt_png(tl, f"{tl.unit.capitalize()}s per {tl.lane_unit}"),
                    f"One row per {tl.lane_unit}, one bar per {tl.unit}; blank space is "
                    f"idle time; the dashed line is the end of the run.",
                )
            )
            drawn.append(
                Image(
                    f"{slug}-breakdown",
                    f"Time breakdown of {section.title}",
                    _charts.breakdown_png(
                        tl, section.parts, f"Where each {tl.lane_unit}'s time went"
                    ),
                    f"Each {tl.lane_unit}'s share of the window, and all of them together "
                    "('all'); the table says how each part is computed.",
                )
            )
        figures.append(drawn)
    return figures, []
