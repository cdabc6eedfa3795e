"""``scaling.png``: the measured speed-ups with the fitted law, and the efficiencies.

Drawn with matplotlib's object API on an Agg canvas: no pyplot, so the caller's
matplotlib backend and open figures are left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paralela.scaling._model import ScalingResult

__all__ = ["plot_scaling"]

# Points along the fitted curve: smooth enough on a log axis, cheap to draw.
CURVE_POINTS = 120
# The fitted curve goes this far past the largest count measured.
EXTEND = 4


def plot_scaling(result: ScalingResult, path: Path) -> tuple[Path | None, str | None]:
    """Draw ``result`` into ``path`` (PNG, 1000x420 pixels).

    Returns:
        ``(path, None)``, or ``(None, why)`` when matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return None, "no scaling.png: matplotlib is not installed (pip install 'paralela[sweep]')"

    b = result.baseline_workers
    weak = result.mode == "weak"
    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax_eff = fig.subplots(1, 2)
    counts = [p.workers for p in result.points]
    top = max(counts) * EXTEND
    ax.plot([b, top], [1, top / b], linestyle=":", color="grey", label="ideal")  # log-log
    for p in result.points:
        per_run = [p.speedup * p.median / t for t in p.times]
        ax.scatter([p.workers] * len(per_run), per_run, s=8, color="tab:blue", alpha=0.35)
    fitted = [p for p in result.points if p.in_fit]
    over = [p for p in result.points if not p.in_fit]
    ax.plot(
        [p.workers for p in fitted],
        [p.speedup for p in fitted],
        "o",
        color="tab:blue",
        label="measured (median)",
    )
    if over:
        ax.plot(
            [p.workers for p in over],
            [p.speedup for p in over],
            "o",
            mfc="none",
            color="tab:blue",
            label="not fitted (over CPUs)",
        )
    fit = result.fit
    title = "Weak scaling" if weak else "Strong scaling"
    if fit is not None:
        step = (top / b) ** (1 / (CURVE_POINTS - 1))
        xs = [b * step**i for i in range(CURVE_POINTS)]
        ys = [fit.speedup(x) for x in xs]
        bands = [fit.band(x) for x in xs]
        law = "Amdahl" if fit.model == "amdahl" else "Gustafson"
        ax.plot(xs, ys, color="tab:orange", label=f"{law} fit")
        ax.fill_between(
            xs, [lo for lo, _ in bands], [hi for _, hi in bands], color="tab:orange", alpha=0.2
        )
        pm = "" if fit.stderr is None else f" ± {fit.stderr:.3f}"
        title += f": {law} s = {fit.serial_fraction:.3f}{pm}"
        ax_eff.plot(xs, [y / (x / b) for x, y in zip(xs, ys, strict=True)], color="tab:orange")
    cpus = result.machine.get("usable_cpus")
    if isinstance(cpus, int) and cpus < top:
        for axis in (ax, ax_eff):
            axis.axvline(cpus, color="tab:red", linestyle="--", linewidth=0.8)
        ax.text(cpus, 1, f" {cpus} usable CPUs", color="tab:red", fontsize=8, va="bottom")
    ax_eff.plot(counts, [p.efficiency for p in result.points], "o", color="tab:blue")
    vs = f" (vs {b} workers)" if b != 1 else ""
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(("scaled speed-up" if weak else "speed-up") + vs)
    ax_eff.set_title("Efficiency: speed-up per worker", fontsize=10)
    ax_eff.set_ylim(0, max(1.1, max(p.efficiency for p in result.points) * 1.1))
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    for axis in (ax, ax_eff):
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.set_xlabel("workers")
        axis.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path, None
