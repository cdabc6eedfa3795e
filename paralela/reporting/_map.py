"""A map's run store as a report section: its chunks on its workers.

Reads ``summary.json`` (written when the map ends: wall time and every chunk computed
in that call, with where and when it ran) and ``manifest.json`` (the function's name).
The driver's own start time is not recorded; the window ends at the last chunk's end
and starts ``wall_seconds`` before it (or at the first chunk's start, if earlier), so
each worker's start-up shows as the gap before its first chunk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.reporting._section import Part, Section, Table, fmt_seconds, read_json
from paralela.reporting._timeline import Bar, Timeline, mark_stragglers

__all__ = ["STRAGGLER_FACTOR", "load_map"]

STRAGGLER_FACTOR = 2.0  # a chunk is a straggler above twice the median time per item

PARTS = {
    "busy": Part(
        "compute",
        "the chunks' times inside your function: each chunk's end minus its start, "
        "measured in the worker around the calls on its items",
    ),
    "startup": Part(
        "start-up",
        "from the run's start to the worker's first chunk: starting the worker (when the "
        "pool was not running yet), running the initializer, and sending it the function "
        "and its first items",
    ),
    "between": Part(
        "scheduling + serialization",
        "the gaps between one worker's chunks: its results pickled and sent back, the "
        "driver choosing the next chunk, that chunk's items pickled and sent out. The "
        "recorded times cannot tell these apart",
    ),
    "waiting": Part(
        "waiting at the end",
        "from the worker's last chunk to the run's end: nothing left to do while another "
        "worker finishes (load imbalance, stragglers)",
    ),
}


def load_map(path: Path) -> Section:
    """The section of the map run store at ``path``.

    Raises:
        ConfigError: ``summary.json`` is unreadable or lacks the timeline.
    """
    summary = read_json(path / "summary.json", "summary a paralela map writes when it ends")
    if not isinstance(summary, dict) or not isinstance(summary.get("timeline"), list):
        raise ConfigError(
            f"{path / 'summary.json'} has no timeline; it was not written by paralela.map. "
            "Run the map again with this run_dir."
        )
    manifest: dict[str, Any] = {}
    if (path / "manifest.json").is_file():
        loaded = read_json(path / "manifest.json", "manifest of a map's run store")
        manifest = loaded if isinstance(loaded, dict) else {}
    name = manifest.get("function_name", "?")
    section = Section("map", path, f"Map: {name}", parts=dict(PARTS))
    wall = float(summary.get("wall_seconds") or 0.0)
    section.facts = [
        ("function", str(name)),
        (
            "items",
            f"{summary.get('items', 0)} ({summary.get('computed_items', 0)} computed, "
            f"{summary.get('resumed_items', 0)} resumed from the run store)",
        ),
        (
            "chunks",
            f"{summary.get('chunks', 0)} ({summary.get('retries', 0)} retried after "
            f"a worker died, {summary.get('failures', 0)} items failed)",
        ),
        ("wall time", fmt_seconds(wall)),
        ("workers", str(len(summary.get("workers") or []))),
        ("busy", f"{float(summary.get('busy_fraction') or 0.0):.0%} (mean over workers)"),
        ("created", str(manifest.get("created", "?"))),
    ]
    section.data = {"summary": {k: v for k, v in summary.items() if k != "timeline"}}
    chunks = summary["timeline"]
    if not chunks:
        if summary.get("computed_items"):
            section.notes.append(
                "The map did not record its chunks' timings (it ran with "
                "PARALELA_RECORD_TIMINGS=0): there is no timeline to draw. Run it again "
                "without that setting, in a new run directory, to see one."
            )
        else:
            section.notes.append(
                "No chunk was computed in the last call (every item was resumed from the "
                "run store, or the input was empty): there is no timeline to draw."
            )
        return section
    section.timeline = _timeline(chunks, wall)
    straggler_rows = [
        [
            f"{bar.label}",
            bar.lane,
            str(bar.size),
            fmt_seconds(bar.duration),
            f"{bar.duration / bar.size * 1000:.3g} ms",
        ]
        for bar in sorted(
            (b for b in section.timeline.bars if b.state == "straggler"),
            key=lambda b: -b.duration / b.size,
        )[:10]
    ]
    if straggler_rows:
        section.tables.append(
            Table(
                "Straggler chunks (slowest first)",
                ["items", "worker", "n", "time", "per item"],
                straggler_rows,
                f"Chunks that took more than {STRAGGLER_FACTOR:g}x the median time per item.",
            )
        )
    return section


def _timeline(chunks: list[dict[str, Any]], wall: float) -> Timeline:
    hosts: dict[str, str] = {}
    bars = []
    # A worker is named by its pid, which another host may reuse: name it by host too
    # when the chunks ran on several.
    several = len({str(c.get("host", "")) for c in chunks}) > 1
    for c in chunks:
        host = str(c.get("host", ""))
        worker = f"{host}:{c['worker']}" if several else str(c["worker"])
        hosts.setdefault(worker, host)
        index, n = int(c["start"]), int(c["n_items"])
        label = f"{index}" if n == 1 else f"{index}-{index + n - 1}"
        state = "ok" if int(c.get("attempt", 1)) == 1 else "retried"
        bars.append(Bar(worker, float(c["started"]), float(c["finished"]), label, state, n))
    bars, rule = mark_stragglers(bars, lambda b: b.duration / max(1, b.size), STRAGGLER_FACTOR)
    first = min(b.start for b in bars)
    end = max(b.end for b in bars)
    start = min(first, end - wall) if wall > 0 else first
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    note = (
        f"The window starts {when}: the last chunk's end minus the recorded wall time "
        f"({fmt_seconds(wall)}; the driver's clock is not stored), or the first chunk's "
        f"start if that is earlier. Items are named by their input positions; {rule} "
        "time per item."
    )
    return Timeline(
        lanes=sorted(hosts, key=_worker_order),
        bars=bars,
        start=start,
        end=end,
        unit="chunk",
        lane_unit="worker",
        window_note=note,
        lane_notes=hosts,
    )


def _worker_order(worker: str) -> tuple[str, int, str]:
    """By host, then by pid (``pid`` or ``pid:thread``, after ``host:`` when shown)."""
    parts = worker.split(":")
    host = parts[0] if not parts[0].isdigit() else ""
    pid = next((int(p) for p in parts if p.isdigit()), 1 << 62)
    return (host, pid, worker)
