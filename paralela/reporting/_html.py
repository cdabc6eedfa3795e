"""One self-contained HTML page: inline CSS, images as data: URLs, the numbers as JSON.

The page loads nothing: its Content-Security-Policy allows only inline styles, ``data:``
images and, by its SHA-256 hash, the page's own inline script, so a browser refuses (and
reports) anything else. That short script checks on load that every image decoded and
that the embedded JSON parses, and records the outcome on ``<body
data-report-status="ok">`` (with each image's decoded size in ``data-image-sizes``),
which the browser tests read back.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import time
from pathlib import Path
from typing import Any

from paralela._version import __version__
from paralela.reporting._charts import PART_COLORS
from paralela.reporting._section import Image, Section, Table, fmt_seconds

__all__ = ["DATA_ID", "render_page"]

DATA_ID = "paralela-report-data"
_SCRIPT_ESCAPES = (
    ("&", "\\u0026"),
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)
LANE_TABLE_OPEN_UP_TO = 16  # longer per-lane tables start folded

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#222;background:#fff;line-height:1.45}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px} h2{font-size:1.3em;margin:0 0 4px}
h3{font-size:1.05em;margin:22px 0 8px}
.meta,.path,figcaption,.note{color:#666;font-size:.88em}
.run{border-top:3px solid #4c72b0;margin-top:28px;padding-top:14px}
nav ul{padding-left:20px;margin:6px 0}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:10px 0}
dl.facts dt{color:#555} dl.facts dd{margin:0;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;margin:6px 0 4px;font-size:.88em}
th,td{border-bottom:1px solid #e3e3e3;padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f4f6fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:8px 0 14px} img{max-width:100%;height:auto;border:1px solid #eee}
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:6px;vertical-align:-1px}
.notes li{color:#7a4b00}
.plots{display:flex;flex-wrap:wrap;gap:12px}
.plots figure{flex:1 1 480px;max-width:540px;margin:0}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}
"""

CHECK_SCRIPT = """
window.addEventListener("load", function () {
  var body = document.body, status = "ok", broken = [], sizes = [];
  Array.prototype.forEach.call(document.images, function (img) {
    if (!(img.complete && img.naturalWidth > 0)) { broken.push(img.alt || img.src.slice(0, 40)); }
    sizes.push(img.naturalWidth + "x" + img.naturalHeight);
  });
  if (broken.length) { status = "broken-images"; }
  try { JSON.parse(document.getElementById("__DATA_ID__").textContent); }
  catch (e) { status = "bad-data"; }
  body.setAttribute("data-images", String(document.images.length));
  body.setAttribute("data-broken-images", broken.join("|"));
  body.setAttribute("data-image-sizes", sizes.join(" "));
  body.setAttribute("data-report-status", status);
});
""".replace("__DATA_ID__", DATA_ID)
# Nothing but what the page holds: a browser refuses (and logs) any other load, and runs
# no inline script but the check above, allowed by its hash rather than 'unsafe-inline'.
_CHECK_HASH = base64.b64encode(hashlib.sha256(CHECK_SCRIPT.encode()).digest()).decode()
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{_CHECK_HASH}'"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _img(image: Image, figure_names: dict[int, str], title: bool = False) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    caption = f"<b>{_e(image.title)}</b> " if title else ""
    caption += _e(image.caption)
    if image.source:
        caption += f" <span class='path'>(from {_e(image.source)})</span>"
    elif id(image) in figure_names:
        caption += f" <span class='path'>({_e(figure_names[id(image)])})</span>"
    return (
        f"<figure><img alt='{_e(image.title)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _table(table: Table) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in table.rows
    )
    note = f"<p class='note'>{_e(table.note)}</p>" if table.note else ""
    return f"<h3>{_e(table.title)}</h3><table><tr>{head}</tr>{body}</table>{note}"


def _breakdown(section: Section) -> str:
    tl = section.timeline
    assert tl is not None
    total = tl.overhead()
    rows = []
    for key, color in PART_COLORS.items():
        part = section.parts.get(key)
        if part is None:
            continue
        seconds = getattr(total, key)
        rows.append(
            f"<tr><td><span class='swatch' style='background:{color}'></span>"
            f"{_e(part.label)}</td><td class='num'>{seconds:.3f}</td>"
            f"<td class='num'>{total.share(seconds):.1%}</td><td>{_e(part.how)}.</td></tr>"
        )
    lanes = len(tl.lanes)
    return (
        "<table class='parts'><tr><th>part</th><th>"
        f"{_e(tl.lane_unit)}-seconds</th><th>share</th><th>how it is computed</th></tr>"
        + "".join(rows)
        + f"<tr><td><b>total</b></td><td class='num'><b>{total.total:.3f}</b></td>"
        f"<td class='num'>100%</td><td>{lanes} {_e(tl.lane_unit)}(s) x the window "
        f"({fmt_seconds(tl.window)}).</td></tr></table>"
    )


