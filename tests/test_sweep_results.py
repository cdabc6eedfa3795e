"""A sweep's result tables: ``TrialRecord.to_dict`` and ``SweepResult.to_json``."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import paralela
from paralela.sweeping._results import TrialRecord

if TYPE_CHECKING:
    from pathlib import Path


def record(number: int) -> TrialRecord:
    return TrialRecord(
        number,
        "COMPLETE",
        [number / 2],
        {"x": number, "layers": [64, 32], "name": "é"},
        started=10.0,
        finished=10.5 + number,
        slot=number % 2,
        devices="0",
        log_path=f"trials/trial-{number:05d}.log",
        intermediate={0: 1.0, 1: 0.5},
        host="node1",
    )


def test_to_dict_is_every_field_with_the_value_and_duration_copied() -> None:
    trial = record(3)
    data = trial.to_dict()
    expected = dataclasses.asdict(trial)
    expected.update(value=1.5, duration=3.5, intermediate={"0": 1.0, "1": 0.5})
    assert data == expected
    data["params"]["layers"].append(16)  # a copy: the record keeps its own
    assert trial.params["layers"] == [64, 32]


def test_to_json_reads_back_as_the_result_with_a_trial_per_line(tmp_path: Path) -> None:
    trials = [record(i) for i in range(3)]
    result = paralela.SweepResult(
        "s", "sqlite:///s.db", tmp_path, ["minimize"], trials, 2.0, 2, 0.9, notes=["a note"]
    )
    text = result.to_json(tmp_path / "trials.json").read_text()
    data = json.loads(text)
    assert data["trials"] == [t.to_dict() for t in trials]
    assert data["best"] == trials[0].to_dict()
    assert (data["study_name"], data["slots"], data["notes"]) == ("s", 2, ["a note"])
    lines = text.splitlines()
    assert sum(line.lstrip().startswith('{"number"') for line in lines) == 3
    assert text.endswith("}\n")


def test_to_json_without_trials(tmp_path: Path) -> None:
    result = paralela.SweepResult("s", "sqlite:///s.db", tmp_path, ["minimize"], [], 0.0, 1, 0.0)
    data = json.loads(result.to_json(tmp_path / "trials.json").read_text())
    assert data["trials"] == []
    assert data["best"] is None
