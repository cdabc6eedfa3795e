"""A map whose run directory fills up while an item fails: the item's own error comes
out, not the ``No space left`` of the summary written while it propagates (that is a
note on it). A real small tmpfs (CI runs as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import paralela

pytestmark = pytest.mark.timeout(60)


def fills_the_disk_then_fails(directory: str) -> None:
    try:
        with open(os.path.join(directory, "ballast"), "wb") as f:
            while True:
                f.write(bytes(65536))
    except OSError:
        pass
    raise ValueError("the item's own error")


def test_an_error_is_not_hidden_by_the_summary_a_full_disk_refuses(small_disk: Path) -> None:
    with pytest.raises(ValueError, match="the item's own error") as info:
        paralela.map(
            fills_the_disk_then_fails, [str(small_disk)], workers=1, run_dir=small_disk / "run"
        )
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "summary" in notes
    assert "No space left on device" in notes
