"""`paralela report`: the run kinds, the numbers the page embeds, the CLI, the errors.

The map runs here are real (``paralela.map`` with a ``run_dir``, on threads: fast); the
sweep, launch and scaling records are written as their writers write them, with known
times, so that every number on the page can be checked. The page in a real browser is
``test_reporting_browser.py``.
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import paralela
from paralela.cli import app
from paralela.errors import ConfigError
from paralela.reporting import REPORT_FILE, find_runs, write_report
from paralela.reporting._html import DATA_ID
from paralela.reporting._timeline import Bar, Timeline, mark_stragglers

T0 = 1_800_000_000.0  # the synthetic records' epoch seconds


# -- run directories, as their writers leave them -------------------------------------


def _work(x: int) -> int:
    time.sleep(0.002)  # the work: long enough that chunks have measurable lengths
    return x * x


def write_map_run(directory: Path, items: int = 40) -> dict[str, Any]:
    """A real map with a run store; returns its summary.json."""
    results = paralela.map(
        _work,
        range(items),
        backend="threads",
        workers=2,
        chunksize=4,
        run_dir=directory,
        progress=False,
    )
    assert results == [x * x for x in range(items)]
    summary: dict[str, Any] = json.loads((directory / "summary.json").read_text())
    return summary


def _png(width_in: float = 2.0, height_in: float = 1.5) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=50)
    FigureCanvasAgg(fig)
    fig.add_subplot().plot([0, 1, 2], [2.3, 0.4, 0.1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _trial(
    number: int, state: str, value: float | None, slot: int | None, start: float, end: float
) -> dict[str, Any]:
    return {
        "number": number,
        "state": state,
        "values": None if value is None else [value],
        "params": {"lr": 0.01 * (number + 1), "hidden": 16 * (number + 1)},
        "started": T0 + start,
        "finished": T0 + end,
        "slot": slot,
        "devices": "",
        "exit_code": None,
        "log_path": f"/runs/sweep/trials/trial-{number:05d}.log",
        "error": "Traceback ...\nValueError: diverged" if state == "FAIL" else None,
        "intermediate": {},
        "value": value,
        "duration": end - start,
    }


SWEEP_TRIALS = [
    # number, state, value, slot, start, end   (2 slots, a 10 s sweep)
    _trial(0, "COMPLETE", 0.30, 0, 1.0, 4.0),
    _trial(1, "COMPLETE", 0.10, 1, 1.5, 5.0),
    _trial(2, "PRUNED", 1.50, 0, 4.5, 5.5),
    _trial(3, "FAIL", None, 1, 5.2, 6.0),
    _trial(4, "COMPLETE", 0.20, 0, 6.0, 9.5),
    _trial(5, "COMPLETE", float("nan"), 1, 6.5, 9.0),  # diverged: NaN loss
]


def write_sweep_run(directory: Path) -> None:
    (directory / "plots").mkdir(parents=True)
    (directory / "plots" / "optimization_history.png").write_bytes(_png())
    best = SWEEP_TRIALS[1]
    data = {
        "study_name": "digits </script> study",  # must not end the page's JSON early
        "storage": f"sqlite:///{directory}/study.db",
        "directions": ["minimize"],
        "best": best,
        "wall_seconds": 10.0,
        "slots": 2,
        "busy_fraction": 0.8,
        "notes": ["a note from the sweep"],
        "trials": SWEEP_TRIALS,
    }
    # The sweep writes NaN as JSON's NaN (Python's json does): the report must cope.
    (directory / "trials.json").write_text(json.dumps(data, indent=2))


def write_launch_run(directory: Path) -> None:
    """Attempt 1: rank 1 dies (exit 1) and rank 0 is stopped; attempt 2 succeeds."""

    def rank(r: int, start: float, end: float, code: int) -> dict[str, Any]:
        return {
            "rank": r,
            "local_rank": r,
            "host": "node1",
            "pid": 1000 + r,
            "start": T0 + start,
            "end": T0 + end,
            "returncode": code,
            "log": str(directory / f"rank-{r}.log"),
        }

    directory.mkdir(parents=True)
    record = {
        "argv": ["/usr/bin/python3", "train.py", "--epochs", "3"],
        "world_size": 2,
        "nnodes": 1,
        "master": "127.0.0.1:29500",
        "attempts": [
            [rank(0, 0.0, 2.1, -15), rank(1, 0.1, 2.0, 1)],
            [rank(0, 3.0, 9.0, 0), rank(1, 3.1, 10.0, 0)],
        ],
    }
    (directory / "launch.json").write_text(json.dumps(record, indent=2))


def scaling_record(map_run: str | None = None) -> dict[str, Any]:
    """A scaling.json (format 1, docs/scaling.md) of work with serial fraction 0.1."""
    s, t1 = 0.1, 4.0
    points = []
    for n in (1, 2, 4):
        t = t1 * (s + (1 - s) / n)
        points.append(
            {
                "workers": n,
                "scale": 1.0,
                "times": [t * 0.99, t, t * 1.01],
                "median": t,
                "min": t * 0.99,
                "max": t * 1.01,
                "speedup": t1 / t,
                "efficiency": t1 / t / n,
                "predicted_speedup": t1 / t,
                "karp_flatt": None if n == 1 else s,
                "oversubscribed": False,
                "in_fit": True,
                "reference_times": [],
            }
        )
    return {
        "format": 1,
        "kind": "scaling",
        "mode": "strong",
        "target": "mywork:run",
        "target_kind": "function",
        "command": None,
        "created": "2026-11-21T13:30:43+0000",
        "duration_seconds": 30.0,
        "baseline_workers": 1,
        "repeats": 3,
        "warmup": 0,
        "machine": {"host": "vm", "usable_cpus": 4, "logical_cpus": 4, "cpu_model": "Test CPU"},
        "points": points,
        "fit": {
            "model": "amdahl",
            "serial_fraction": s,
            "stderr": 0.004,
            "ci_low": 0.092,
            "ci_high": 0.108,
            "confidence": 0.95,
            "t1_seconds": t1,
            "r_squared": 0.999,
            "n_points": 9,
            "n_counts": 3,
            "dof": 7,
            "residuals": [{"workers": n, "relative": 0.0} for n in (1, 2, 4)],
            "method": "weighted least squares",
            "reference": None,
            "baseline_workers": 1,
            "max_speedup": 10.0,
            "caveats": [],
        },
        "predictions": [
            {
                "workers": 16,
                "amdahl": 6.4,
                "amdahl_low": 6.2,
                "amdahl_high": 6.6,
                "gustafson": 14.5,
                "gustafson_low": 14.4,
                "gustafson_high": 14.6,
            }
        ],
        "caveats": [{"code": "too_few_points", "message": "Only 3 worker counts measured."}],
        "runs": [
            {
                "workers": 4,
                "repeat": 3,
                "seconds": 1.3,
                "scale": 1.0,
                "reference": False,
                "run_dir": map_run,
                "map_seconds": 1.2,
            }
        ],
    }


def write_scale_run(directory: Path, with_map: bool = True) -> None:
    directory.mkdir(parents=True)
    map_run = None
    if with_map:
        write_map_run(directory / "runs" / "w4-r3")
        map_run = "runs/w4-r3"
    (directory / "scaling.json").write_text(json.dumps(scaling_record(map_run), indent=2))


def make_collection(root: Path) -> Path:
    """A directory like ``paralela demo``'s: one run of every kind below it."""
    write_map_run(root / "map")
    write_sweep_run(root / "sweep")
    write_launch_run(root / "launch")
    write_scale_run(root / "scale", with_map=False)
    return root


