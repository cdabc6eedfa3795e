"""A launch's log directory as a report section: each rank's process, per attempt.

Reads ``launch.json`` (or one ``launch-nodeN.json`` per node of a multi-node launch):
for every attempt, each rank's host, pid, start, end and exit code. A rank's bar is its
process's life, from start to exit; what happens inside (imports, the preflight
rendezvous, training) is not recorded separately. The window runs from the first
rank's start to the last rank's exit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from paralela.errors import ConfigError, describe_exit
from paralela.reporting._section import Part, Section, Table, fmt_seconds, read_json
from paralela.reporting._timeline import Bar, Timeline, mark_stragglers

__all__ = ["STRAGGLER_FACTOR", "load_launch"]

STRAGGLER_FACTOR = 1.25  # a rank is a straggler above 1.25x the median run time

PARTS = {
    "busy": Part(
        "rank running",
        "each rank process's exit minus its start: Python's start-up, the preflight "
        "rendezvous, imports and the program together",
    ),
    "startup": Part(
        "start skew",
        "from the first rank's start to this rank's start (the launcher starts ranks one "
        "after another; on several nodes, each node's launcher starts when Slurm does)",
    ),
    "between": Part(
        "restarts",
        "between a rank's attempts: the failed group stopped and a new one started",
    ),
    "waiting": Part(
        "waiting for the others",
        "from this rank's exit to the last rank's exit: the launch waits for its "
        "slowest rank (a straggler, or a rank with more to do)",
    ),
}


def load_launch(path: Path) -> Section:
    """The section of the launch log directory at ``path``.

    Raises:
        ConfigError: a launch record is unreadable or has no attempts.
    """
    files = sorted(path.glob("launch-node*.json"))
    if (path / "launch.json").is_file():
        files.insert(0, path / "launch.json")
    records = [read_json(f, "record paralela launch writes") for f in files]
    for file, record in zip(files, records, strict=True):
        if not isinstance(record, dict) or not isinstance(record.get("attempts"), list):
            raise ConfigError(
                f"{file} has no attempts; it was not written by paralela launch. "
                "Launch the program again with this log directory."
            )
    first = records[0]
    argv = [str(a) for a in first.get("argv", [])]
    python = len(argv) > 1 and "python" in Path(argv[0]).name
    program = " ".join(["python", *argv[1:]] if python else argv)
    section = Section("launch", path, f"Launch: {_name(argv)}", parts=dict(PARTS))
    # attempt i of every node, ranks of all nodes together
    attempts: list[list[dict[str, Any]]] = []
    for record in records:
        for i, ranks in enumerate(record["attempts"]):
            while len(attempts) <= i:
                attempts.append([])
            attempts[i].extend(r for r in ranks if isinstance(r, dict))
    ranks_seen = sorted({int(r["rank"]) for a in attempts for r in a})
    section.timeline = _timeline(attempts, ranks_seen)
    hosts = sorted({str(r.get("host")) for a in attempts for r in a})
    wall = section.timeline.window if section.timeline else 0.0
    section.facts = [
        ("program", program or "?"),
        ("ranks", str(first.get("world_size", len(ranks_seen)))),
        ("nodes", f"{first.get('nnodes', 1)} ({', '.join(hosts)})"),
        ("attempts", f"{len(attempts)} ({len(attempts) - 1} restart(s))"),
        ("wall time", fmt_seconds(wall) + " (first rank's start to last rank's exit)"),
        ("rendezvous", str(first.get("master", "?"))),
    ]
    t0 = section.timeline.start if section.timeline else 0.0
    section.tables.append(
        Table(
            "Ranks",
            ["rank", "attempt", "host", "pid", "started", "ran", "exit", "log"],
            [
                [
                    str(r["rank"]),
                    str(i + 1),
                    str(r.get("host", "?")),
                    str(r.get("pid", "?")),
                    f"+{float(r['start']) - t0:.2f} s",
                    fmt_seconds(float(r["end"]) - float(r["start"]))
                    if r.get("end") is not None
                    else "-",
                    "-" if r.get("returncode") is None else describe_exit(int(r["returncode"])),
                    str(r.get("log", "-")),
                ]
                for i, ranks in enumerate(attempts)
                for r in sorted(ranks, key=lambda r: int(r["rank"]))
            ],
            "Times from the first rank's start.",
        )
    )
    section.data = {"argv": argv, "world_size": first.get("world_size"), "attempts": attempts}
    return section


def _name(argv: list[str]) -> str:
    """``train.py`` or ``-m package.module``: what was launched, without its arguments."""
    args = argv[1:] if len(argv) > 1 and "python" in Path(argv[0]).name else argv
    if len(args) >= 2 and args[0] == "-m":
        return f"-m {args[1]}"
    return Path(args[0]).name if args else "?"


def _timeline(attempts: list[list[dict[str, Any]]], ranks: list[int]) -> Timeline | None:
    started = [float(r["start"]) for a in attempts for r in a if r.get("start") is not None]
    if not started:
        return None
    ended = [float(r["end"]) for a in attempts for r in a if r.get("end") is not None]
    start = min(started)
    end = max([*ended, *started])
    bars: list[Bar] = []
    for i, ranks_of_attempt in enumerate(attempts):
        # The rank that failed first is the failure; ranks that exited non-zero after it
        # were stopped by the launcher.
        failed = [r for r in ranks_of_attempt if r.get("returncode") not in (0, None)]
        culprit = min(failed, key=lambda r: float(r.get("end") or end), default=None)
        for r in ranks_of_attempt:
            if r.get("start") is None:
                continue
            code = r.get("returncode")
            state = "ok" if code == 0 else "running" if code is None else "stopped"
            if r is culprit:
                state = "failed"
            how = "running" if code is None else describe_exit(int(code))
            bars.append(
                Bar(
                    f"rank {int(r['rank'])}",
                    float(r["start"]),
                    float(r["end"]) if r.get("end") is not None else end,
                    f"attempt {i + 1}: {how}",
                    state,
                )
            )
    bars, rule = mark_stragglers(bars, lambda b: b.duration, STRAGGLER_FACTOR, minimum=2)
    hosts = {f"rank {int(r['rank'])}": str(r.get("host", "")) for a in attempts for r in a}
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    note = (
        f"The window runs from the first rank's start ({when}) to the last rank's exit; "
        f"{rule} run time of the ranks that exited 0."
    )
    lanes = [f"rank {r}" for r in ranks]
    return Timeline(lanes, bars, start, end, "attempt", "rank", note, hosts)
