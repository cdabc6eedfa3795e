"""``paralela.predict`` on this machine's worker processes: outputs equal a serial loop
over the same batches, the model is set up once per worker, a killed worker's shard is
run again, and failures name the model, the shard, its file and lines."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from predict_helpers import (
    Marked,
    NotAModel,
    Raises,
    Short,
    Typed,
    Unwritable,
    marks,
    rows,
    serial,
)

import paralela
from paralela.errors import ConfigError, InputError
from paralela.serving import ModelError


@pytest.fixture
def marks_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "marks"
    directory.mkdir()
    monkeypatch.setenv("PREDICT_MARKS", str(directory))
    return directory


def write_jsonl(path: Path, records: list[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, record in enumerate(records):
            f.write(json.dumps(record) + "\n")
            if i == 10:
                f.write("\n")  # a blank line is no record


def by_shard(found: list[dict[str, Any]]) -> list[list[Any]]:
    """The inputs of each shard, in shard order; checks that rows count 0, 1, 2..."""
    shards: dict[int, list[Any]] = {}
    for row in found:
        records = shards.setdefault(row["shard"], [])
        assert row["row"] == len(records)
        records.append(row["input"])
    return [shards[s] for s in sorted(shards)]


def test_jsonl_equals_a_serial_loop_and_sets_up_once_per_worker(
    tmp_path: Path, marks_dir: Path
) -> None:
    records = [{"id": i, "x": i} for i in range(600)]
    write_jsonl(tmp_path / "data.jsonl", records)
    result = paralela.predict(
        Marked,
        str(tmp_path / "data.jsonl"),
        output=tmp_path / "out",
        batch_size=7,
        workers=2,
        split_bytes=2000,
        progress=False,
    )
    found = rows(result.files)
    shards = by_shard(found)
    assert [r for shard in shards for r in shard] == records  # every record once, in order
    assert [row["output"] for row in found] == serial(shards, 7, "cpu")
    assert result.records == result.records_computed == 600
    assert result.shards == len(result.files) == len(shards) >= 6
    assert result.shards_reused == 0
    assert result.devices == {"cpu": result.shards}  # no GPU here: the slots hide them
    assert result.records_per_second > 0
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert success["records"] == 600
    assert [p["file"] for p in success["parts"]] == [Path(f).name for f in result.files]
    # setup ran once in each worker process that predicted, not once per shard.
    setups = marks(marks_dir, "setup")
    predicting = {pid for pid, _ in marks(marks_dir, "batch")}
    assert sorted(pid for pid, _ in setups) == sorted(predicting)
    assert 1 <= len(setups) <= 2 < result.shards
    assert {data["device"] for _, data in setups} == {"cpu"}


def test_parquet_files_equal_a_serial_loop(tmp_path: Path, marks_dir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = []
    for f in range(3):
        part = [{"id": f * 1000 + i, "x": i - f} for i in range(200)]
        expected.extend(part)
        pq.write_table(pa.Table.from_pylist(part), tmp_path / f"in-{f}.parquet", row_group_size=40)
    result = paralela.predict(
        Marked,
        str(tmp_path / "in-*.parquet"),
        output=tmp_path / "out",
        output_format="parquet",
        batch_size=16,
        workers=2,
        split_bytes=600,
        progress=False,
    )
    assert all(f.endswith(".parquet") for f in result.files)
    found = rows(result.files)
    shards = by_shard(found)
    assert [r for shard in shards for r in shard] == expected
    assert [row["output"] for row in found] == serial(shards, 16, "cpu")
    assert result.shards > 3  # several shards per file (ranges of row groups)
    assert len(marks(marks_dir, "setup")) <= 2


def test_a_killed_worker_s_shard_is_run_again(
    tmp_path: Path, marks_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREDICT_DIED", str(tmp_path / "died"))
    records: list[dict[str, Any]] = [{"id": i, "x": i} for i in range(300)]
    records[150]["die"] = True
    write_jsonl(tmp_path / "data.jsonl", records)
    result = paralela.predict(
        Marked, str(tmp_path / "data.jsonl"), output=tmp_path / "out", batch_size=10,
        workers=2, split_bytes=1500, progress=False,
    )  # fmt: skip
    assert (tmp_path / "died").exists()  # a worker was killed...
    assert result.retries == 1  # ...and its shard ran again, in full
    found = rows(result.files)
    shards = by_shard(found)
    assert [r for shard in shards for r in shard] == records
    assert [row["output"] for row in found] == serial(shards, 10, "cpu")
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp")]


def test_sequential_backend_and_no_input_in_rows(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text("a\nbb\n\nccc\n", encoding="utf-8")
    result = paralela.predict(
        Marked, str(tmp_path / "lines.txt"), output=tmp_path / "out", backend="sequential",
        keep_input=False, batch_size=2, progress=False,
    )  # fmt: skip
    found = rows(result.files)
    assert [set(r) for r in found] == [{"shard", "row", "output"}] * 4
    assert [r["output"]["y"] for r in found] == [1, 2, 0, 3]
    assert [r["output"]["n"] for r in found] == [2, 2, 2, 2]
    assert result.devices == {"cpu": 1}


def test_predict_raising_names_the_model_shard_file_and_lines(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [{"id": i, "x": i} for i in range(100)]
    records[57]["bad"] = True
    write_jsonl(tmp_path / "data.jsonl", records)
    with pytest.raises(ModelError) as caught:
        paralela.predict(Raises, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                         batch_size=10, workers=2, progress=False)  # fmt: skip
    message = str(caught.value)
    assert "predict_helpers:Raises.predict raised ValueError: cannot predict record 57" in message
    # records 50-59 of the only shard; line 12 is blank, so record 50 is on line 52
    assert "records 50-59 of shard 0" in message
    assert "data.jsonl lines 52-61" in message
    assert isinstance(caught.value.__cause__, ValueError)
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp")]


def test_wrong_number_of_outputs_names_the_shard(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data.jsonl", [{"id": i, "x": i} for i in range(30)])
    with pytest.raises(ModelError, match=r"returned 7 outputs for a batch of 8") as caught:
        paralela.predict(Short, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                         batch_size=8, workers=2, progress=False)  # fmt: skip
    assert "records 0-7 of shard 0" in str(caught.value)
    assert "data.jsonl lines 1-8" in str(caught.value)


def test_non_utf8_input_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"fine\nalso fine\nnot \xff fine\n")
    with pytest.raises(InputError, match=r"bad\.txt line 3: byte 0xff"):
        paralela.predict(Marked, str(tmp_path / "bad.txt"), output=tmp_path / "out",
                         workers=1, progress=False)  # fmt: skip


def test_bad_class_and_options_fail_before_work(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data.jsonl", [{"id": 1, "x": 1}])
    data = str(tmp_path / "data.jsonl")
    with pytest.raises(ConfigError, match="has no predict method"):
        paralela.predict(NotAModel, data, output=tmp_path / "out")
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        paralela.predict(Marked, data, output=tmp_path / "out", batch_size=0)
    with pytest.raises(ConfigError, match="not 'threads'"):
        paralela.predict(Marked, data, output=tmp_path / "out", backend="threads")
    with pytest.raises(ConfigError, match="output_format must be"):
        paralela.predict(Marked, data, output=tmp_path / "out", output_format="csv")
    assert not (tmp_path / "out").exists()


def test_records_in_memory_and_worker_devices(tmp_path: Path) -> None:
    from paralela.serving._predict_task import worker_device

    records = [{"id": i, "x": -i} for i in range(55)]
    result = paralela.predict(Marked, records, output=tmp_path / "out", records_per_split=10,
                              batch_size=4, workers=2, progress=False)  # fmt: skip
    assert result.shards == 6
    found = rows(result.files)
    assert [row["input"] for row in found] == records
    assert [row["output"] for row in found] == serial(by_shard(found), 4, "cpu")
    # The device a worker's model is set up on follows its CUDA_VISIBLE_DEVICES.
    assert worker_device({"CUDA_VISIBLE_DEVICES": ""}) == "cpu"
    assert worker_device({"CUDA_VISIBLE_DEVICES": "-1"}) == "cpu"
    assert worker_device({"CUDA_VISIBLE_DEVICES": "GPU-5e3b0c1a"}) == "cuda:0"
    assert worker_device({"CUDA_VISIBLE_DEVICES": "1,2"}) == "cuda:0"
    assert worker_device({"SLURM_JOB_ID": "7"}) == "cpu"  # a job given no GPU
    visible = "cuda:0" if paralela.detect().gpus else "cpu"  # unset, outside Slurm
    assert worker_device({"PATH": os.environ.get("PATH", "")}) == visible


def test_gpus_naming_a_gpu_that_is_not_visible_is_a_config_error(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data.jsonl", [{"id": 1, "x": 1}])
    with pytest.raises(ConfigError, match="GPU '99' in gpus='99' is not visible"):
        paralela.predict(Marked, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                         gpus="99")  # fmt: skip
    with pytest.raises(ConfigError, match="gpus= and workers_per_gpu= choose this machine"):
        paralela.predict(Marked, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                         gpus="0", backend="sequential")  # fmt: skip


def test_outputs_the_format_cannot_hold_name_the_record(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [{"id": i, "x": i} for i in range(30)]
    records[7]["set"] = True
    write_jsonl(tmp_path / "a.jsonl", records)
    with pytest.raises(ModelError) as caught:
        paralela.predict(Unwritable, str(tmp_path / "a.jsonl"), output=tmp_path / "out",
                         batch_size=4, workers=1, progress=False)  # fmt: skip
    assert "Unwritable.predict returned {7} for record 7 of shard 0 (" in str(caught.value)
    assert "a.jsonl line 8); JSON cannot hold it" in str(caught.value)
    records[7] = {"id": 7, "x": 7, "text": True}
    write_jsonl(tmp_path / "b.jsonl", records)
    with pytest.raises(ModelError, match=r"records 0-29 of shard 0 \(.*b\.jsonl lines 1-31\) "
                       "cannot be written as Parquet"):  # fmt: skip
        paralela.predict(Unwritable, str(tmp_path / "b.jsonl"), output=tmp_path / "out2",
                         output_format="parquet", workers=1, progress=False)  # fmt: skip
    # No part, no temporary file: only paralela's list of what it writes there.
    assert [p.name for p in (tmp_path / "out2").iterdir()] == [".paralela-output.json"]


def test_csv_rows_and_a_quoted_line_break_with_one_shard_per_file(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text('id,x\n1,2\n2,"3\n4"\n3,5\n', encoding="utf-8")
    result = paralela.predict(Marked, str(tmp_path / "rows.csv"),
                              output=tmp_path / "out", split_bytes=0, batch_size=2,
                              workers=1, progress=False)  # fmt: skip
    found = rows(result.files)
    assert [row["input"] for row in found] == [
        {"id": "1", "x": "2"}, {"id": "2", "x": "3\n4"}, {"id": "3", "x": "5"},
    ]  # fmt: skip
    assert [row["output"]["n"] for row in found] == [2, 2, 1]
    assert [row["output"]["first"] for row in found] == ["1", "1", "3"]
    assert [row["output"]["y"] for row in found] == [1, 3, 1]  # CSV fields are strings


def test_input_and_output_models_as_serve_takes_them(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [{"id": i, "x": i} for i in range(20)]
    write_jsonl(tmp_path / "data.jsonl", records)
    result = paralela.predict(Typed, str(tmp_path / "data.jsonl"), output=tmp_path / "out",
                              batch_size=6, workers=2, progress=False)  # fmt: skip
    found = rows(result.files)
    assert [row["input"] for row in found] == records  # the records as read
    assert [row["output"] for row in found] == [{"y": i * i} for i in range(20)]
    records[14]["x"] = "fourteen"
    write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(InputError) as caught:
        paralela.predict(Typed, str(tmp_path / "bad.jsonl"), output=tmp_path / "out2",
                         batch_size=6, workers=2, progress=False)  # fmt: skip
    message = str(caught.value)
    assert "record 14 of shard 0 (" in message
    assert "bad.jsonl line 16): the record does not fit the model's input_model Item" in message
    assert "x: Input should be a valid integer" in message


def test_the_output_directory_holds_only_this_run_s_parts(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data.jsonl", [{"id": i, "x": i} for i in range(200)])
    data, out = str(tmp_path / "data.jsonl"), tmp_path / "out"
    many = paralela.predict(Marked, data, output=out, split_bytes=1000, workers=2, progress=False)
    assert many.shards > 1
    one = paralela.predict(Marked, data, output=out, workers=2, progress=False)
    assert one.shards == 1
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "part-00000.jsonl"]
    assert len(rows(one.files)) == 200
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds other files \(notes\.txt\)"):
        paralela.predict(Marked, data, output=out, workers=2, progress=False)