def embedded(page: Path) -> dict[str, Any]:
    """The numbers the page embeds (its JSON script element), parsed."""
    text = page.read_text()
    match = re.search(
        rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', text, re.DOTALL
    )
    assert match is not None, "the page has no embedded data"
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# -- the timeline's numbers are the run store's -----------------------------------------


def test_map_timeline_matches_the_run_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = write_map_run(run)
    written = write_report(run)
    assert written.path == run.resolve() / REPORT_FILE
    data = embedded(written.path)
    (section,) = data["sections"]
    assert section["kind"] == "map"
    assert section["title"] == "Map: _work"
    tl = section["timeline"]

    def key(c: dict[str, Any]) -> tuple[Any, ...]:
        return (c["worker"], c["start"], c["n_items"], c["started"], c["finished"])

    stored = sorted(key(c) for c in summary["timeline"])
    drawn = sorted(
        (b["lane"], int(b["label"].split("-")[0]), b["size"], b["start"], b["end"])
        for b in tl["bars"]
    )
    assert drawn == stored  # every chunk, exactly where and when the store says
    assert sorted(tl["lanes"]) == sorted(w["worker"] for w in summary["workers"])
    assert sum(b["size"] for b in tl["bars"]) == summary["computed_items"] == 40
    # The window is the map's wall time, ending at the last chunk's end.
    assert tl["end"] == max(c["finished"] for c in summary["timeline"])
    # (epoch seconds hold about 0.2 us of precision: compare to 1 us)
    assert tl["window"] == pytest.approx(summary["wall_seconds"], abs=1e-6)
    # Busy time and busy fraction per worker: the store's own numbers.
    stats = {s["lane"]: s for s in tl["lane_stats"]}
    for worker in summary["workers"]:
        mine = stats[worker["worker"]]
        assert mine["bars"] == worker["chunks"]
        assert mine["items"] == worker["items"]
        assert mine["busy"] == pytest.approx(worker["busy_seconds"], abs=1e-6)
        assert mine["busy_fraction"] == pytest.approx(worker["busy_fraction"], abs=1e-4)
        parts = mine["busy"] + mine["startup"] + mine["between"] + mine["waiting"]
        assert parts == pytest.approx(mine["window"], abs=1e-6)
    overhead = tl["overhead"]
    assert overhead["busy"] == pytest.approx(
        sum(w["busy_seconds"] for w in summary["workers"]), abs=1e-5
    )
    assert overhead["total"] == pytest.approx(
        len(summary["workers"]) * summary["wall_seconds"], abs=1e-5
    )
    # The page says how each part is computed.
    html = written.path.read_text()
    for label in ("compute", "start-up", "scheduling + serialization", "waiting at the end"):
        assert label in html
    assert "how it is computed" in html


