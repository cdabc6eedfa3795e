"""The CLI's smaller hints: one "Did you mean ...?" (a transposition wins, a tie names
every closest choice), a mistyped serve or predict class answered with the module's
classes, and ``paralela info``'s expanded host list."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paralela.cli import app
from paralela.errors import ConfigError, did_you_mean
from paralela.loading import load_function
from paralela.space import space_from_dict


def flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


# -- did you mean -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "choices", "said"),
    [
        ("lgo", ["type", "low", "high", "log", "step"], " Did you mean 'log'?"),
        ("colour", ["color", "size"], " Did you mean 'color'?"),
        ("maxx", ["max1", "max2", "min"], " Did you mean 'max1' or 'max2'?"),  # a tie: both
        ("abcx", ["abcy", "abcz", "abcw"], " Did you mean 'abcy', 'abcz' or 'abcw'?"),
        ("zzz", ["alpha", "beta"], ""),
        ("lr", [], ""),
    ],
)
def test_did_you_mean(word: str, choices: list[str], said: str) -> None:
    assert did_you_mean(word, choices) == said


def test_a_space_typo_is_answered_with_the_key_meant() -> None:
    # lgo is as close to low as to log by difflib's ratio; the transposition is meant.
    with pytest.raises(ConfigError) as info:
        space_from_dict({"lr": {"type": "float", "low": 1e-4, "high": 1.0, "lgo": True}})
    assert str(info.value).endswith(
        "unknown key 'lgo' for type float; allowed keys are: "
        "type, low, high, log, step. Did you mean 'log'?"
    )


# -- a mistyped class ---------------------------------------------------------------------

MODELS = """\
import json


class Embedder:
    def predict(self, batch):
        return batch


class Tokenizer:
    pass


def helper():
    pass
"""


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "hint_models.py"
    path.write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield path
    sys.modules.pop("hint_models", None)


def test_a_class_typo_lists_the_classes_the_module_defines(models: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_function("hint_models:Embeder", kind="class")
    assert (
        "hint_models has no attribute 'Embeder'. Classes defined there: Embedder, "
        "Tokenizer. Did you mean 'Embedder'?"
    ) in str(info.value)
    with pytest.raises(ConfigError, match="Functions defined there: helper"):
        load_function("hint_models:helpr")
    with pytest.raises(ConfigError, match=r"Expected MODULE:CLASS, got 'nocolon'; e\.g\. models:"):
        load_function("nocolon", kind="class")


@pytest.mark.parametrize("command", ["serve", "predict"])
def test_serve_and_predict_name_the_classes(models: Path, command: str) -> None:
    args = [command, "hint_models.py:Embeder"]
    if command == "predict":
        args += ["--input", "x.jsonl", "--output", "out"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = flat(result.stderr)
    assert "Classes defined there: Embedder, Tokenizer. Did you mean 'Embedder'?" in text


# -- paralela info's hosts ----------------------------------------------------------------


def test_info_prints_the_expanded_host_list() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_NODELIST": None,
        "SLURM_JOB_NODELIST": "node[1-3],gpu07",
        "SLURM_NTASKS": "4",
        "COLUMNS": "120",
    }
    result = CliRunner().invoke(app, ["info"], env=env)
    assert result.exit_code == 0, result.output
    assert "4: node[1-3],gpu07" in result.stdout
    assert re.search(r"hosts\s*│\s*node1, node2, node3, gpu07\s", result.stdout), result.stdout


def test_info_cuts_a_long_host_list() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": None, "SLURM_JOB_NODELIST": "n[1-40]"}
    result = CliRunner().invoke(app, ["info"], env={**env, "COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "n31, n32 and 8 more (all in --json)" in result.stdout
    assert "n33" not in result.stdout
    json_out = CliRunner().invoke(app, ["info", "--json"], env=env)
    assert '"n40"' in json_out.stdout
