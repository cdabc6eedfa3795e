"""The digits MLP behind the sweep example: real torch training, and the example as a command."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paralela.demos import _digits
from paralela.demos._digits import DEFAULT_PARAMS, train
from paralela.errors import ConfigError, MissingExtraError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sweep_digits_mlp.py"
CHANCE_LOSS = math.log(10)  # cross-entropy of a uniform guess over the 10 digits


@pytest.fixture
def torch_and_sklearn() -> None:
    """torch and scikit-learn are dev dependencies (CI installs them): fail if missing."""
    import sklearn  # noqa: F401
    import torch  # noqa: F401


@pytest.mark.usefixtures("torch_and_sklearn")
def test_training_lowers_the_validation_loss_and_reports_every_epoch() -> None:
    reports: list[tuple[float, int]] = []
    params = {"lr": 0.01, "hidden": 64, "batch_size": 32, "epochs": 4}
    final = train(params, report=lambda value, epoch: reports.append((value, epoch)))

    assert [epoch for _, epoch in reports] == [0, 1, 2, 3]
    assert final == reports[-1][0]
    assert all(math.isfinite(value) for value, _ in reports)
    assert final < 0.5 < CHANCE_LOSS
    assert final < reports[0][0]


@pytest.mark.usefixtures("torch_and_sklearn")
def test_same_parameters_give_the_same_losses() -> None:
    import torch

    params = {"lr": 0.03, "hidden": 32, "batch_size": 64, "epochs": 2}
    threads, rng_state = torch.get_num_threads(), torch.get_rng_state()
    first: list[float] = []
    second: list[float] = []
    assert train(params, report=lambda v, _: first.append(v)) == train(
        params, report=lambda v, _: second.append(v)
    )
    assert first == second
    assert train({**params, "seed": 1}) != second[-1]
    # train() leaves torch's thread count and global random state as it found them.
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), rng_state)


@pytest.mark.usefixtures("torch_and_sklearn")
def test_an_exception_from_report_stops_training() -> None:
    class Stop(Exception):
        pass

    seen: list[int] = []

    def report(value: float, epoch: int) -> None:
        seen.append(epoch)
        if epoch == 1:
            raise Stop

    with pytest.raises(Stop):
        train({"epochs": 5}, report=report)
    assert seen == [0, 1]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"learning_rate": 0.1}, "Unknown parameter(s) 'learning_rate'"),
        ({"hidden": 0}, "hidden must be a positive integer, got 0"),
        ({"batch_size": 3.5}, "batch_size must be a positive integer, got 3.5"),
        ({"epochs": True}, "epochs must be a positive integer, got True"),
        ({"lr": -1.0}, "lr must be a positive number, got -1.0"),
        ({"lr": "0.1"}, "lr must be a positive number, got '0.1'"),
    ],
)
def test_bad_parameters_are_refused_before_training(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(params)


def test_a_bad_thread_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='many' is not a positive integer"):
        train(DEFAULT_PARAMS)


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'paralela[torch]'")):
        train(DEFAULT_PARAMS)


@pytest.mark.usefixtures("torch_and_sklearn")
def test_missing_scikit_learn_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(MissingExtraError, match="'scikit-learn', which is not installed"):
        _digits._data.__wrapped__()


def test_importing_the_module_does_not_import_torch() -> None:
    code = (
        "import sys, paralela.demos._digits; print(sorted({'torch', 'sklearn'} & set(sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"


@pytest.mark.usefixtures("torch_and_sklearn")
def test_the_example_trains_once_as_a_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--lr", "0.01", "--hidden", "32", "--epochs", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, f"the example failed:\n{proc.stdout}\n{proc.stderr}"
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"val_loss (\d+\.\d+)", last)
    assert match, proc.stdout
    assert float(match[1]) < 1.0


def test_the_example_refuses_bad_parameters(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--hidden", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 2, proc.stderr
    assert "hidden must be a positive integer, got 0" in proc.stderr
