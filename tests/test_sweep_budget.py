"""``n_trials`` is the budget over all runs: two drivers started at once on one run
directory together run exactly ``n_trials`` trials. Real drivers (``paralela sweep``
processes), real trial processes, one real SQLite database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sweep_helpers import command, write_script

pytestmark = pytest.mark.timeout(120)

TRIAL = """\
import time
time.sleep(0.4)
paralela.report(paralela.current_params()["x"])
"""


def test_two_drivers_on_one_run_directory_share_the_trial_budget(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    script = write_script(tmp_path, "train.py", TRIAL)
    argv = [sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml"]
    argv += ["--trials", "7", "--workers", "2", "--run-dir", "run", "--json"]
    argv += ["--", *command(script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    drivers = [
        subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [d.communicate(timeout=100) for d in drivers]
    for driver, (_, err) in zip(drivers, outputs, strict=True):
        assert driver.returncode == 0, err
    (name,) = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    ran = [t for t in study.trials if "paralela:unused" not in t.system_attrs]
    assert len(ran) == 7, [(t.number, t.state) for t in study.trials]
    assert {t.state for t in ran} == {TrialState.COMPLETE}
    drivers_seen = {t.system_attrs.get("paralela:driver") for t in ran}
    assert len(drivers_seen) == 2  # both drivers ran trials: they did run at once
    last = json.loads(outputs[-1][0])
    assert len([t for t in last["trials"] if t["state"] == "COMPLETE"]) <= 7
