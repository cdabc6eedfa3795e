"""``paralela.scaling.measure`` and ``paralela scale`` on real runs.

The workloads sleep: a serial sleep, then a map of sleeping items over N workers. Sleep
does not need a CPU, so the known serial fraction shows at any count, even above the
machine's CPUs (hence ``oversubscribe=True``), and the tests do not load the machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import paralela
from paralela.backends import _shared
from paralela.errors import ConfigError
from paralela.mapping._summary import record_timings
from paralela.resources import detect
from paralela.scaling import ScalingError, load_scaling, measure
from paralela.scaling._command import CommandTarget

SERIAL = 0.08  # seconds
ITEM = 0.02  # seconds per item
ITEMS = 16  # 16 x 20 ms = 0.32 s of parallel work: s = 0.08 / 0.40 = 0.2
KNOWN_S = SERIAL / (SERIAL + ITEMS * ITEM)


def nap(x: int) -> int:
    time.sleep(ITEM)
    return x


def serial_then_parallel(workers: int) -> None:
    time.sleep(SERIAL)
    paralela.map(nap, range(ITEMS), workers=workers, chunksize=1)


def weak_work(workers: int, scale: int) -> None:
    """Gustafson's model: a fixed serial part, ``4 * scale`` items over the workers."""
    time.sleep(SERIAL)
    paralela.map(nap, range(4 * scale), workers=workers, backend="threads", chunksize=1)


def fails_at_two(workers: int) -> None:
    if workers == 2:
        raise RuntimeError("no luck with two")


def quick(workers: int) -> None:
    time.sleep(0.01 + 0.03 / workers)


# -- a real run -------------------------------------------------------------------------


def test_measure_recovers_the_serial_fraction_of_a_real_run(tmp_path: Path) -> None:
    lines: list[str] = []
    result = measure(
        serial_then_parallel,
        [1, 2, 4, 8],
        repeats=3,
        oversubscribe=True,
        run_dir=tmp_path / "scale",
        log=lines.append,
    )
    fit = result.fit
    assert fit is not None
    assert fit.model == "amdahl"
    # The map's own overhead (submission, results) adds a little serial time.
    assert fit.serial_fraction == pytest.approx(KNOWN_S, abs=0.05)
    assert fit.stderr is not None
    assert fit.stderr < 0.03
    assert [p.workers for p in result.points] == [1, 2, 4, 8]
    assert result.points[-1].speedup > 2.2  # 8 workers on sleeps: past the 2 CPUs here
    assert result.target == f"{__name__}:serial_then_parallel"
    assert result.target_kind == "function"
    assert len([r for r in result.runs if r.repeat == 0]) == 4  # a warm-up per count
    assert len(result.runs) == 16
    assert any(line.startswith("workers=8 repetition 3/3: ") for line in lines)
    saved = load_scaling(tmp_path / "scale")
    assert saved.to_dict() == result.to_dict()
    assert saved.machine["usable_cpus"] == detect().cpus.usable
    assert (tmp_path / "scale" / "scaling.png").stat().st_size > 10_000
    # The pools the counts started were stopped with them.
    assert not [key for key in _shared if key[1] in (4, 8)]


def test_weak_scaling_of_a_real_run_measures_gustafsons_fraction() -> None:
    result = measure(weak_work, [1, 2, 4], repeats=2, weak=True, warmup=0, oversubscribe=True)
    fit = result.fit
    assert fit is not None
    assert fit.model == "gustafson"
    assert fit.reference == "measured"
    # Serial 0.08 s, parallel 4 x 0.02 s per worker at every count: s = 0.5.
    assert fit.serial_fraction == pytest.approx(0.5, abs=0.1)
    assert [p.scale for p in result.points] == [1, 2, 4]
    references = [r for r in result.runs if r.reference]
    assert {(r.workers, r.scale) for r in references} == {(1, 2), (1, 4)}
    assert result.points[-1].reference_times


def test_counts_above_the_cpus_are_warned_about_before_running() -> None:
    usable = detect().cpus.usable
    lines: list[str] = []
    counts = [1, 2, usable + 1, usable + 2] if usable >= 2 else [1, 2, 3]
    result = measure(quick, counts, repeats=1, warmup=0, log=lines.append)
    expected = f"This machine has {usable} usable CPU"
    assert lines[0].startswith(f"Warning: {expected}")
    assert lines[1].startswith("workers=1 ")  # the warning came first
    caveat = next(c for c in result.caveats if c.code == "oversubscribed")
    assert caveat.message.startswith(expected)
    over = [p.workers for p in result.points if p.oversubscribed]
    assert over == [n for n in counts if n > usable]
    if usable >= 2:
        assert [p.workers for p in result.points if p.in_fit] == [1, 2]