def _lane_table(section: Section) -> str:
    tl = section.timeline
    assert tl is not None
    stats = tl.lane_stats()
    unit = tl.lane_unit
    head = [unit, "host", f"{tl.unit}s", "busy", "busy s", "start-up s", "between s", "end wait s"]
    rows = "".join(
        "<tr>"
        f"<td>{_e(s.lane)}</td><td>{_e(tl.lane_notes.get(s.lane, ''))}</td>"
        f"<td class='num'>{s.bars}</td><td class='num'>{s.busy_fraction:.1%}</td>"
        f"<td class='num'>{s.busy:.3f}</td><td class='num'>{s.startup:.3f}</td>"
        f"<td class='num'>{s.between:.3f}</td><td class='num'>{s.waiting:.3f}</td></tr>"
        for s in stats
    )
    opened = " open" if len(stats) <= LANE_TABLE_OPEN_UP_TO else ""
    return (
        f"<details{opened}><summary>Busy fraction per {_e(unit)} ({len(stats)})</summary>"
        "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr>{rows}</table>"
        "</details>"
    )


def _section(section: Section, anchor: str, figures: list[Image], names: dict[int, str]) -> str:
    out = [
        f"<section class='run' id='{anchor}' data-kind='{section.kind}'>",
        f"<h2>{_e(section.title)}</h2><p class='path'>{_e(section.path)}</p>",
        "<dl class='facts'>"
        + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in section.facts)
        + "</dl>",
    ]
    charts = {f.name.rsplit("-", 1)[-1]: f for f in figures}
    if section.timeline is not None:
        tl = section.timeline
        out.append(f"<h3>Timeline: {_e(tl.unit)}s per {_e(tl.lane_unit)}</h3>")
        if "timeline" in charts:
            out.append(_img(charts.pop("timeline"), names))
        out.append(f"<p class='note'>{_e(tl.window_note)}</p>")
        out.append("<h3>Where the time went</h3>")
        if "breakdown" in charts:
            out.append(_img(charts.pop("breakdown"), names))
        out.append(_breakdown(section))
        out.append(_lane_table(section))
    for figure in charts.values():
        out.append(f"<h3>{_e(figure.title)}</h3>" + _img(figure, names))
    out.extend(_table(t) for t in section.tables)
    if section.images:
        out.append("<h3>Plots</h3><div class='plots'>")
        out.extend(_img(i, names, title=True) for i in section.images)
        out.append("</div>")
    if section.notes:
        out.append(
            "<h3>Notes</h3><ul class='notes'>"
            + "".join(f"<li>{_e(n)}</li>" for n in section.notes)
            + "</ul>"
        )
    out.append("</section>")
    return "\n".join(out)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``null``: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def render_page(
    root: Path,
    sections: list[Section],
    figures: list[list[Image]],
    figure_files: dict[int, str],
    problems: list[str],
) -> str:
    """The whole page; ``figures[i]`` are the charts drawn for ``sections[i]``."""
    anchors = [f"run-{i + 1}-{s.kind}" for i, s in enumerate(sections)]
    data: dict[str, Any] = {
        "format": 1,
        "paralela": __version__,
        "root": str(root),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sections": [
            {
                "kind": s.kind,
                "path": str(s.path),
                "title": s.title,
                "anchor": anchor,
                "facts": dict(s.facts),
                "timeline": None if s.timeline is None else s.timeline.to_dict(),
                "data": s.data,
                "figures": [figure_files.get(id(f), f.name) for f in figs],
                "images": [i.source for i in s.images],
            }
            for s, anchor, figs in zip(sections, anchors, figures, strict=True)
        ],
    }
    # "</script>" or "<!--" inside the JSON would end or derail the script element:
    # escape every character HTML could read as markup (JSON.parse decodes them back).
    payload = json.dumps(_finite(data), default=str, allow_nan=False)
    for char, escaped in _SCRIPT_ESCAPES:
        payload = payload.replace(char, escaped)
    nav = ""
    if len(sections) > 1:
        nav = (
            "<nav><b>Runs</b><ul>"
            + "".join(
                f"<li><a href='#{a}'>{_e(s.title)}</a> <span class='path'>{_e(s.path)}</span></li>"
                for s, a in zip(sections, anchors, strict=True)
            )
            + "</ul></nav>"
        )
    warn = ""
    if problems:
        warn = "<ul class='notes'>" + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul>"
    meta = (
        f"{_e(root)} &middot; {len(sections)} run(s) &middot; written "
        f"{_e(data['generated'])} by paralela {_e(__version__)}"
    )
    body = "\n".join(
        _section(s, a, figs, figure_files)
        for s, a, figs in zip(sections, anchors, figures, strict=True)
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>paralela report: {_e(root.name or root)}</title>
<style>{CSS}</style>
</head><body>
<main>
<h1>paralela report</h1>
<p class="meta">{meta}</p>
{warn}{nav}
{body}
</main>
<script type="application/json" id="{DATA_ID}">{payload}</script>
<script>{CHECK_SCRIPT}</script>
</body></html>
"""