def test_charts_are_written_next_to_the_page_and_embedded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_map_run(run)
    written = write_report(run)
    names = sorted(p.name for p in written.images)
    assert names == ["report-map-breakdown.png", "report-map-timeline.png"]
    html = written.path.read_text()
    for image in written.images:
        assert image.parent == written.path.parent
        data = image.read_bytes()
        width, height = png_size(data)
        assert 600 <= width <= 1200, (image.name, width)
        assert 150 <= height <= 2500, (image.name, height)
        assert base64.b64encode(data).decode() in html  # the same PNG, inline
    # Self-contained: every src and href is inline data or an anchor in the page.
    for ref in re.findall(r"""(?:src|href)=['"]([^'"]*)['"]""", html):
        assert ref.startswith(("data:image/png;base64,", "#")), ref
    assert "Content-Security-Policy" in html
    assert "<link" not in html


# -- each kind of run renders ------------------------------------------------------------


def test_sweep_report_has_the_leaderboard_the_plots_and_trials_per_slot(tmp_path: Path) -> None:
    run = tmp_path / "sweep"
    write_sweep_run(run)
    written = write_report(run)
    data = embedded(written.path)  # parses although a name holds "</script>" and NaN
    (section,) = data["sections"]
    assert section["kind"] == "sweep"
    tl = section["timeline"]
    assert tl["lanes"] == ["slot 0", "slot 1"]
    states = {b["label"]: b["state"] for b in tl["bars"]}
    assert states == {
        "#0": "ok",
        "#1": "ok",
        "#2": "pruned",
        "#3": "failed",
        "#4": "ok",
        "#5": "ok",
    }
    assert tl["window"] == pytest.approx(10.0)  # the sweep's wall time
    slot0 = next(s for s in tl["lane_stats"] if s["lane"] == "slot 0")
    assert slot0["busy"] == pytest.approx(3.0 + 1.0 + 3.5)
    # The window ends with the last trial (9.5 s) and starts the wall time (10 s) before.
    assert slot0["startup"] == pytest.approx(1.0 + 0.5)
    assert slot0["between"] == pytest.approx(0.5 + 0.5)
    html = written.path.read_text()
    # Leaderboard: completed trials with a finite value, lowest first; NaN left out.
    board = html[html.index("<h3>Leaderboard</h3>") :]
    board = board[: board.index("</table>")]
    assert re.findall(r"<td>#(\d+)</td>", board) == ["1", "4", "0"]
    assert "The 3 best of 3 completed trials" in html
    # The failed trial and its error; the sweep's own plot embedded as it is on disk.
    assert "ValueError: diverged" in html
    plot = (run / "plots" / "optimization_history.png").read_bytes()
    assert base64.b64encode(plot).decode() in html
    assert section["images"] == [str(run / "plots" / "optimization_history.png")]
    assert "digits &lt;/script&gt; study" in html
    assert "a note from the sweep" in html