def test_a_failing_target_names_the_count_and_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ScalingError, match=r"raised RuntimeError at workers=2 warm-up") as info:
        measure(fails_at_two, [1, 2], repeats=1)
    assert isinstance(info.value.__cause__, RuntimeError)
    [kept] = tmp_path.glob("paralela-scale-*")
    assert getattr(info.value, "__notes__", None) == [
        f"The logs and run directories are kept in {kept}; delete it when done."
    ]


def test_bad_arguments_are_refused_before_running() -> None:
    with pytest.raises(ConfigError, match="two worker counts"):
        measure(quick, [4, 4])
    with pytest.raises(ConfigError, match="repeats"):
        measure(quick, [1, 2], repeats=0)
    with pytest.raises(ConfigError, match="timer='map'"):
        measure(quick, [1, 2], timer="map")
    with pytest.raises(ConfigError, match="Cannot import"):
        measure("no_such_module_here:f", [1, 2])
    with pytest.raises(ConfigError, match="put \\{workers\\}"):
        measure([sys.executable, "-c", "pass"], [1, 2])
    with pytest.raises(ConfigError, match="put \\{scale\\}"):
        measure([sys.executable, "-c", "pass", "{workers}"], [1, 2], weak=True)


# -- commands ---------------------------------------------------------------------------


def test_a_command_takes_the_count_where_it_says(tmp_path: Path) -> None:
    script = "import sys, time; time.sleep(0.05 + 0.2 / int(sys.argv[1]))"
    result = measure(
        [sys.executable, "-c", script, "{workers}"],
        [1, 2, 4],
        repeats=2,
        warmup=0,
        oversubscribe=True,
        run_dir=tmp_path,
    )
    assert result.target_kind == "command"
    assert result.command == [sys.executable, "-c", script, "{workers}"]
    log = (tmp_path / "logs" / "w4-r2.log").read_text()
    assert log.splitlines()[0].endswith(" 4")
    assert result.points[-1].median < result.points[0].median


def test_a_command_that_fails_or_hangs_stops_the_measurement(tmp_path: Path) -> None:
    failing = [sys.executable, "-c", "import sys; print('bad input'); sys.exit(3)", "{workers}"]
    with pytest.raises(ScalingError, match="exited with code 3") as info:
        measure(failing, [1, 2], repeats=1, run_dir=tmp_path / "a")
    assert "bad input" in str(info.value)
    hanging = [sys.executable, "-c", "import time; time.sleep(30)", "{workers}"]
    t0 = time.monotonic()
    with pytest.raises(ScalingError, match=r"did not finish within 0\.5 s"):
        measure(hanging, [1, 2], repeats=1, timeout=0.5, run_dir=tmp_path / "b")
    assert time.monotonic() - t0 < 10


def test_paralela_commands_get_workers_and_a_fresh_run_dir() -> None:
    target = CommandTarget(
        ["paralela", "map", "f:g", "-i", "x.jsonl", "--run-dir", "old"], weak=False
    )
    args, has_run_dir = target.build(4, 1.0, Path("/w/runs/w4-r1"))
    assert args[:6] == [sys.executable, "-m", "paralela", "map", "--workers", "4"]
    assert args[6:] == ["f:g", "-i", "x.jsonl", "--run-dir", "/w/runs/w4-r1"]
    assert has_run_dir
    replaced = CommandTarget(["paralela", "map", "f:g", "-w", "2", "--run-dir=a"], False)
    assert replaced.build(8, 1.0, Path("b"))[0][3:] == ["map", "f:g", "-w", "8", "--run-dir=b"]
    equals = CommandTarget([sys.executable, "-m", "paralela", "sweep", "--workers=1"], False)
    assert equals.build(3, 1.0, None)[0][-1] == "--workers=3"
    # Options after '--' belong to the trial command, not to paralela.
    trial = CommandTarget(["paralela", "sweep", "-s", "s.yaml", "--", "train", "-w", "1"], False)
    args = trial.build(2, 1.0, None)[0]
    assert args[3:6] == ["sweep", "--workers", "2"]
    assert args[-3:] == ["train", "-w", "1"]
    weak = CommandTarget(["prog", "--procs", "{workers}", "--n", "{scale}000"], True)
    assert weak.build(4, 2.0, None) == (["prog", "--procs", "4", "--n", "2000"], False)


# -- the command line -------------------------------------------------------------------

WORK = f"""
import time
import paralela

def nap(x):
    time.sleep({ITEM})
    return x

def work(workers):
    time.sleep({SERIAL})
    paralela.map(nap, range({ITEMS}), workers=workers, chunksize=1)
"""


