"""``paralela report`` on a comparison's run directory: leaderboards and the score chart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from paralela.errors import ConfigError
from paralela.reporting import find_runs, write_report
from paralela.reporting._compare import load_compare, scores_png
from paralela.reporting._html import DATA_ID


def candidate(
    number: int,
    family: str,
    params: dict[str, Any],
    scores: list[float | None],
    state: str = "COMPLETE",
    error: str | None = None,
) -> dict[str, Any]:
    done = [s for s in scores if s is not None]
    mean = sum(done) / len(done) if done else None
    std = (sum((s - mean) ** 2 for s in done) / len(done)) ** 0.5 if mean is not None else None
    return {
        "number": number,
        "family": family,
        "params": params,
        "fold_scores": scores,
        "mean": mean,
        "std": std,
        "fit_seconds": 0.01 * (number + 1),
        "state": state,
        "error": error,
    }


def write_compare_run(directory: Path, refit: bool = True) -> dict[str, Any]:
    """A compare.json as paralela.compare writes it (the contract's fields)."""
    candidates = [
        candidate(0, "logreg", {"C": 0.01}, [0.80, 0.82, 0.84]),
        candidate(1, "logreg", {"C": 10.0}, [0.90, 0.92, 0.94]),
        candidate(2, "forest", {"n_estimators": 50, "max_depth": 4}, [0.95, 0.97, 0.96]),
        candidate(
            3, "forest", {"n_estimators": 80, "max_depth": None}, [0.70, None, None], "PRUNED"
        ),
        candidate(
            4,
            "svm",
            {"C": 1.0, "kernel": "rbf"},
            [None, None, None],
            "FAIL",
            "Traceback ...\nValueError: Input contains NaN",
        ),
        candidate(5, "knn", {}, [0.60, 0.62, 0.64]),
    ]
    record = {
        "scoring": "accuracy",
        "greater_is_better": True,
        "cv": 3,
        "candidates": candidates,
        "best": 2,
        "wall_seconds": 4.5,
        "slots": 2,
        "notes": ["a note from the comparison"],
    }
    directory.mkdir(parents=True)
    (directory / "compare.json").write_text(json.dumps(record))
    if refit:
        (directory / "best.pkl").write_bytes(b"pickled")
    return record


def embedded(page: Path) -> dict[str, Any]:
    text = page.read_text()
    match = re.search(
        rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', text, re.DOTALL
    )
    assert match is not None, "the page has no embedded data"
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def table(html: str, title: str) -> str:
    part = html[html.index(f"<h3>{title}</h3>") :]
    return part[: part.index("</table>")]


def test_a_compare_run_is_found_by_its_record(tmp_path: Path) -> None:
    write_compare_run(tmp_path / "runs" / "cmp")
    (run,) = find_runs(tmp_path / "runs")
    assert (run.kind, run.path) == ("compare", tmp_path / "runs" / "cmp")


def test_the_section_has_both_leaderboards_and_the_failures(tmp_path: Path) -> None:
    run = tmp_path / "cmp"
    write_compare_run(run)
    section = load_compare(run)
    facts = dict(section.facts)
    assert facts["scoring"] == "accuracy (higher is better)"
    assert facts["families"] == "logreg, forest, svm, knn"
    assert facts["candidates"] == "4 complete, 1 fail, 1 pruned"
    assert facts["best"] == "#2 forest: 0.96 ± 0.00816"
    assert facts["best model"] == str(run / "best.pkl")
    best_of, board, failed = section.tables
    assert [row[:3] for row in best_of.rows] == [
        ["logreg", "#1", "0.92 ± 0.0163"],
        ["forest", "#2", "0.96 ± 0.00816"],
        ["svm", "#4", "failed"],
        ["knn", "#5", "0.62 ± 0.0163"],
    ]
    assert [row[1] for row in board.rows] == ["#2", "#1", "#0", "#5"]  # complete only
    assert board.rows[0][-1] == '{"max_depth": 4, "n_estimators": 50}'
    assert board.rows[-1][-1] == "(defaults)"
    assert failed.rows == [
        ["#4", "svm", '{"C": 1.0, "kernel": "rbf"}', "ValueError: Input contains NaN"]
    ]
    assert section.source["forest"] == [(0.96, True), (0.70, False)]
    assert section.source["svm"] == []
    assert section.data["families"]["forest"]["best"] == 2
    assert "a note from the comparison" in section.notes


def test_the_page_embeds_the_score_chart(tmp_path: Path) -> None:
    run = tmp_path / "cmp"
    write_compare_run(run, refit=False)
    written = write_report(run)
    assert [p.name for p in written.images] == ["report-compare-scores.png"]
    assert written.images[0].read_bytes().startswith(b"\x89PNG")
    html = written.path.read_text()
    assert "Score distribution per family" in html
    assert re.findall(r"<td>#(\d+)</td>", table(html, "Leaderboard")) == ["2", "1", "0", "5"]
    assert "not refit (refit=False)" in html
    (section,) = embedded(written.path)["sections"]
    assert section["kind"] == "compare"
    assert section["data"]["best"]["family"] == "forest"


def test_a_chart_without_any_score(tmp_path: Path) -> None:
    run = tmp_path / "cmp"
    run.mkdir()
    failed = candidate(0, "svm", {}, [None, None], "FAIL", "boom")
    (run / "compare.json").write_text(
        json.dumps({"scoring": "r2", "cv": 2, "candidates": [failed], "best": None})
    )
    section = load_compare(run)
    assert "best" not in dict(section.facts)
    assert section.tables[1].note == "No candidate ran every fold."
    assert scores_png(section).startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", r"Cannot read .*compare\.json"), ('{"cv": 3}', r"has no candidate list")],
)
def test_a_bad_record_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    run = tmp_path / "cmp"
    run.mkdir()
    (run / "compare.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        write_report(run)
