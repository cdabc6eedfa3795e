"""Which kind of run a directory holds: the file each kind leaves behind.

::

    summary.json   a map's run store (paralela.map(..., run_dir=...))
    trials.json    a sweep's run directory
    compare.json   a comparison's run directory (paralela compare)
    launch*.json   a launch's log directory (launch.json, or launch-nodeN.json per node)
    scaling.json   a scaling measurement (paralela scale)
    pipeline.json  an input pipeline's run (paralela.data, with_options(run_dir=...))

A directory that is none of these but holds such directories below it (the demo's
``paralela-runs/demo-<time>/``, or ``paralela-runs/`` itself) is a collection: each run
found below it, at most :data:`MAX_DEPTH` levels down, gets a section of one report. The
search does not descend into a run (a sweep's ``trials/`` or a map's ``chunks/``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from paralela.errors import ConfigError

__all__ = ["KINDS", "MAX_DEPTH", "FoundRun", "find_runs", "kind_of"]

# kind -> the file that marks it, in the order a report shows them
KINDS: dict[str, str] = {
    "map": "summary.json",
    "sweep": "trials.json",
    "compare": "compare.json",
    "launch": "launch.json",
    "scale": "scaling.json",
    "pipeline": "pipeline.json",
}
MAX_DEPTH = 3  # levels below a collection searched for runs


@dataclass(frozen=True)
class FoundRun:
    """A run directory and its kind (``"map"``, ``"sweep"``, ``"compare"``, ``"launch"``,
    ``"scale"``, ``"pipeline"``)."""

    kind: str
    path: Path


def kind_of(directory: Path) -> str | None:
    """The kind of run ``directory`` holds, or ``None`` when it is not a run directory."""
    for kind, marker in KINDS.items():
        if (directory / marker).is_file():
            return kind
        if kind == "launch" and any(directory.glob("launch-node*.json")):
            return kind  # a multi-node launch: one record per node, no launch.json
    return None


def find_runs(path: str | os.PathLike[str]) -> list[FoundRun]:
    """The runs at ``path``: itself if it is a run directory, else the runs below it.

    Runs below a collection come by kind (maps, sweeps, launches, scaling
    measurements: the order ``paralela demo`` runs its steps), then by path.

    Raises:
        ConfigError: ``path`` does not exist, is not a directory, or holds no run.
    """
    root = Path(path)
    if not root.exists():
        raise ConfigError(
            f"The run directory {root} does not exist. Give the directory a map "
            "(run_dir=), sweep, comparison, launch (log directory) or scale wrote, or one "
            "that holds several of them, such as paralela-runs/demo-<time>."
        )
    if not root.is_dir():
        raise ConfigError(
            f"{root} is a file, not a run directory. Give the directory that holds "
            f"{', '.join(sorted(set(KINDS.values())))} (or several such directories)."
        )
    kind = kind_of(root)
    if kind is not None:
        return [FoundRun(kind, root)]
    found: list[FoundRun] = []
    _search(root, MAX_DEPTH, found)
    order = list(KINDS)
    found.sort(key=lambda run: (order.index(run.kind), str(run.path)))
    if not found:
        markers = ", ".join(f"{m} ({k})" for k, m in KINDS.items())
        raise ConfigError(
            f"{root} is not a paralela run directory: it holds none of {markers}, nor a "
            f"directory (up to {MAX_DEPTH} levels down) that does. Give the run_dir= of a "
            "map, the run directory of a sweep or a comparison, the log directory of a "
            "launch, or the output directory of paralela scale."
        )
    return found


def _search(directory: Path, depth: int, found: list[FoundRun]) -> None:
    if depth == 0:
        return
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return  # unreadable: nothing to report there
    for child in children:
        if child.name.startswith("."):
            continue
        kind = kind_of(child)
        if kind is not None:
            found.append(FoundRun(kind, child))
        else:
            _search(child, depth - 1, found)
