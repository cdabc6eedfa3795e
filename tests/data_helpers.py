"""Functions for the ``paralela.data`` tests, in a module that process workers import by
name."""

from __future__ import annotations

import os
import time
from typing import Any


def square(x: int) -> int:
    return x * x


def slow_io(x: Any) -> Any:
    """An I/O wait: 10 ms of sleep, no CPU."""
    time.sleep(0.01)
    return x


def cpu_work(x: int) -> int:
    """About 3 ms of pure-Python work (holds the GIL)."""
    total = 0
    for i in range(30_000):
        total += (i * x) % 7
    return total


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def lines_of(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def fail_on_7(x: int) -> int:
    if x == 7:
        raise ValueError(f"cannot handle {x}")
    return x


def pid_of(_: Any) -> int:
    return os.getpid()


def megabyte(i: int) -> Any:
    import numpy as np

    return np.full(1 << 17, i, dtype=np.float64)  # 1 MiB


def sleep_forever(x: Any) -> Any:
    time.sleep(3600)
    return x


def die_on_10(x: int) -> int:
    """Kills its own worker process on element 10 (as an out-of-memory kill would)."""
    if x == 10:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return x


def double(x: int) -> int:
    return x * 2


def triple(x: int) -> int:
    return x * 3


def numbers(n: int) -> Any:
    """A generator source: ``0 .. n - 1``."""
    yield from range(n)


def die_once_on_10(marker: str, x: int) -> int:
    """Kills its worker on element 10 the first time only (``marker`` is created then):
    a worker killed from outside, whose element passes when run again."""
    if x == 10:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return x
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return x
