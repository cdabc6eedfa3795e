"""A sweep's run directory as a report section: trials on slots, leaderboard, plots.

Reads ``trials.json`` (every trial of the study, with this run's slots and times) and
embeds the optimisation plots the sweep drew in ``plots/``. The timeline shows the trials
of the last run (those with a slot); a study continued over several runs lists earlier
trials in the leaderboard only. Where no trial has a slot (an older record), trials are
packed onto as few lanes as overlap allows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.reporting._section import Image, Part, Section, Table, fmt_seconds, read_json
from paralela.reporting._timeline import Bar, Timeline, mark_stragglers

__all__ = ["LEADERBOARD", "STRAGGLER_FACTOR", "load_sweep"]

LEADERBOARD = 10  # trials in the leaderboard table
# A completed trial is a straggler above 3x the median duration: trials differ by design
# (their parameters set the work), so only far outliers are marked.
STRAGGLER_FACTOR = 3.0
PLOT_ORDER = ("optimization_history", "param_importances", "intermediate_values")
_STATES = {"COMPLETE": "ok", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}

PARTS = {
    "busy": Part(
        "trials",
        "each trial's end minus its start on its slot (for command trials this includes "
        "starting the program and importing its libraries)",
    ),
    "startup": Part(
        "start-up",
        "from the sweep's start to the slot's first trial: opening the study, starting "
        "the slot's worker and asking for the first parameters",
    ),
    "between": Part(
        "between trials",
        "gaps between one slot's trials: the result told to the study, the next "
        "parameters asked for, the next trial started",
    ),
    "waiting": Part(
        "waiting at the end",
        "from the slot's last trial to the sweep's end: no trial left to start while "
        "other slots finish theirs",
    ),
}


def load_sweep(path: Path) -> Section:
    """The section of the sweep run directory at ``path``.

    Raises:
        ConfigError: ``trials.json`` is unreadable or has no trial list.
    """
    data = read_json(path / "trials.json", "trial list a paralela sweep writes")
    if not isinstance(data, dict) or not isinstance(data.get("trials"), list):
        raise ConfigError(
            f"{path / 'trials.json'} has no trial list; it was not written by paralela "
            "sweep. Run the sweep again with this run directory."
        )
    trials: list[dict[str, Any]] = data["trials"]
    directions = list(data.get("directions") or ["minimize"])
    section = Section("sweep", path, f"Sweep: {data.get('study_name', path.name)}")
    section.parts = dict(PARTS)
    states: dict[str, int] = {}
    for t in trials:
        states[str(t.get("state"))] = states.get(str(t.get("state")), 0) + 1
    wall = float(data.get("wall_seconds") or 0.0)
    best = data.get("best") or None
    section.facts = [
        ("study", str(data.get("study_name", "?"))),
        ("storage", str(data.get("storage", "?"))),
        ("objective", ", ".join(directions)),
        ("trials", ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())) or "0"),
        ("slots", str(data.get("slots", "?"))),
        ("wall time", fmt_seconds(wall)),
        ("slots busy", f"{float(data.get('busy_fraction') or 0.0):.0%} (as the sweep measured)"),
    ]
    if best:
        section.facts.append(
            (
                "best",
                f"#{best.get('number')}: {_value(best.get('value'))} with {best.get('params')}",
            )
        )
    section.notes.extend(str(n) for n in data.get("notes") or [])
    section.data = {
        "study_name": data.get("study_name"),
        "directions": directions,
        "wall_seconds": wall,
        "slots": data.get("slots"),
        "busy_fraction": data.get("busy_fraction"),
        "best": best,
    }
    section.timeline = _timeline(trials, wall)
    section.tables.append(_leaderboard(trials, directions))
    failed = [t for t in trials if t.get("state") == "FAIL"]
    if failed:
        section.tables.append(
            Table(
                "Failed trials",
                ["trial", "error", "log"],
                [
                    [
                        str(t.get("number")),
                        _last_line(t.get("error")),
                        str(t.get("log_path") or "-"),
                    ]
                    for t in failed[:20]
                ],
                f"{len(failed)} failed" + (" (first 20 shown)" if len(failed) > 20 else ""),
            )
        )
    section.images.extend(_plots(path / "plots"))
    if not section.images:
        section.notes.append(
            f"No optimisation plots in {path / 'plots'} (the sweep ran with plots off, or "
            "matplotlib was missing then)."
        )
    return section


def _timeline(trials: list[dict[str, Any]], wall: float) -> Timeline | None:
    timed = [t for t in trials if t.get("started") is not None]
    if not timed:
        return None
    this_run = [t for t in timed if t.get("slot") is not None]
    lanes_of: dict[int, str] = {}
    if this_run:
        chosen = this_run
        for t in chosen:
            lanes_of[int(t["number"])] = f"slot {int(t['slot'])}"
        how = "lanes are the sweep's slots"
    else:
        chosen = timed
        lanes_of = _pack(chosen)
        how = "no trial recorded its slot: lanes are packed by overlap"
    ends = [float(t["finished"]) for t in chosen if t.get("finished") is not None]
    first = min(float(t["started"]) for t in chosen)
    end = max(ends) if ends else first + wall
    start = min(first, end - wall) if wall > 0 and this_run else first
    bars = [
        Bar(
            lanes_of[int(t["number"])],
            float(t["started"]),
            float(t["finished"]) if t.get("finished") is not None else end,
            f"#{t['number']}",
            _STATES.get(str(t.get("state")), "ok"),
        )
        for t in chosen
    ]
    bars, rule = mark_stragglers(bars, lambda b: b.duration, STRAGGLER_FACTOR)
    note = (
        "The window ends at the last trial's end and starts the sweep's wall time before "
        f"it ({fmt_seconds(wall)}), or at the first trial's start if that is earlier; "
        f"{how}; {rule} duration of the completed trials."
    )
    lanes = sorted(set(lanes_of.values()), key=lambda s: int(s.split()[-1]))
    devices = {
        lanes_of[int(t["number"])]: f"devices {t['devices']}" for t in chosen if t.get("devices")
    }
    return Timeline(lanes, bars, start, end, "trial", "slot", note, devices)


def _pack(trials: list[dict[str, Any]]) -> dict[int, str]:
    """Each trial on the first lane free at its start (interval partitioning)."""
    free_at: list[float] = []
    lanes: dict[int, str] = {}
    for t in sorted(trials, key=lambda t: float(t["started"])):
        start = float(t["started"])
        end = float(t["finished"]) if t.get("finished") is not None else math.inf
        lane = next((i for i, f in enumerate(free_at) if f <= start), None)
        if lane is None:
            free_at.append(end)
            lane = len(free_at) - 1
        else:
            free_at[lane] = end
        lanes[int(t["number"])] = f"lane {lane}"
    return lanes


def _leaderboard(trials: list[dict[str, Any]], directions: list[str]) -> Table:
    sign = -1.0 if directions[0] == "maximize" else 1.0
    done = [t for t in trials if t.get("state") == "COMPLETE" and _finite(t.get("value"))]
    done.sort(key=lambda t: sign * float(t["value"]))
    names = sorted({k for t in done[:LEADERBOARD] for k in t.get("params", {})})
    rows = [
        [
            str(i + 1),
            f"#{t.get('number')}",
            _value(t.get("value")),
            *(_param(t.get("params", {}).get(k)) for k in names),
            fmt_seconds(t.get("duration")),
        ]
        for i, t in enumerate(done[:LEADERBOARD])
    ]
    best = "highest" if sign < 0 else "lowest"
    return Table(
        "Leaderboard",
        ["", "trial", "value", *names, "duration"],
        rows,
        f"The {min(LEADERBOARD, len(done))} best of {len(done)} completed trials, {best} "
        "first objective value first."
        if done
        else "No trial completed.",
    )


def _plots(directory: Path) -> list[Image]:
    if not directory.is_dir():
        return []
    files = sorted(
        directory.glob("*.png"),
        key=lambda p: (
            PLOT_ORDER.index(p.stem) if p.stem in PLOT_ORDER else len(PLOT_ORDER),
            p.name,
        ),
    )
    images = []
    for file in files:
        try:
            png = file.read_bytes()
        except OSError:
            continue
        if not png.startswith(b"\x89PNG"):
            continue
        title = file.stem.replace("_", " ").capitalize()
        images.append(Image(f"sweep-{file.stem}", title, png, source=str(file)))
    return images


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _value(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) else "-"


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _last_line(text: Any) -> str:
    """The last line of an error (a traceback's message), cut to 200 characters."""
    line = str(text or "").strip().splitlines()[-1:] or ["-"]
    return line[0][:200]
