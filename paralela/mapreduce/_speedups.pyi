from collections.abc import Callable, Iterator
from typing import Any

def count_runs(
    runs: dict[Any, int],
    it: Iterator[Any],
    one: Any,
    other: Callable[[Any, Any], object],
    budget: int,
    seen: list[Any],
    /,
) -> None: ...
