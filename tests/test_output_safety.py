"""paralela never deletes files it did not write. ``mapreduce`` and ``predict`` refuse an
output directory that holds files of others (Spark's output, say) unless asked to
replace its contents (``mode="overwrite"``, ``--overwrite``), as Spark's default save
mode ``errorifexists`` does; a rerun into paralela's own output replaces only the files
paralela recorded as its own (in the manifest it writes there), whatever their names.
Temp files a killed run left there go with the next run; temp-like names of others stay.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import paralela
from paralela.cli import app
from paralela.errors import ConfigError, RunStoreError, UserFunctionError

UUID = "1b2c3d4e-0000-4f00-8000-000000000000"
# What Spark's DataFrame.write.parquet(dir) leaves (checksums of its Hadoop filesystem too).
SPARK_FILES = {
    "_SUCCESS": b"",
    f"part-00000-{UUID}-c000.snappy.parquet": b"PAR1 Spark's rows PAR1",
    f".part-00000-{UUID}-c000.snappy.parquet.crc": b"crc",
    "._SUCCESS.crc": b"crc",
}


def spark_output(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in SPARK_FILES.items():
        (directory / name).write_bytes(data)
    return contents(directory)


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def words(line: str) -> list[tuple[str, int]]:
    return [(w, 1) for w in line.split()]


def total(key: str, values: Any) -> int:
    return sum(values)


def fails_on_boom(key: str, values: Any) -> int:
    if key == "boom":
        raise ValueError("boom")
    return sum(values)


def count(out: Path, **options: Any) -> Any:
    return paralela.mapreduce(words, total, ["a b a", "c"], input_format="records",
                              backend="sequential", output=out, **options)  # fmt: skip


# -- mapreduce -------------------------------------------------------------------------


def test_mapreduce_refuses_a_directory_holding_spark_s_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = spark_output(out)
    with pytest.raises(ConfigError) as caught:
        count(out)
    message = str(caught.value)
    assert f"holds other files (._SUCCESS.crc, .part-00000-{UUID}" in message
    assert f"part-00000-{UUID}-c000.snappy.parquet" in message
    assert "mode='overwrite'" in message
    assert contents(out) == before  # nothing deleted, nothing added


def test_mapreduce_on_spark_refuses_before_the_session_starts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = spark_output(out)
    with pytest.raises(ConfigError, match="holds other files"):
        paralela.mapreduce(words, total, ["a b"], input_format="records", engine="spark",
                           output=str(out))  # fmt: skip
    assert contents(out) == before


def test_mode_overwrite_replaces_the_directory_s_contents(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spark_output(out)
    (out / "nested").mkdir()
    (out / "nested" / "file").write_text("x")
    os.symlink(tmp_path / "elsewhere", out / "link")  # removed, never followed
    (tmp_path / "elsewhere").write_text("kept")
    result = count(out, mode="overwrite", partitions=2)
    assert result.to_dict() == {"a": 2, "b": 1, "c": 1}
    assert visible(out) == ["_SUCCESS", "part-00000.jsonl", "part-00001.jsonl"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    assert (tmp_path / "elsewhere").read_text() == "kept"


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mode must be 'errorifexists' or 'overwrite'"):
        count(tmp_path / "out", mode="append")


def test_a_rerun_replaces_only_paralela_s_own_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    count(out, partitions=3)
    assert visible(out) == ["_SUCCESS", "part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    again = count(out, partitions=2)  # its own former part-00002 goes
    assert visible(out) == ["_SUCCESS", "part-00000.jsonl", "part-00001.jsonl"]
    assert again.to_dict() == {"a": 2, "b": 1, "c": 1}
    # Files of the user's, named as paralela names its own, are not paralela's.
    for name in ("part-00007.jsonl", ".tmp-notes"):
        (out / name).write_text("mine")
        with pytest.raises(ConfigError, match=rf"holds other files \({name}\)"):
            count(out, partitions=2)
        assert (out / name).read_text() == "mine"
        (out / name).unlink()


def test_a_failed_run_s_parts_are_still_paralela_s_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(UserFunctionError):
        paralela.mapreduce(words, fails_on_boom, ["a b boom c"], input_format="records",
                           backend="sequential", output=out, partitions=4)  # fmt: skip
    assert not (out / "_SUCCESS").exists()
    assert visible(out)  # some partitions were written before the failure
    count(out, partitions=2)  # no _SUCCESS lists them, but paralela's manifest does
    assert visible(out) == ["_SUCCESS", "part-00000.jsonl", "part-00001.jsonl"]


JOB = """
import os, signal, time

def mapper(line):
    for word in line.split():
        yield word, 1

def reducer(word, counts):
    if word == "hold" and os.environ.get("HOLD"):
        open("held", "w").close()  # the part file's temp file is open now
        signal.pause()  # until SIGKILL
    return sum(counts)