def test_launch_report_shows_each_rank_and_attempt(tmp_path: Path) -> None:
    run = tmp_path / "launch"
    write_launch_run(run)
    section = embedded(write_report(run).path)["sections"][0]
    assert section["kind"] == "launch"
    assert section["title"] == "Launch: train.py"
    tl = section["timeline"]
    assert tl["lanes"] == ["rank 0", "rank 1"]
    assert tl["start"] == T0
    assert tl["end"] == T0 + 10.0
    states = sorted((b["lane"], b["label"], b["state"]) for b in tl["bars"])
    assert states == [
        ("rank 0", "attempt 1: killed by SIGTERM", "stopped"),
        ("rank 0", "attempt 2: exit code 0", "ok"),
        ("rank 1", "attempt 1: exit code 1", "failed"),  # it died first: the culprit
        ("rank 1", "attempt 2: exit code 0", "ok"),
    ]
    stats = {s["lane"]: s for s in tl["lane_stats"]}
    assert stats["rank 0"]["busy"] == pytest.approx(2.1 + 6.0)
    assert stats["rank 0"]["between"] == pytest.approx(3.0 - 2.1)  # the restart
    assert stats["rank 0"]["waiting"] == pytest.approx(1.0)  # rank 1 ended 1 s later
    assert stats["rank 1"]["startup"] == pytest.approx(0.1)
    assert section["facts"]["attempts"] == "2 (1 restart(s))"


def test_scale_report_has_the_fit_the_curve_and_a_map_timeline(tmp_path: Path) -> None:
    run = tmp_path / "scale"
    write_scale_run(run)
    written = write_report(run)
    section = embedded(written.path)["sections"][0]
    assert section["kind"] == "scale"
    assert section["data"]["scaling"]["fit"]["serial_fraction"] == 0.1
    assert section["facts"]["serial fraction"].startswith("s = 0.1000 ± 0.0040")
    # The timeline of the map the measurement kept, read from its own run store.
    inner = json.loads((run / "runs" / "w4-r3" / "summary.json").read_text())
    assert len(section["timeline"]["bars"]) == len(inner["timeline"])
    assert sorted(p.name for p in written.images) == [
        "report-scale-breakdown.png",
        "report-scale-scaling.png",
        "report-scale-timeline.png",
    ]
    html = written.path.read_text()
    assert "Predicted at larger counts" in html
    assert "Warning: Only 3 worker counts measured." in html


def test_scale_report_of_a_result_saved_by_paralela_scaling(tmp_path: Path) -> None:
    from paralela.scaling import analyse

    times = {n: [4.0 * (0.2 + 0.8 / n) * f for f in (0.99, 1.0, 1.01)] for n in (1, 2, 4)}
    analyse(times, target="synthetic:work").save(tmp_path / "scale", plot=False)
    section = embedded(write_report(tmp_path / "scale").path)["sections"][0]
    assert section["title"] == "Scaling (strong): synthetic:work"
    fit = section["data"]["scaling"]["fit"]
    assert fit["serial_fraction"] == pytest.approx(0.2, abs=0.01)


def test_a_directory_of_runs_gives_one_page_with_a_section_each(tmp_path: Path) -> None:
    root = make_collection(tmp_path / "demo")
    written = write_report(root)
    assert written.path == root.resolve() / REPORT_FILE
    data = embedded(written.path)
    assert [s["kind"] for s in data["sections"]] == ["map", "sweep", "launch", "scale"]
    assert [Path(s["path"]).name for s in data["sections"]] == ["map", "sweep", "launch", "scale"]
    charts = [
        f"report-{k}-{c}.png" for k in ("map", "sweep", "launch") for c in ("timeline", "breakdown")
    ]
    assert sorted(p.name for p in written.images) == sorted([*charts, "report-scale-scaling.png"])
    html = written.path.read_text()
    for section in data["sections"]:
        assert f"href='#{section['anchor']}'" in html
        assert f"id='{section['anchor']}'" in html


def test_find_runs_does_not_descend_into_runs(tmp_path: Path) -> None:
    write_sweep_run(tmp_path / "a" / "sweep")
    write_launch_run(tmp_path / "a" / "sweep" / "trials" / "launch")  # inside a run
    (tmp_path / "b" / "c").mkdir(parents=True)
    runs = find_runs(tmp_path)
    assert [(r.kind, r.path) for r in runs] == [("sweep", tmp_path / "a" / "sweep")]


# -- the command line --------------------------------------------------------------------


