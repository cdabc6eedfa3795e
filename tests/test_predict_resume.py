"""Resuming ``paralela.predict`` from its run directory: after a SIGKILL of the driver,
running again predicts only the unfinished shards and gives the full, exact output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from predict_helpers import Marked, Short, marks, rows, serial

import paralela
from paralela.errors import FingerprintMismatchError

TESTS = Path(__file__).resolve().parent

DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import paralela
from predict_helpers import Marked
paralela.predict(Marked, {inputs!r}, output={output!r}, run_dir={run_dir!r}, batch_size=5,
                 workers=2, progress=False)
"""


def test_a_killed_driver_resumes_without_recomputing_finished_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, poll: Callable[..., None]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    expected: list[list[dict[str, Any]]] = []
    for f in range(6):  # one shard per (small) file; the last two wait for the gate
        records: list[dict[str, Any]] = [{"id": f * 100 + i, "x": i + f} for i in range(23)]
        if f >= 4:
            records[3]["hold"] = True
        expected.append(records)
        (data / f"{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    first_marks, second_marks = tmp_path / "marks1", tmp_path / "marks2"
    first_marks.mkdir()
    second_marks.mkdir()
    gate = tmp_path / "gate"
    env = {**os.environ, "PREDICT_MARKS": str(first_marks), "PREDICT_GATE": str(gate)}
    script = DRIVER.format(tests=str(TESTS), inputs=str(data), output=str(tmp_path / "out"),
                           run_dir=str(tmp_path / "run"))  # fmt: skip
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path)
    try:
        chunks = tmp_path / "run" / "shards" / "chunks"
        poll(lambda: chunks.is_dir() and len(list(chunks.glob("*.pkl"))) == 4, timeout=60,
             what="four finished shards in the run directory")  # fmt: skip
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    first = {i for _, ids in marks(first_marks, "batch") for i in ids}
    assert first >= {r["id"] for shard in expected[:4] for r in shard}

    gate.touch()
    monkeypatch.setenv("PREDICT_MARKS", str(second_marks))
    monkeypatch.setenv("PREDICT_GATE", str(gate))
    result = paralela.predict(Marked, str(data), output=tmp_path / "out",
                              run_dir=tmp_path / "run", batch_size=5, workers=2,
                              progress=False)  # fmt: skip
    assert result.shards == 6
    assert result.shards_reused == 4
    assert result.records == 6 * 23
    assert result.records_computed == 2 * 23
    # Only the two unfinished shards were predicted again, each record once.
    again = [i for _, ids in marks(second_marks, "batch") for i in ids]
    assert sorted(again) == sorted(r["id"] for shard in expected[4:] for r in shard)
    found = rows(result.files)
    assert [row["input"] for row in found] == [r for shard in expected for r in shard]
    assert [row["output"] for row in found] == serial(expected, 5, "cpu")
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_a_run_dir_of_another_model_or_batch_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("".join(f'{{"id": {i}, "x": {i}}}\n' for i in range(9)))
    data = str(tmp_path / "data.jsonl")
    job: dict[str, Any] = {"output": tmp_path / "out", "run_dir": tmp_path / "run",
                           "workers": 1, "progress": False}  # fmt: skip
    paralela.predict(Marked, data, batch_size=4, **job)
    again = paralela.predict(Marked, data, batch_size=4, **job)
    assert again.shards_reused == again.shards == 1
    assert again.records == 9
    assert again.records_computed == 0
    with pytest.raises(FingerprintMismatchError, match=r"batch_size \(was 4, now 3\)"):
        paralela.predict(Marked, data, batch_size=3, **job)
    with pytest.raises(FingerprintMismatchError, match="the model predict_helpers:Short"):
        paralela.predict(Short, data, batch_size=4, **job)