def scale(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paralela", "scale", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=100,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "work.py").write_text(WORK)
    (tmp_path / "items.jsonl").write_text("".join(f"{i}\n" for i in range(ITEMS)))
    return tmp_path


def test_cli_measures_a_function_and_prints_the_table(workdir: Path) -> None:
    done = scale(workdir, "--workers", "1,2,4", "--repeats", "2", "--oversubscribe", "work:work")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Strong scaling of work:work (2 runs per count)" in out
    for header in ("workers", "median s", "speed-up", "efficiency", "Amdahl fit"):
        assert header in out
    assert "Serial fraction s = " in out
    assert "Predicted speed-up: 8: " in out
    assert "repetition 2/2" in done.stderr


def test_cli_measures_a_paralela_map_command_as_json(workdir: Path) -> None:
    done = scale(
        workdir,
        "--workers", "1,2", "--repeats", "2", "--warmup", "0", "--timer", "map",
        "--json", "--run-dir", "out", "--",
        "paralela", "map", "work:nap", "-i", "items.jsonl", "-o", "res.jsonl",
        "--run-dir", "ignored",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["target_kind"] == "command"
    assert data["timer"] == "map"
    assert [p["workers"] for p in data["points"]] == [1, 2]
    runs = data["runs"]
    assert [r["run_dir"] for r in runs] == ["runs/w1-r1", "runs/w1-r2", "runs/w2-r1", "runs/w2-r2"]
    assert all(r["map_seconds"] < r["seconds"] for r in runs)  # start-up left out
    assert data["points"][0]["times"] == [runs[0]["map_seconds"], runs[1]["map_seconds"]]
    # 16 items of 20 ms: at least 0.32 s on one worker, about half of it on two.
    assert data["points"][0]["median"] >= ITEMS * ITEM
    assert data["points"][1]["median"] < data["points"][0]["median"]
    summary = json.loads((workdir / "out" / "runs" / "w2-r1" / "summary.json").read_text())
    assert len(summary["workers"]) == 2
    assert not (workdir / "ignored").exists()
    assert (workdir / "out" / "scaling.json").is_file()
    assert "--workers 2" in (workdir / "out" / "logs" / "w2-r1.log").read_text()


def test_cli_exit_codes(workdir: Path) -> None:
    bad_counts = scale(workdir, "--workers", "1,x", "work:work")
    assert bad_counts.returncode == 2
    assert "--workers takes two or more positive counts" in bad_counts.stderr
    nothing = scale(workdir, "--workers", "1,2")
    assert nothing.returncode == 2
    assert "Give the work to measure" in nothing.stderr
    no_place = scale(workdir, "--workers", "1,2", "--", sys.executable, "-c", "pass")
    assert no_place.returncode == 2
    assert "{workers}" in no_place.stderr
    failing = scale(
        workdir, "--workers", "1,2", "--repeats", "1", "--",
        "paralela", "map", "work:missing", "-i", "items.jsonl", "-o", "r.jsonl",
    )  # fmt: skip
    assert failing.returncode == 1
    assert "exited with code 2" in failing.stderr
    assert "has no attribute 'missing'" in failing.stderr


def test_cli_keeps_the_log_of_a_failed_run_where_the_message_points(
    workdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Without --run-dir the logs are in a temporary directory: a failure keeps it."""
    tmp = tmp_path_factory.mktemp("tmpdir")
    failing = subprocess.run(
        [sys.executable, "-m", "paralela", "scale", "--workers", "1,2", "--repeats", "1",
         "--", sys.executable, "-c", "import sys; print('bad input 42'); sys.exit(3)",
         "{workers}"],
        cwd=workdir, capture_output=True, text=True, timeout=100,
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    assert failing.returncode == 1, failing.stderr
    found = re.search(r"Its log \((\S+\.log)\)", failing.stderr)
    assert found, failing.stderr
    log = Path(found.group(1))
    assert log.is_relative_to(tmp)
    assert "bad input 42" in log.read_text()
    assert f"kept in {log.parent.parent}" in failing.stderr


# -- the recording switch of paralela.map ------------------------------------------------


def test_map_records_chunk_timings_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    on = paralela.map(abs, range(100), workers=2, backend="threads", chunksize=10)
    assert len(on.summary.timeline) == 10
    assert on.summary.workers
    monkeypatch.setenv("PARALELA_RECORD_TIMINGS", "0")
    off = paralela.map(abs, range(100), workers=2, backend="threads", chunksize=10)
    assert off == list(range(100))
    assert off.summary.timeline == []
    assert off.summary.workers == []
    assert off.summary.chunks == 10
    monkeypatch.setenv("PARALELA_RECORD_TIMINGS", "maybe")
    with pytest.raises(ConfigError, match="PARALELA_RECORD_TIMINGS='maybe' is not valid"):
        record_timings()
