"""The live view of a sweep on a terminal: running trials and the best so far."""

from __future__ import annotations

import sys
import time
from typing import Any

from paralela.sweeping._results import TrialRecord

__all__ = ["LiveView", "NullView", "make_view"]


class NullView:
    def update(self, done: list[TrialRecord], running: list[TrialRecord]) -> None:
        pass

    def close(self) -> None:
        pass


# The table is redrawn once a second, when the driver's loop looks (no drawing thread):
# each redraw costs ~3 ms of CPU, taken from the trials on a machine they fill; at rich's
# default 4 redraws a second (and as many updates) the view alone used 2-3 % of a core.
REDRAW_SECONDS = 1.0


class LiveView(NullView):
    """A rich table redrawn at most once every :data:`REDRAW_SECONDS`."""

    def __init__(self, title: str, sign: float, force: bool) -> None:
        from rich.console import Console
        from rich.live import Live

        self._title = title
        self._sign = sign
        self._last = 0.0
        self._undrawn: tuple[list[TrialRecord], list[TrialRecord]] | None = None
        self._live = Live(
            console=Console(file=sys.stderr, force_terminal=force or None, markup=False),
            auto_refresh=False,
            transient=False,
        )
        self._live.start()

    def _table(self, done: list[TrialRecord], running: list[TrialRecord]) -> Any:
        from rich.table import Table

        finished = [r for r in done if r.state not in ("RUNNING",)]
        complete = [r for r in finished if r.state == "COMPLETE" and r.value is not None]
        best = min(complete, key=lambda r: self._sign * (r.value or 0.0), default=None)
        counts = {s: sum(r.state == s for r in finished) for s in ("COMPLETE", "PRUNED", "FAIL")}
        table = Table(
            title=f"{self._title}: {counts['COMPLETE']} complete, {counts['PRUNED']} pruned, "
            f"{counts['FAIL']} failed, {len(running)} running",
            title_justify="left",
        )
        for column in ("trial", "slot", "devices", "elapsed s", "last value", "params"):
            table.add_column(column)
        now = time.time()
        for r in running:
            last = r.intermediate[max(r.intermediate)] if r.intermediate else None
            table.add_row(
                f"#{r.number}",
                str(r.slot),
                r.devices or "-",
                f"{now - (r.started or now):.1f}",
                "-" if last is None else f"{last:.6g}",
                _short(r.params),
            )
        if best is not None:
            table.add_row(
                f"best #{best.number}",
                "",
                "",
                "",
                f"{best.value:.6g}",
                _short(best.params),
                style="bold green",
            )
        return table

    def update(self, done: list[TrialRecord], running: list[TrialRecord]) -> None:
        now = time.monotonic()
        if now - self._last < REDRAW_SECONDS:
            self._undrawn = (done, list(running))  # drawn by the next update, or close()
            return
        self._last = now
        self._undrawn = None
        self._live.update(self._table(done, running), refresh=True)

    def close(self) -> None:
        if self._undrawn is not None:  # the sweep's last state
            self._live.update(self._table(*self._undrawn), refresh=True)
        self._live.stop()


def _short(params: dict[str, Any], limit: int = 60) -> str:
    text = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_view(setting: bool | None, title: str, sign: float) -> NullView:
    """``True`` forces the live table, ``False`` hides it, ``None``: on a terminal."""
    if setting is False or (setting is None and not sys.stderr.isatty()):
        return NullView()
    return LiveView(title, sign, force=setting is True)
