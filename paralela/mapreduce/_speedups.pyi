from collections.abc import Callable, Iterator
from typing import Any

class Tally:
    n: int
    def __init__(self, n: int = 0) -> None: ...

def count_runs(
    runs: dict[Any, Tally],
    it: Iterator[Any],
    one: Any,
    other: Callable[[Any, Any], object],
    budget: int,
    seen: list[Any],
    /,
) -> None: ...