"""


@pytest.mark.slow
def test_a_rerun_removes_the_temp_files_of_a_run_killed_mid_reduce(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "corpus.txt").write_text("a hold b\nhold a\n")
    args = [sys.executable, "-m", "paralela", "mapreduce", "job.py", "--input", "corpus.txt",
            "--output", "out", "--workers", "1", "--partitions", "1", "--no-progress"]  # fmt: skip
    with subprocess.Popen(args, cwd=tmp_path, env={**os.environ, "HOLD": "1"},
                          start_new_session=True, stderr=subprocess.PIPE) as killed:  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "held").exists():
                assert killed.poll() is None, killed.communicate()[1]
                assert time.monotonic() < deadline, "the reducer never reached 'hold'"
                time.sleep(0.02)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the group is gone already
                os.killpg(killed.pid, signal.SIGKILL)
            killed.communicate(timeout=30)
    left = [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp-")]
    assert left, "the killed reduce task left no temp file"

    rerun = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stderr
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp")] == []
    assert visible(tmp_path / "out") == ["_SUCCESS", "part-00000.jsonl"]
    lines = (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()
    assert {d["key"]: d["value"] for d in map(json.loads, lines)} == {"a": 2, "b": 1, "hold": 2}


# -- predict ---------------------------------------------------------------------------


class Doubles:
    def predict(self, batch: list[Any]) -> list[Any]:
        return [2 * r["x"] for r in batch]


def predict(data: Path, out: Path, **options: Any) -> Any:
    return paralela.predict(Doubles, str(data), output=out, backend="sequential",
                            progress=False, **options)  # fmt: skip


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"x": i}) + "\n" for i in range(20)))
    return path


def test_predict_refuses_a_directory_holding_spark_s_output(tmp_path: Path, data: Path) -> None:
    out = tmp_path / "out"
    before = spark_output(out)
    with pytest.raises(ConfigError) as caught:
        predict(data, out)
    assert f"part-00000-{UUID}-c000.snappy.parquet" in str(caught.value)
    assert "mode='overwrite'" in str(caught.value)
    assert contents(out) == before


def test_predict_mode_overwrite_and_reruns(tmp_path: Path, data: Path) -> None:
    out = tmp_path / "out"
    spark_output(out)
    many = predict(data, out, mode="overwrite", split_bytes=100)
    assert many.shards > 1
    assert visible(out) == ["_SUCCESS", *(f"part-{i:05d}.jsonl" for i in range(many.shards))]
    one = predict(data, out)  # a rerun: its own former parts go
    assert visible(out) == ["_SUCCESS", "part-00000.jsonl"]
    assert one.records == 20
    (out / "part-00003.jsonl").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds other files \(part-00003\.jsonl\)"):
        predict(data, out)
    assert (out / "part-00003.jsonl").read_text() == "mine"


# -- the command line ------------------------------------------------------------------

CLI_JOB = """
def mapper(line):
    for word in line.split():
        yield word, 1

def reducer(word, counts):
    return sum(counts)
"""

CLI_MODELS = """
class Doubles:
    def predict(self, batch):
        return [2 * r["x"] for r in batch]
