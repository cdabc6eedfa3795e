"""A rich progress bar with items/s and ETA, shown only on a terminal."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["NullProgress", "Progress", "make_progress"]


class NullProgress:
    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class Progress(NullProgress):
    def __init__(self, total: int | None, description: str, force: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        console = Console(file=sys.stderr, force_terminal=force or None)
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]} items/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            refresh_per_second=8,
        )
        self._task = self._bar.add_task(description, total=total, rate="-")
        self._bar.start()

    def advance(self, n: int) -> None:
        self._bar.advance(self._task, n)
        speed = self._bar.tasks[0].speed
        if speed:
            self._bar.update(self._task, rate=f"{speed:,.0f}")

    def close(self) -> None:
        self._bar.stop()


def make_progress(setting: Any, total: int | None, description: str) -> NullProgress:
    """``True`` forces the bar, ``False`` hides it, ``None`` shows it on a terminal."""
    if setting is False:
        return NullProgress()
    if setting is None and not sys.stderr.isatty():
        return NullProgress()
    return Progress(total, description, force=setting is True)