def test_cli_writes_the_page_and_open_prints_a_file_url(tmp_path: Path) -> None:
    run = tmp_path / "launch"
    write_launch_run(run)
    result = CliRunner().invoke(app, ["report", str(run), "--open"])
    assert result.exit_code == 0, result.output
    url = result.stdout.strip().splitlines()[-1]
    assert url == (run.resolve() / REPORT_FILE).as_uri()
    assert url.startswith("file:///")
    assert (run / REPORT_FILE).is_file()
    assert "1 run(s): launch" in result.stderr
    plain = CliRunner().invoke(app, ["report", str(run)])
    assert plain.exit_code == 0
    assert plain.stdout.strip() == str(run.resolve() / REPORT_FILE)


def test_cli_out_puts_the_page_and_its_charts_elsewhere(tmp_path: Path) -> None:
    run = tmp_path / "launch"
    write_launch_run(run)
    out = tmp_path / "reports" / "launch.html"
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "launch.html",
        "report-launch-breakdown.png",
        "report-launch-timeline.png",
    ]
    assert not (run / REPORT_FILE).exists()
    into = tmp_path / "into"
    into.mkdir()
    assert write_report(run, into).path == into / REPORT_FILE  # a directory: report.html
    bad = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "x.txt")])
    assert bad.exit_code == 2
    assert "ending in .html" in bad.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "is not a paralela run directory"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file, not a run"),
    ],
    ids=["missing", "unknown", "a-file"],
)
def test_cli_a_missing_or_unknown_run_dir_exits_2(tmp_path: Path, make: Any, message: str) -> None:
    (tmp_path / "empty-subdir").mkdir()
    target = make(tmp_path)
    result = CliRunner().invoke(app, ["report", str(target)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ")
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_cli_a_corrupt_record_exits_2_and_names_the_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{not json")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2
    assert str(run / "summary.json") in result.stderr
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "trials.json").write_text("[]")
    with pytest.raises(ConfigError, match="has no trial list"):
        write_report(tmp_path / "sw")
    write_launch_run(tmp_path / "la")
    record = json.loads((tmp_path / "la" / "launch.json").read_text())
    del record["attempts"][0][0]["rank"]
    (tmp_path / "la" / "launch.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"launch record in .*la is incomplete .*KeyError"):
        write_report(tmp_path / "la")


def test_without_matplotlib_the_page_has_the_tables_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paralela.reporting import _charts

    def missing() -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(_charts, "load_matplotlib", missing)
    run = tmp_path / "launch"
    write_launch_run(run)
    written = write_report(run)
    assert written.images == []
    assert len(written.problems) == 1
    assert "pip install 'paralela[sweep]'" in written.problems[0]
    html = written.path.read_text()
    assert "<img" not in html
    assert "Busy fraction per rank" in html
    assert "pip install &#x27;paralela[sweep]&#x27;" in html


# -- the timeline's arithmetic -----------------------------------------------------------


def test_lane_stats_split_the_window_into_four_parts() -> None:
    tl = Timeline(
        lanes=["a", "b", "idle"],
        bars=[
            Bar("a", 1.0, 3.0, "x"),
            Bar("a", 2.5, 4.0, "overlaps"),  # threads may overlap: busy is the union
            Bar("a", 5.0, 6.0, "y"),
            Bar("b", 0.0, 10.0, "z"),
        ],
        start=0.0,
        end=10.0,
        unit="chunk",
        lane_unit="worker",
        window_note="",
    )
    a, b, idle = tl.lane_stats()
    assert (a.busy, a.startup, a.between, a.waiting) == (4.0, 1.0, 1.0, 4.0)
    assert a.busy_fraction == 0.4
    assert (b.busy, b.startup, b.between, b.waiting) == (10.0, 0.0, 0.0, 0.0)
    assert (idle.busy, idle.startup, idle.busy_fraction) == (0.0, 10.0, 0.0)
    total = tl.overhead()
    assert (total.total, total.busy) == (30.0, 14.0)
    assert total.share(total.busy) == pytest.approx(14 / 30)


def test_stragglers_are_marked_against_the_median() -> None:
    bars = [Bar("w", 0.0, d, str(i), size=2) for i, d in enumerate([1.0, 1.1, 0.9, 1.0, 5.0])]
    marked, rule = mark_stragglers(bars, lambda b: b.duration / b.size, 2.0)
    assert [b.state for b in marked] == ["ok", "ok", "ok", "ok", "straggler"]
    assert "2x the median" in rule
    few, why = mark_stragglers(bars[:3], lambda b: b.duration, 2.0)
    assert few == bars[:3]
    assert "not judged" in why


def test_the_embedded_json_is_strict_json(tmp_path: Path) -> None:
    """JSON.parse in a browser rejects NaN and Infinity, which Python's json writes."""
    run = tmp_path / "sweep"
    write_sweep_run(run)
    record = json.loads((run / "trials.json").read_text())
    record["busy_fraction"] = float("nan")
    (run / "trials.json").write_text(json.dumps(record))
    page = write_report(run).path
    payload = page.read_text().split(f'id="{DATA_ID}">', 1)[1].split("</script>", 1)[0]
    data = json.loads(payload, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert data["sections"][0]["data"]["busy_fraction"] is None
    assert "</" not in payload  # escaped, so that the script element ends where it should


def test_workers_of_several_hosts_are_told_apart(tmp_path: Path) -> None:
    """Two hosts may reuse a pid: a Slurm map's workers are named by host and pid."""
    run = tmp_path / "map"
    run.mkdir()
    chunks = [
        {
            "start": i,
            "n_items": 1,
            "started": T0 + i,
            "finished": T0 + i + 0.9,
            "worker": "100",
            "host": host,
            "attempt": 1,
        }
        for i, host in enumerate(["node1", "node2", "node1", "node2"])
    ]
    summary = {
        "items": 4,
        "computed_items": 4,
        "chunks": 4,
        "wall_seconds": 4.0,
        "workers": [],
        "timeline": chunks,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    tl = embedded(write_report(run).path)["sections"][0]["timeline"]
    assert tl["lanes"] == ["node1:100", "node2:100"]
    assert [s["bars"] for s in tl["lane_stats"]] == [2, 2]


def test_a_multi_node_launch_is_read_from_every_node_record(tmp_path: Path) -> None:
    run = tmp_path / "launch"
    run.mkdir()
    for node in (0, 1):
        ranks = [
            {
                "rank": 2 * node + r,
                "local_rank": r,
                "host": f"node{node}",
                "pid": 10 + r,
                "start": T0 + node,
                "end": T0 + 5 + r,
                "returncode": 0,
                "log": "-",
            }
            for r in (0, 1)
        ]
        record = {
            "argv": ["train.py"],
            "world_size": 4,
            "nnodes": 2,
            "master": "node0:29500",
            "attempts": [ranks],
        }
        (run / f"launch-node{node}.json").write_text(json.dumps(record))
    section = embedded(write_report(run).path)["sections"][0]
    tl = section["timeline"]
    assert tl["lanes"] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert tl["lane_notes"] == {
        "rank 0": "node0",
        "rank 1": "node0",
        "rank 2": "node1",
        "rank 3": "node1",
    }
    assert section["facts"]["nodes"] == "2 (node0, node1)"


@pytest.mark.parametrize(
    ("computed", "says"),
    [(0, "every item was resumed"), (5, "PARALELA_RECORD_TIMINGS=0")],
    ids=["all-resumed", "not-recorded"],
)
def test_a_map_without_timings_says_why_there_is_no_timeline(
    tmp_path: Path, computed: int, says: str
) -> None:
    run = tmp_path / "map"
    run.mkdir()
    summary = {
        "items": 5,
        "computed_items": computed,
        "resumed_items": 5 - computed,
        "chunks": 1,
        "wall_seconds": 0.1,
        "workers": [],
        "timeline": [],
    }
    (run / "summary.json").write_text(json.dumps(summary))
    written = write_report(run)
    assert written.images == []
    assert embedded(written.path)["sections"][0]["timeline"] is None
    assert says in written.path.read_text()


def test_embedded_json_escapes_markup_characters(tmp_path: Path) -> None:
    run = tmp_path / "sweep"
    write_sweep_run(run)
    stored = json.loads((run / "trials.json").read_text())
    name = "</script><!--<script> & \u2028\u2029 >"
    stored["study_name"] = name
    (run / "trials.json").write_text(json.dumps(stored))
    page = write_report(run).path
    text = page.read_text()
    match = re.search(
        rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', text, re.DOTALL
    )
    assert match is not None
    raw = match.group(1)
    for char in ("<", ">", "&", "\u2028", "\u2029"):
        assert char not in raw, f"{char!r} left raw in the page's JSON"
    assert name in json.dumps(json.loads(raw), ensure_ascii=False)