"""


@pytest.fixture
def here(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "job.py").write_text(CLI_JOB)
    (tmp_path / "models.py").write_text(CLI_MODELS)
    (tmp_path / "corpus.txt").write_text("a b a\nc\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


COMMANDS = [
    ["mapreduce", "job.py", "-i", "corpus.txt"],
    ["predict", "models.py:Doubles", "-i", "data.jsonl"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=["mapreduce", "predict"])
def test_cli_exits_2_naming_the_files_unless_overwrite(here: Path, command: list[str]) -> None:
    before = spark_output(here / "out")
    command = [*command, "-b", "sequential", "--no-progress"]
    refused = CliRunner().invoke(app, [*command, "--output", "out"])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith("Error: The output directory out holds other files (")
    assert f"part-00000-{UUID}-c000.snappy.parquet" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert contents(here / "out") == before

    replaced = CliRunner().invoke(app, [*command, "--output", "out", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert "_SUCCESS" in visible(here / "out")
    assert not any(name.startswith(("part-00000-", ".part")) for name in contents(here / "out"))


# -- run directories -------------------------------------------------------------------


def square(x: int) -> int:
    return x * x


def test_a_run_directory_of_someone_else_s_is_refused_not_written_over(tmp_path: Path) -> None:
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": true}')  # map writes its summary.json
    (mine / "spills").mkdir()  # mapreduce removes its spills/ at the end
    (mine / "spills" / "notes.txt").write_text("mine")
    with pytest.raises(RunStoreError, match=r"holds files paralela did not write \(spills, "):
        paralela.map(square, range(4), run_dir=mine, backend="sequential")
    with pytest.raises(RunStoreError, match=r"summary\.json"):
        paralela.mapreduce(words, total, ["a b"], input_format="records", run_dir=mine,
                           backend="sequential")  # fmt: skip
    assert (mine / "summary.json").read_text() == '{"mine": true}'
    assert (mine / "spills" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in mine.iterdir()) == ["spills", "summary.json"]
    # An empty directory, and paralela's own, are run directories.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert paralela.map(square, range(4), run_dir=empty, backend="sequential") == [0, 1, 4, 9]
    assert paralela.map(square, range(4), run_dir=empty, backend="sequential") == [0, 1, 4, 9]


def test_sweep_and_compare_refuse_a_directory_holding_their_outputs_of_someone_else_s(
    tmp_path: Path,
) -> None:
    import sweep_helpers
    from sklearn.datasets import load_iris
    from sklearn.neighbors import KNeighborsClassifier

    for name in ("trials.csv", "leaderboard.csv"):
        (tmp_path / name).write_text("my table\n")  # a sweep and a comparison write these
    (tmp_path / "data.csv").write_text("x\n1\n")  # neither writes this one: no matter
    with pytest.raises(ConfigError, match=r"holds trials\.csv, which paralela did not write"):
        paralela.sweep(sweep_helpers.quadratic, {"x": {"type": "float", "low": 0, "high": 1}},
                       n_trials=1, workers=1, run_dir=tmp_path)  # fmt: skip
    X, y = load_iris(return_X_y=True)
    with pytest.raises(ConfigError, match=r"holds leaderboard\.csv, which paralela did not"):
        paralela.compare({"knn": KNeighborsClassifier()}, X, y, cv=2, run_dir=tmp_path)
    assert (tmp_path / "trials.csv").read_text() == "my table\n"
    assert (tmp_path / "leaderboard.csv").read_text() == "my table\n"


def test_a_sweep_s_tables_are_replaced_whole_or_left_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paralela.sweeping._results import TrialRecord

    trials = [TrialRecord(i, "COMPLETE", [i / 2], {"x": i}) for i in range(3)]
    result = paralela.SweepResult(
        "s", "sqlite:///s.db", tmp_path, ["minimize"], trials, 1.0, 1, 1.0
    )
    result.to_csv(tmp_path / "trials.csv")
    result.to_json(tmp_path / "trials.json")
    before = contents(tmp_path)

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the disk fills while they are written
    result.trials.append(TrialRecord(3, "COMPLETE", [1.5], {"x": 3}))
    for write, name in ((result.to_csv, "trials.csv"), (result.to_json, "trials.json")):
        with pytest.raises(OSError, match="No space left"):
            write(tmp_path / name)
    assert contents(tmp_path) == before  # the former tables whole, no temp file beside


# -- stage -----------------------------------------------------------------------------


def test_stage_back_refuses_files_in_dest_it_did_not_write(tmp_path: Path) -> None:
    from paralela.staging import stage

    scratch, home = tmp_path / "scratch", tmp_path / "home"
    (scratch / "sub").mkdir(parents=True)
    (scratch / "model.pt").write_bytes(b"trained in scratch")
    (scratch / "sub" / "log.txt").write_bytes(b"log")
    home.mkdir()
    (home / "model.pt").write_bytes(b"my own model, kept at home")  # not paralela's
    (home / "notes.txt").write_bytes(b"not in the way")
    with pytest.raises(ConfigError, match=r"did not write .*\(model\.pt\).*--overwrite"):
        stage(home, scratch, back=True)
    assert (home / "model.pt").read_bytes() == b"my own model, kept at home"
    assert not (home / "sub").exists()  # nothing copied
    # A copy a killed stage renamed into place but never recorded is its source's twin.
    (home / "model.pt").write_bytes(b"trained in scratch")
    st = (scratch / "model.pt").stat()
    os.utime(home / "model.pt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert stage(home, scratch, back=True).files_copied == 2
    (scratch / "model.pt").write_bytes(b"trained again")  # recorded now: copied anew
    assert stage(home, scratch, back=True).files_copied == 1
    (home / "extra.bin").write_bytes(b"mine")
    (scratch / "extra.bin").write_bytes(b"from scratch")
    with pytest.raises(ConfigError, match=r"\(extra\.bin\)"):
        stage(home, scratch, back=True)
    result = stage(home, scratch, back=True, overwrite=True)
    assert (home / "extra.bin").read_bytes() == b"from scratch"
    assert result.files_copied == 1


def test_cli_stage_exits_2_naming_the_file_unless_overwrite(tmp_path: Path) -> None:
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    (scratch / "model.pt").write_bytes(b"trained in scratch")
    (home / "model.pt").write_bytes(b"my own model")
    refused = CliRunner().invoke(app, ["stage", str(home), str(scratch), "--back"])
    assert refused.exit_code == 2, refused.output
    assert "did not write" in refused.stderr
    assert "(model.pt)" in refused.stderr
    assert (home / "model.pt").read_bytes() == b"my own model"
    args = ["stage", str(home), str(scratch), "--back", "--overwrite"]
    replaced = CliRunner().invoke(app, args)
    assert replaced.exit_code == 0, replaced.output
    assert (home / "model.pt").read_bytes() == b"trained in scratch"
