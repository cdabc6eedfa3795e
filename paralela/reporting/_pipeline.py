"""An input pipeline's run (``paralela.data``, ``with_options(run_dir=...)``) as a report
section: how busy the consumer was, the stages with the workers the tuner chose, and the
bottleneck. Reads ``pipeline.json`` (:meth:`paralela.data.PipelineStats.save`)."""

from __future__ import annotations

from pathlib import Path

from paralela.errors import ConfigError
from paralela.reporting._section import Section, Table, fmt_seconds, read_json

__all__ = ["load_pipeline"]


def load_pipeline(path: Path) -> Section:
    """The section of the pipeline run directory at ``path``.

    Raises:
        ConfigError: ``pipeline.json`` is unreadable, malformed or of a newer format.
    """
    data = read_json(path / "pipeline.json", "stats of an input pipeline (paralela.data)")
    if not isinstance(data, dict) or data.get("format") != 1 or "stages" not in data:
        raise ConfigError(
            f"{path / 'pipeline.json'} is not a pipeline's stats this version reads "
            "(format 1); run the pipeline again with this version."
        )
    wall = float(data["wall_seconds"])
    section = Section("pipeline", path, "Input pipeline", parts={})
    section.facts = [
        (
            "consumer busy",
            f"{data['consumer_busy']:.0%} of {fmt_seconds(wall)} "
            f"(waited {fmt_seconds(data['stall_seconds'])})",
        ),
        ("CPU budget", f"{data['cpus']} CPUs (workers='auto' keeps within it)"),
        ("bottleneck", data.get("bottleneck") or "none: no stage held the consumer up"),
        ("measured", str(data.get("created", "?"))),
    ]
    rows = []
    for stage in data["stages"]:
        rate = stage["elements"] / wall if wall > 0 else 0.0
        rows.append(
            [
                stage["name"],
                stage["kind"],
                str(stage["elements"]),
                f"{rate:,.0f}",
                str(stage["workers"])
                if stage["workers"] == stage["max_workers"]
                else f"{stage['workers']} (max {stage['max_workers']})",
                f"{stage['cpu_share']:.2f}" if stage["busy_seconds"] else "-",
                fmt_seconds(stage["wait_seconds"]),
            ]
        )
    section.tables.append(
        Table(
            "Stages, source first",
            ["stage", "kind", "elements", "per second", "workers", "CPU per worker", "waited"],
            rows,
            "waited: time the stage below (or the consumer) waited on this stage's own "
            "workers; the stage that waited most is the bottleneck. CPU per worker: CPU "
            "time over busy time (near 0 for I/O waits, near 1 for pure-Python work).",
        )
    )
    changes = [
        f"{s['name']}: " + " → ".join(str(n) for _, n in s["history"])
        for s in data["stages"]
        if len(s.get("history", [])) > 1
    ]
    if changes:
        section.notes.append("Workers chosen over the run: " + "; ".join(changes) + ".")
    section.data = {"pipeline": data}
    return section
