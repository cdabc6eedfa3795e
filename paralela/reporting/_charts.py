"""The report's figures, drawn with matplotlib's Agg canvas into PNG bytes.

No pyplot: each figure is a bare :class:`matplotlib.figure.Figure` on its own Agg
canvas, so drawing a report neither needs a display nor changes the backend or the
open figures of a program that calls it.
"""

from __future__ import annotations

import io
from typing import Any

from paralela.reporting._section import Part
from paralela.reporting._timeline import Timeline

__all__ = ["COLORS", "PART_COLORS", "breakdown_png", "gantt_png", "load_matplotlib"]

DPI = 100
WIDTH_IN = 9.0  # inches: 900 px at DPI, plus the legend: about the page's width
LABEL_BARS_UP_TO = 40  # label bars with their items / trial number when there are few

COLORS = {
    "ok": "#4c72b0",
    "straggler": "#dd8452",
    "failed": "#c44e52",
    "stopped": "#8172b3",
    "pruned": "#a5a5a5",
    "running": "#ccb974",
    "retried": "#55a868",
}
STATE_NAMES = {
    "ok": "work",
    "straggler": "straggler",
    "failed": "failed",
    "stopped": "stopped by the launcher",
    "pruned": "pruned",
    "running": "still running",
    "retried": "retried after a worker died",
}
PART_COLORS = {
    "busy": "#4c72b0",
    "startup": "#c9c9c9",
    "between": "#f0b37e",
    "waiting": "#e8e8e8",
}


