"""A rich progress bar with items/s and ETA, shown only on a terminal.

The bar appears once a run has lasted ``DELAY_SECONDS`` (as tqdm's ``delay``): starting
and stopping rich costs about 5 ms, more than the whole parallel overhead of a short
map, and a bar that flashes by tells nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["DELAY_SECONDS", "NullProgress", "Progress", "make_progress"]

DELAY_SECONDS = 0.5


class NullProgress:
    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class Progress(NullProgress):
    def __init__(self, total: int | None, description: str, force: bool) -> None:
        self._total = total
        self._description = description
        self._force = force
        self._done = 0
        self._bar: Any = None
        self._task: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(DELAY_SECONDS, self._start)
        self._timer.daemon = True
        self._timer.start()

    def _start(self) -> None:
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

        with self._lock:
            if self._closed:
                return
            console = Console(file=sys.stderr, force_terminal=self._force or None)
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
            self._task = self._bar.add_task(
                self._description, total=self._total, completed=self._done, rate="-"
            )
            self._bar.start()

    def advance(self, n: int) -> None:
        with self._lock:
            self._done += n
            if self._bar is None:
                return
            self._bar.advance(self._task, n)
            speed = self._bar.tasks[0].speed
            if speed:
                self._bar.update(self._task, rate=f"{speed:,.0f}")

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._bar is not None:
                self._bar.stop()


def make_progress(setting: Any, total: int | None, description: str) -> NullProgress:
    """``True`` forces the bar, ``False`` hides it, ``None`` shows it on a terminal."""
    if setting is False:
        return NullProgress()
    if setting is None and not sys.stderr.isatty():
        return NullProgress()
    return Progress(total, description, force=setting is True)
