"""The readable report of ``paralela info``: one rich table per section.

Imports rich when called, not when ``paralela.resources`` is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from paralela.resources._detect import Resources
from paralela.resources._slots import Slot

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["format_bytes", "format_ids", "print_report"]


def format_bytes(n: int | None) -> str:
    """``23.5 GiB``-style sizes; ``"?"`` when unknown."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_ids(ids: Sequence[int]) -> str:
    """Compress CPU ids into ranges: ``[0, 1, 2, 3, 6]`` → ``"0-3,6"``."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts) or "-"


def _pairs(title: str, rows: Sequence[tuple[str, str]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _cpus(res: Resources) -> Table:
    cpus = res.cpus
    quota = "none" if cpus.cgroup_quota is None else f"{cpus.cgroup_quota:g} CPUs"
    return _pairs(
        "CPUs",
        [
            ("usable", str(cpus.usable)),
            ("affinity", f"{format_ids(cpus.affinity)} ({len(cpus.affinity)} CPUs)"),
            ("cgroup quota", quota),
            ("logical on node", str(cpus.logical)),
        ],
    )


def _memory(res: Resources) -> Table:
    mem = res.memory
    rows = [("total", format_bytes(mem.total)), ("available", format_bytes(mem.available))]
    if mem.cgroup_limit is not None:
        rows.append(("cgroup limit", format_bytes(mem.cgroup_limit)))
        rows.append(("cgroup usage", format_bytes(mem.cgroup_usage)))
    rows.append(("free for this process", format_bytes(mem.free)))
    return _pairs("Memory", rows)


def _gpus(res: Resources) -> Table:
    from rich.table import Table

    table = Table(title=f"GPUs (found by: {res.gpu_source})", title_justify="left")
    if not res.gpus:
        table.add_column("none")
        for note in res.gpu_notes:
            table.add_row(note)
        return table
    for col in ("index", "physical", "memory", "free"):
        table.add_column(col, no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("uuid", overflow="fold")
    for g in res.gpus:
        table.add_row(
            str(g.index),
            str(g.physical_index),
            format_bytes(g.memory_total),
            format_bytes(g.memory_free),
            g.name,
            g.uuid,
        )
    return table


MAX_HOSTS_SHOWN = 32  # a larger allocation's host list is cut there (all in --json)


def _slurm(res: Resources) -> Table:
    s = res.slurm
    if s is None:
        from rich.table import Table

        table = Table(title="Slurm", title_justify="left", show_header=False)
        table.add_row("not inside a Slurm allocation")
        return table
    rows = [("job", s.job_id + (f" (array task {s.array_task_id})" if s.is_array else ""))]
    rows.append(("nodes", f"{s.nnodes}: {s.nodelist or '?'}"))
    if s.nodes and list(s.nodes) != [s.nodelist]:  # node[1-3] -> node1, node2, node3
        shown = ", ".join(s.nodes[:MAX_HOSTS_SHOWN])
        more = len(s.nodes) - MAX_HOSTS_SHOWN
        rows.append(("hosts", shown + (f" and {more} more (all in --json)" if more > 0 else "")))
    ranks = (s.procid, s.localid, s.nodeid)
    if any(r is not None for r in ranks):
        shown = " / ".join("?" if r is None else str(r) for r in ranks)
        rows.append(("this task (procid / localid / nodeid)", shown))
    counts = [
        ("tasks", s.ntasks),
        ("cpus per task", s.cpus_per_task),
        ("cpus on node", s.cpus_on_node),
        ("tasks per node", s.ntasks_per_node),
        ("gpus on node", s.gpus_on_node),
    ]
    rows.extend((label, str(value)) for label, value in counts if value is not None)
    if s.gpu_ids:
        rows.append(("gpu ids", ",".join(map(str, s.gpu_ids))))
    if s.tmpdir:
        rows.append(("scratch", s.tmpdir))
    return _pairs("Slurm", rows)


def _filesystems(res: Resources) -> Table:
    from rich.table import Table

    table = Table(title="Filesystems", title_justify="left")
    for col in ("role", "path", "type", "kind", "mount point", "free"):
        table.add_column(col)
    for fs in res.filesystems:
        table.add_row(
            fs.role, fs.path, fs.fstype or "?", fs.kind, fs.mount_point or "?",
            format_bytes(fs.free_bytes),
        )  # fmt: skip
    return table


def _slots(slots: Sequence[Slot]) -> Table:
    from rich.table import Table

    table = Table(title="Default slots (one task each)", title_justify="left")
    for col in ("slot", "CPUs", "GPUs", "threads", "CUDA_VISIBLE_DEVICES"):
        table.add_column(col)
    for slot in slots:
        table.add_row(
            str(slot.index),
            format_ids(slot.cpus),
            ",".join(slot.gpus) or "-",
            str(slot.threads),
            repr(slot.env()["CUDA_VISIBLE_DEVICES"]),
        )
    return table


def print_report(resources: Resources, slots: Sequence[Slot], console: Console) -> None:
    """Print the readable report of ``paralela info``.

    Args:
        resources: what :func:`detect` found.
        slots: the slots to show.
        console: where to print.
    """
    console.print(f"[bold]Host[/bold] {resources.host}")
    for table in (
        _cpus(resources),
        _memory(resources),
        _gpus(resources),
        _slurm(resources),
        _filesystems(resources),
        _slots(slots),
    ):
        console.print()
        console.print(table)
