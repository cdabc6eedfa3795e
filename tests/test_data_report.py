"""A pipeline run kept with ``with_options(run_dir=...)``: its ``pipeline.json`` and its
section in ``paralela report``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paralela
from paralela.data import Pipeline
from paralela.errors import ConfigError
from tests.data_helpers import slow_io, square


def test_a_run_writes_its_stats_and_the_report_shows_its_stages(tmp_path: Path) -> None:
    run_dir = tmp_path / "pipe"
    pipeline = (
        Pipeline.from_iterable(range(120))
        .map(slow_io)
        .map(square, workers=2)
        .batch(10)
        .with_options(run_dir=run_dir)
    )
    assert len(list(pipeline)) == 12
    data = json.loads((run_dir / "pipeline.json").read_text())
    assert data["format"] == 1
    assert [s["name"] for s in data["stages"]] == [
        "from_iterable(range)",
        "map(slow_io)",
        "map(square)",
        "batch(10)",
    ]
    assert data["bottleneck"] == "map(slow_io)"
    tuned = data["stages"][1]["history"]
    assert tuned[0] == [0.0, 1]
    assert tuned[-1][1] == data["stages"][1]["workers"] > 1
    report = paralela.write_report(run_dir)
    assert [r.kind for r in report.runs] == ["pipeline"]
    page = report.path.read_text()
    for text in ("Input pipeline", "map(slow_io)", "consumer busy", "Workers chosen over the run"):
        assert text in page


def test_a_pipeline_json_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pipeline.json").write_text('{"format": 99, "stages": []}')
    with pytest.raises(ConfigError, match="format 1"):
        paralela.write_report(tmp_path)
