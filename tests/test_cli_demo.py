"""`paralela demo`: the command end to end, and the library function behind it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from typer.testing import CliRunner

from paralela.cli import app
from paralela.demos import (
    MapDemoResult,
    PredictDemoResult,
    extract_features,
    run_map_demo,
    run_predict_demo,
    run_serve_demo,
)
from paralela.demos._map_demo import FEATURES
from paralela.errors import ConfigError


def report_sections(out: str) -> list[dict[str, object]]:
    """The sections of the report whose URL the demo printed last."""
    lines = out.strip().splitlines()
    assert lines[-1].startswith("Report: file:///"), out
    page = Path(unquote(urlparse(lines[-1].removeprefix("Report: ")).path))
    assert page.is_file(), page
    text = page.read_text()
    payload = text.split('id="paralela-report-data">', 1)[1].split("</script>", 1)[0]
    sections: list[dict[str, object]] = json.loads(payload)["sections"]
    return sections


def test_demo_prints_the_table_the_speedup_and_the_equality_check(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    tmpdir = tmp_path / "tmpdir"  # the demo's TMPDIR: it must leave nothing there
    tmpdir.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paralela",
            "demo",
            "--items",
            "40",
            "--workers",
            "2",
            "--trials",
            "4",
            "--run-dir",
            str(demo_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    out = proc.stdout
    for header in ("items", "serial s", "parallel s", "speed-up", "workers", "busy"):
        assert header in out
    assert re.search(r"Speed-up: \d+\.\d\dx on 2 workers \(ideal 2x", out), out
    assert "Results equal: yes (40 x 36 features, serial == parallel)." in out
    assert re.search(r"Summary: 40 items \(40 computed, 0 resumed\)", out), out
    # The sweep step: 4 real trials of the digits MLP, every one accounted for.
    for header in ("trials", "complete", "pruned", "failed", "slots", "slots busy"):
        assert header in out
    row = re.search(r"│\s+4 │\s+(\d+) │\s+(\d+) │\s+(\d+) │\s+2 │", out)
    assert row is not None, out
    assert sum(int(n) for n in row.groups()) == 4
    assert int(row.group(1)) >= 1  # at least one trial completed
    assert re.search(r"Best validation loss \d\.\d{4} with \{'lr': ", out), out
    # The compare step: 4 families, 10 candidates x 5 folds, the winner's fold scores
    # equal to scikit-learn's cross_val_score on the same folds.
    for family in ("logreg", "knn", "forest", "svm"):
        assert re.search(rf"│ {family} +│ +0\.\d{{4}} │", out), out
    assert re.search(r"10 candidates x 5 folds on 2 slots", out), out
    assert "Scores equal: yes (the best, " in " ".join(out.split())
    assert (demo_dir / "compare" / "best.pkl").is_file()
    # The training step: 2 real ranks, DDP, and a model that learned the digits.
    row = re.search(r"│\s+2 │\s+8 │\s+(\d+\.\d)% │\s+(\d\.\d{4}) │", out)
    assert row is not None, out
    assert float(row.group(1)) > 80.0
    assert "Each rank's log:" in out
    # The predict step: the trained MLP over all 1,797 digits, on 2 workers, equal to a
    # serial loop.
    for header in ("images", "shards", "serial s", "predict s", "images/s", "accuracy"):
        assert header in out
    row = re.search(r"│\s+1797 │\s+2 │\s+15 │ .* │\s+(\d+\.\d)% │", out)
    assert row is not None, out
    assert float(row.group(1)) > 90.0
    assert re.search(r"paralela\.predict: [\d,]+ records/s, starting 2 workers", out), out
    assert "Predictions equal: yes (1797 of 1797 images, paralela.predict == serial loop)." in out
    assert (demo_dir / "predict" / "output" / "_SUCCESS").is_file()
    # The serve step: the same MLP behind paralela serve, 300 requests from 16 clients,
    # every answer the model's own; batches formed; the server drained on SIGTERM.
    for header in ("requests", "clients", "start s", "req/s", "p50 ms", "p99 ms", "mean batch"):
        assert header in out
    row = re.search(r"│\s+300 │\s+16 │ .* │\s+(\d+\.\d) │\n", out)
    assert row is not None, out
    assert float(row.group(1)) > 1.0, "16 concurrent clients never shared a batch"
    assert "it drained and exited with status 0 on SIGTERM" in out
    assert "Answers equal: yes (300 of 300" in " ".join(out.split())
    # The report of the three steps, their runs kept under one directory.
    sections = report_sections(out)
    assert [(s["kind"], s["path"]) for s in sections] == [
        ("map", str(demo_dir / "map")),
        ("sweep", str(demo_dir / "sweep")),
        ("compare", str(demo_dir / "compare")),
        ("launch", str(demo_dir / "launch")),
    ]
    summary = json.loads((demo_dir / "map" / "summary.json").read_text())
    timeline = sections[0]["timeline"]
    assert isinstance(timeline, dict)
    assert len(timeline["bars"]) == len(summary["timeline"]) == summary["chunks"]
    assert sorted((demo_dir).glob("report-*.png"))


def test_run_map_demo_measures_both_runs() -> None:
    result = run_map_demo(items=12, workers=2)
    assert isinstance(result, MapDemoResult)
    assert result.items == 12
    assert result.features == FEATURES == 36
    assert result.workers == 2
    assert result.results_equal
    assert result.serial_seconds > 0
    assert result.parallel_seconds > 0
    assert result.speedup == pytest.approx(result.serial_seconds / result.parallel_seconds)
    assert result.ideal_speedup == 2.0
    assert result.summary.items == result.summary.computed_items == 12
    assert 0.0 <= result.busy_fraction <= 1.0


def test_features_are_deterministic_and_differ_between_recordings() -> None:
    a = extract_features(1)
    assert len(a) == FEATURES
    assert a == extract_features(1)
    assert a != extract_features(2)
    _mean, std, peak_to_peak, crossings, *bands = a
    assert std > 0
    assert peak_to_peak > 0
    assert 0 < crossings < 1
    # Three tones over noise: the strongest bands stand far above the typical one.
    ordered = sorted(bands)
    assert all(power >= 0 for power in bands)
    assert ordered[-1] > 10 * ordered[len(ordered) // 2]


def test_bad_item_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="items must be a positive integer, got 0"):
        run_map_demo(items=0)


def test_run_predict_demo_refuses_a_bad_image_count() -> None:
    with pytest.raises(ConfigError, match="images must be a positive integer, got 0"):
        run_predict_demo(images=0)


def test_run_predict_demo_agrees_with_the_serial_loop(tmp_path: Path) -> None:
    result = run_predict_demo(images=300, workers=2, run_dir=tmp_path)
    assert isinstance(result, PredictDemoResult)
    assert (result.images, result.workers, result.shards) == (300, 2, 3)  # 128 per shard
    assert result.agree == 300
    assert result.accuracy > 0.9
    assert result.parallel_rate == pytest.approx(300 / result.parallel_seconds)
    assert (tmp_path / "digits-mlp.pt").is_file()
    assert sorted(p.name for p in result.output.iterdir()) == [
        "_SUCCESS",
        "part-00000.jsonl",
        "part-00001.jsonl",
        "part-00002.jsonl",
    ]


def test_demo_rejects_zero_items_as_usage_error() -> None:
    result = CliRunner().invoke(app, ["demo", "--items", "0"])
    assert result.exit_code == 2
    assert "--items" in result.output


def test_demo_with_only_the_map_step(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paralela",
            "demo",
            "--items",
            "8",
            "--trials",
            "0",
            "--folds",
            "0",
            "--ranks",
            "0",
            "--images",
            "0",
            "--requests",
            "0",
        ],
        cwd=tmp_path,  # the default demo directory: paralela-runs/demo-<time> here
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Results equal: yes" in proc.stdout
    assert "Hyperparameter sweep" not in proc.stdout
    assert "Model comparison" not in proc.stdout
    assert "Data-parallel training" not in proc.stdout
    assert "Batch prediction" not in proc.stdout
    assert "Serving" not in proc.stdout
    sections = report_sections(proc.stdout)
    assert [s["kind"] for s in sections] == ["map"]
    (demo_dir,) = (tmp_path / "paralela-runs").glob("demo-*")
    assert sections[0]["path"] == str(demo_dir.resolve() / "map")


def test_demo_refuses_a_run_dir_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("an earlier run")
    result = CliRunner().invoke(app, ["demo", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not empty" in result.output


def test_run_serve_demo_answers_like_the_model_and_stops_cleanly(tmp_path: Path) -> None:
    result = run_serve_demo(requests=60, clients=8, run_dir=tmp_path)
    assert result.agree == 60
    assert result.exit_code == 0
    assert result.url.startswith("http://127.0.0.1:")
    assert result.mean_batch >= 1.0
    assert (tmp_path / "digits-mlp.pt").is_file()  # trained there, as none was given