def load_matplotlib() -> Any:
    """``matplotlib.figure.Figure`` bound to an Agg canvas, or raise ImportError."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def new(height: float) -> Any:
        fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
        FigureCanvasAgg(fig)
        return fig

    return new


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _lane_labels(tl: Timeline) -> list[str]:
    hosts = {h for h in tl.lane_notes.values() if h}
    if len(hosts) > 1:  # several hosts: say which lane is where
        return [f"{lane} ({tl.lane_notes.get(lane, '?')})" for lane in tl.lanes]
    return list(tl.lanes)


def _height(lanes: int) -> float:
    return min(24.0, max(2.2, 0.32 * lanes + 1.4))


def gantt_png(tl: Timeline, title: str) -> bytes:
    """The timeline: a row per lane, a bar per piece of work, coloured by state."""
    from matplotlib.patches import Patch

    fig = load_matplotlib()(_height(len(tl.lanes)))
    ax = fig.add_subplot()
    row = {lane: i for i, lane in enumerate(tl.lanes)}
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for bar in tl.bars:
        groups.setdefault((bar.lane, bar.state), []).append((bar.start - tl.start, bar.duration))
    edge = 0.6 if len(tl.bars) <= 400 else 0.0  # chunk borders; a blur when there are many
    ax.axvspan(0, tl.window, color="#f7f7f7", zorder=0)
    for (lane, state), spans in groups.items():
        ax.broken_barh(
            spans,
            (row[lane] - 0.38, 0.76),
            facecolors=COLORS.get(state, COLORS["ok"]),
            edgecolor="white",
            linewidth=edge,
            zorder=2,
        )
    if len(tl.bars) <= LABEL_BARS_UP_TO:
        for bar in tl.bars:
            if tl.window > 0 and bar.duration > 0.06 * tl.window:
                ax.text(
                    bar.start - tl.start + bar.duration / 2,
                    row[bar.lane],
                    bar.label,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                    clip_on=True,
                    zorder=3,
                )
    ax.axvline(tl.window, color="#555555", linestyle="--", linewidth=0.8, zorder=1)
    ax.set_ylim(len(tl.lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(tl.lanes)))
    ax.set_yticklabels(_lane_labels(tl), fontsize=8 if len(tl.lanes) <= 32 else 6)
    ax.set_xlim(0, max(tl.window, 1e-9) * 1.01)
    ax.set_xlabel("seconds from the start of the run")
    ax.set_ylabel(tl.lane_unit)
    ax.set_title(title, fontsize=11, loc="left")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6, zorder=1)
    ax.set_axisbelow(True)
    present = [s for s in COLORS if any(b.state == s for b in tl.bars)]
    handles = [Patch(color=COLORS[s], label=STATE_NAMES[s]) for s in present]
    handles.append(Patch(facecolor="#f7f7f7", edgecolor="#999999", label="idle"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def breakdown_png(tl: Timeline, parts: dict[str, Part], title: str) -> bytes:
    """Each lane's window split into its four parts (percent), and all lanes together."""
    from matplotlib.patches import Patch

    stats = tl.lane_stats()
    total = tl.overhead()
    names = ["all", *_lane_labels(tl)]
    rows = [
        {k: total.share(getattr(total, k)) for k in PART_COLORS},
        *(
            {k: (getattr(s, k) / s.window if s.window > 0 else 0.0) for k in PART_COLORS}
            for s in stats
        ),
    ]
    fig = load_matplotlib()(_height(len(names)))
    ax = fig.add_subplot()
    for i, shares in enumerate(rows):
        left = 0.0
        for key, color in PART_COLORS.items():
            width = 100 * shares[key]
            ax.barh(i, width, left=left, color=color, height=0.7, edgecolor="white", linewidth=0.5)
            if key == "busy" and width >= 8:
                ax.text(
                    left + width / 2,
                    i,
                    f"{width:.0f}%",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )
            left += width
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8 if len(names) <= 32 else 6)
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"percent of each {tl.lane_unit}'s time in the run's window")
    ax.set_title(title, fontsize=11, loc="left")
    handles = [
        Patch(color=c, label=parts[k].label if k in parts else k) for k, c in PART_COLORS.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def scaling_png(result: Any) -> bytes:
    """Speed-up against workers (log-log): measured, ideal, and the fitted law with its
    band, extended to the largest predicted count; efficiency below."""
    fig = load_matplotlib()(6.4)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    points = result.points
    b = result.baseline_workers
    counts = [p.workers for p in points]
    speedups = [p.speedup for p in points]
    base = points[0].median if points else 0.0
    # the spread of the repetitions, as speed-ups against the baseline's median
    low = [p.speedup - base / max(p.times) if max(p.times) > 0 else 0.0 for p in points]
    high = [base / min(p.times) - p.speedup if min(p.times) > 0 else 0.0 for p in points]
    if result.mode == "weak":
        low = high = [0.0] * len(points)  # scaled speed-ups: no per-repetition spread here
    top.errorbar(
        counts,
        speedups,
        yerr=[low, high],
        fmt="o",
        color=COLORS["ok"],
        capsize=3,
        label="measured (median, range of repetitions)",
        zorder=3,
    )
    largest = max([*counts, *(p.workers for p in result.predictions)] or [1])
    grid = _geometric(min(counts or [1]), largest)
    top.plot(grid, [n / b for n in grid], color="#999999", linestyle=":", label="ideal")
    fit = result.fit
    if fit is not None:
        law = "Amdahl" if fit.model == "amdahl" else "Gustafson"
        top.plot(
            grid,
            [fit.speedup(n) for n in grid],
            color=COLORS["straggler"],
            label=f"{law} fit, s = {fit.serial_fraction:.3g}",
        )
        if fit.ci_low is not None and fit.ci_high is not None:
            band = [fit.band(n) for n in grid]
            top.fill_between(
                grid,
                [lo for lo, _ in band],
                [hi for _, hi in band],
                color=COLORS["straggler"],
                alpha=0.18,
                label=f"{fit.confidence:.0%} interval of s",
            )
        if fit.model == "amdahl" and fit.max_speedup is not None:
            top.axhline(
                fit.max_speedup,
                color=COLORS["failed"],
                linewidth=0.8,
                linestyle="--",
                label=f"ceiling {fit.max_speedup:.1f}x",
            )
    over = [p for p in points if p.oversubscribed]
    if over:
        top.scatter(
            [p.workers for p in over],
            [p.speedup for p in over],
            s=90,
            facecolors="none",
            edgecolors=COLORS["failed"],
            label="more workers than CPUs",
            zorder=4,
        )
    # The ideal line would set the scale up to the largest predicted count; keep the
    # measured points and the fitted curve readable instead.
    shown = [*speedups, *((fit.speedup(n) for n in grid) if fit is not None else ())]
    if fit is not None and fit.max_speedup is not None:
        shown.append(fit.max_speedup)
    top.set_xscale("log", base=2)
    top.set_yscale("log", base=2)
    if shown:
        top.set_ylim(min([*shown, 1.0]) / 1.3, max(shown) * 1.6)
    top.set_ylabel("scaled speed-up" if result.mode == "weak" else "speed-up")
    top.set_title(f"Scaling: {result.target}", fontsize=11, loc="left")
    top.grid(color="#dddddd", linewidth=0.6)
    top.legend(fontsize=7, loc="upper left")
    bottom.plot(counts, [100 * p.efficiency for p in points], "o-", color=COLORS["ok"])
    bottom.set_ylabel("efficiency %")
    bottom.set_xlabel("workers")
    bottom.set_ylim(0, max(110, *(100 * p.efficiency + 10 for p in points)))
    bottom.grid(color="#dddddd", linewidth=0.6)
    from matplotlib.ticker import FuncFormatter

    for ax in (top, bottom):
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    return _png(fig)


def _geometric(lo: float, hi: float, steps: int = 60) -> list[float]:
    lo = max(lo, 1e-9)
    hi = max(hi, lo * 1.0001)
    ratio = (hi / lo) ** (1 / (steps - 1))
    return [lo * ratio**i for i in range(steps)]
