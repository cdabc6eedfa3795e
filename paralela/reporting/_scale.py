"""A scaling measurement (``paralela scale``) as a report section.

Reads ``scaling.json`` through :func:`paralela.scaling.load_scaling`: the speed-up
at each worker count, the fitted law (Amdahl for fixed work, Gustafson for work that
grows with the workers) with its uncertainty, predictions at larger counts and caveats.
When the measured runs were maps that kept a run directory, the timeline of one of them
(the last repetition at the largest count, where overhead shows most) is shown too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paralela.errors import ConfigError
from paralela.reporting._section import Part, Section, Table, fmt_seconds

__all__ = ["load_scale"]


def load_scale(path: Path) -> Section:
    """The section of the scaling run directory at ``path``.

    Raises:
        ConfigError: ``scaling.json`` is unreadable, malformed or of a newer format.
    """
    from paralela.scaling import ScalingError, load_scaling

    try:
        result = load_scaling(path)
    except ScalingError as exc:
        raise ConfigError(f"{exc} (reading {path / 'scaling.json'} for the report)") from exc
    strong = result.mode == "strong"
    section = Section("scale", path, f"Scaling ({result.mode}): {result.target}", parts={})
    machine = result.machine or {}
    section.facts = [
        ("target", f"{result.target} ({result.target_kind})"),
        (
            "mode",
            "strong: the same work on every count (Amdahl)"
            if strong
            else "weak: the work grows with the workers (Gustafson)",
        ),
        ("worker counts", ", ".join(str(p.workers) for p in result.points)),
        ("repetitions", f"{result.repeats} timed, {result.warmup} warm-up per count"),
        ("machine", _machine(machine)),
        ("measured", f"{result.created or '?'}, took {fmt_seconds(result.duration_seconds)}"),
    ]
    fit = result.fit
    lines = result.summary_lines()
    if fit is not None:
        section.facts.append(("serial fraction", lines[0].removeprefix("Serial fraction ")))
    headers, rows = result.table_rows()
    section.tables.append(
        Table(
            "Speed-up per worker count",
            headers,
            rows,
            f"Speed-ups relative to {result.baseline_workers} worker(s), from the median "
            "of the timed repetitions; spread: slowest over fastest repetition.",
        )
    )
    if result.predictions:
        section.tables.append(
            Table(
                "Predicted at larger counts",
                ["workers", "Amdahl", "Amdahl range", "Gustafson", "Gustafson range"],
                [
                    [
                        str(p.workers),
                        f"{p.amdahl:.2f}x",
                        f"{p.amdahl_low:.2f} .. {p.amdahl_high:.2f}",
                        f"{p.gustafson:.2f}x",
                        f"{p.gustafson_low:.2f} .. {p.gustafson_high:.2f}",
                    ]
                    for p in result.predictions
                ],
                "Ranges from the ends of the serial fraction's confidence interval. Amdahl "
                "keeps the work fixed; Gustafson grows it with the workers.",
            )
        )
    section.notes.extend(line for line in lines[1:] if not line.startswith("Warning: "))
    section.notes.extend(f"Warning: {c.message}" for c in result.caveats)
    section.data = {"scaling": result.to_dict()}
    section.source = result
    _add_map_timeline(section, path, result)
    return section


def _machine(machine: dict[str, Any]) -> str:
    """``vm: 2 usable CPUs of 2, AMD EPYC ...`` from the measurement's machine record."""
    if not machine:
        return "?"
    text = f"{machine.get('host', '?')}: {machine.get('usable_cpus', '?')} usable CPUs"
    if machine.get("logical_cpus") not in (None, machine.get("usable_cpus")):
        text += f" of {machine['logical_cpus']}"
    if machine.get("cpu_model"):
        text += f", {machine['cpu_model']}"
    if machine.get("gpus"):
        text += f", GPUs: {', '.join(map(str, machine['gpus']))}"
    if machine.get("slurm_job_id"):
        text += f", Slurm job {machine['slurm_job_id']}"
    return text


def _add_map_timeline(section: Section, path: Path, result: Any) -> None:
    """The timeline of the last timed map at the largest count, when one was kept."""
    from paralela.reporting._map import load_map

    runs = [r for r in result.runs if r.run_dir and r.repeat > 0 and not r.reference]
    if not runs:
        return
    run = max(runs, key=lambda r: (r.workers, r.repeat))
    directory = Path(run.run_dir)
    directory = directory if directory.is_absolute() else path / directory
    if not (directory / "summary.json").is_file():
        return
    try:
        inner = load_map(directory)
    except ConfigError as exc:
        section.notes.append(f"The timeline of {directory} could not be read: {exc}")
        return
    section.timeline = inner.timeline
    section.parts = {k: Part(p.label, p.how) for k, p in inner.parts.items()}
    section.facts.append(
        ("timeline", f"the map of repetition {run.repeat} on {run.workers} workers ({directory})")
    )
    section.data["timeline_run"] = str(directory)
