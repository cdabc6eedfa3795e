"""A run as lanes of bars in a time window, and where each lane's time went.

Every kind of run becomes a :class:`Timeline`: a map's chunks on its workers, a sweep's
trials on its slots, a launch's ranks (one bar per attempt). Within the window
``[start, end]`` each lane's time splits into four parts that add up to the window::

    window:   start ───────────────────────────────────────────────────────── end
    lane:     │ before first │██ bar ██│ gap │██ bar ██│ gap │██ bar ██│ after last │
                 start-up       busy     between  busy            busy     waiting

``busy`` is the union of the lane's bars (work inside the user's code); the rest is
overhead, named by where it falls. The timings say *where* a lane waited, not *why*:
a gap between two chunks holds the result's trip back, the scheduler's choice and the
next chunk's trip out together, and no recorded time tells these apart.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Bar", "LaneStats", "Overhead", "Timeline", "mark_stragglers"]


@dataclass(frozen=True)
class Bar:
    """One piece of work on one lane, in epoch seconds."""

    lane: str
    start: float
    end: float
    label: str
    state: str = "ok"  # ok, straggler, failed, pruned, stopped, running
    size: int = 1  # items of a chunk; 1 for a trial or a rank

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class LaneStats:
    """Where one lane's window went, in seconds; the four parts add up to ``window``."""

    lane: str
    bars: int
    items: int
    window: float
    busy: float
    startup: float
    between: float
    waiting: float

    @property
    def busy_fraction(self) -> float:
        return self.busy / self.window if self.window > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy_fraction": self.busy_fraction}


@dataclass(frozen=True)
class Overhead:
    """The parts of every lane's window added up (lane-seconds)."""

    total: float
    busy: float
    startup: float
    between: float
    waiting: float

    def share(self, part: float) -> float:
        return part / self.total if self.total > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class Timeline:
    """Lanes of bars in the window ``[start, end]`` (epoch seconds).

    Attributes:
        lanes: lane names, top to bottom; lanes without bars still count (an idle
            worker is all overhead).
        bars: the work.
        start, end: the window every lane is measured against.
        unit: what a bar is (``"chunk"``, ``"trial"``, ``"attempt"``).
        lane_unit: what a lane is (``"worker"``, ``"slot"``, ``"rank"``).
        window_note: how ``start`` and ``end`` were found.
    """

    lanes: list[str]
    bars: list[Bar]
    start: float
    end: float
    unit: str
    lane_unit: str
    window_note: str
    lane_notes: dict[str, str] = field(default_factory=dict)  # e.g. the host of each lane

    @property
    def window(self) -> float:
        return max(0.0, self.end - self.start)

    def lane_stats(self) -> list[LaneStats]:
        """Per lane: busy time and the three kinds of waiting, in lane order."""
        by_lane: dict[str, list[Bar]] = {lane: [] for lane in self.lanes}
        for bar in self.bars:
            by_lane.setdefault(bar.lane, []).append(bar)
        return [self._stats(lane, bars) for lane, bars in by_lane.items()]

    def _stats(self, lane: str, bars: list[Bar]) -> LaneStats:
        window = self.window
        spans = _union(
            (max(b.start, self.start), min(b.end, self.end))
            for b in bars
            if b.end > self.start and b.start < self.end
        )
        busy = sum(e - s for s, e in spans)
        if not spans:
            return LaneStats(lane, len(bars), 0, window, 0.0, window, 0.0, 0.0)
        startup = spans[0][0] - self.start
        waiting = self.end - spans[-1][1]
        between = max(0.0, window - busy - startup - waiting)
        items = sum(b.size for b in bars)
        return LaneStats(lane, len(bars), items, window, busy, startup, between, waiting)

    def overhead(self) -> Overhead:
        stats = self.lane_stats()
        return Overhead(
            total=sum(s.window for s in stats),
            busy=sum(s.busy for s in stats),
            startup=sum(s.startup for s in stats),
            between=sum(s.between for s in stats),
            waiting=sum(s.waiting for s in stats),
        )

    def to_dict(self) -> dict[str, Any]:
        """The numbers a report embeds: window, lanes, every bar, per-lane stats."""
        return {
            "start": self.start,
            "end": self.end,
            "window": self.window,
            "unit": self.unit,
            "lane_unit": self.lane_unit,
            "window_note": self.window_note,
            "lanes": list(self.lanes),
            "lane_notes": dict(self.lane_notes),
            "bars": [asdict(b) for b in self.bars],
            "lane_stats": [s.to_dict() for s in self.lane_stats()],
            "overhead": self.overhead().to_dict(),
        }


def _union(spans: Any) -> list[tuple[float, float]]:
    """Sorted, merged intervals (bars of one lane may touch or, for threads, overlap)."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def mark_stragglers(
    bars: list[Bar], cost: Any, factor: float, minimum: int = 4
) -> tuple[list[Bar], str]:
    """Bars whose ``cost(bar)`` exceeds ``factor`` times the median become stragglers.

    Only bars in state ``ok`` are judged and changed, and only when at least
    ``minimum`` of them exist (a median of two says little). Returns the bars and the
    rule, in words, for the page.
    """
    judged = [b for b in bars if b.state == "ok"]
    if len(judged) < minimum:
        return bars, f"stragglers: not judged (fewer than {minimum} finished pieces of work)"
    median = statistics.median(cost(b) for b in judged)
    limit = factor * median
    out = [
        Bar(b.lane, b.start, b.end, b.label, "straggler", b.size)
        if b.state == "ok" and median > 0 and cost(b) > limit
        else b
        for b in bars
    ]
    return out, f"stragglers: more than {factor:g}x the median"
