"""Conditional search spaces: a choice whose options carry parameters of their own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest

import paralela
from paralela.errors import ConfigError
from paralela.space import (
    MAX_GRID_POINTS,
    Categorical,
    Choice,
    Fixed,
    Float,
    Grid,
    Int,
    Space,
    branch_params,
    load_space,
    space_from_dict,
)

MODELS_YAML = """\
model:
  type: choice
  options:
    logreg: {C: {type: float, low: 1e-3, high: 1e3, log: true}}
    forest: {n_estimators: {type: int, low: 50, high: 500}, max_depth: [4, 8, null]}
    svm:    {C: {type: float, low: 1e-2, high: 1e2, log: true}, kernel: [rbf, linear]}
    knn:
seed: 3
"""

MODELS_TOML = """\
seed = 3

[model]
type = "choice"

[model.options.logreg]
C = {type = "float", low = 1e-3, high = 1e3, log = true}

[model.options.forest]
n_estimators = {type = "int", low = 50, high = 500}
max_depth = [4, 8]

[model.options.svm]
C = {type = "float", low = 1e-2, high = 1e2, log = true}
kernel = ["rbf", "linear"]

[model.options.knn]
"""

MODELS = Space(
    (
        Choice(
            "model",
            {
                "logreg": [Float("C", 1e-3, 1e3, log=True)],
                "forest": [Int("n_estimators", 50, 500), Categorical("max_depth", (4, 8, None))],
                "svm": Space(
                    (Float("C", 1e-2, 1e2, log=True), Categorical("kernel", ("rbf", "linear")))
                ),
                "knn": None,
            },
        ),
        Fixed("seed", 3),
    )
)

# Each option's flat parameter names.
BRANCHES = {
    "logreg": {"logreg.C"},
    "forest": {"forest.n_estimators", "forest.max_depth"},
    "svm": {"svm.C", "svm.kernel"},
    "knn": set(),
}


@pytest.fixture(autouse=True)
def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def check_branch(space: Space, params: dict[str, Any]) -> None:
    """``params`` hold the choice and exactly its option's parameters, each in range."""
    option = params["model"]
    assert set(params) - {"model", "seed"} == BRANCHES[option], params
    space.validate(space.complete(params))


# -- reading -------------------------------------------------------------------------


def test_yaml_toml_and_code_give_one_space(tmp_path: Path) -> None:
    from_yaml = load_space(_write(tmp_path, "s.yaml", MODELS_YAML))
    from_toml = load_space(_write(tmp_path, "s.toml", MODELS_TOML))
    assert from_yaml == MODELS
    # TOML has no null: its forest has max_depth [4, 8]
    assert from_toml.to_dict()["model"]["options"]["forest"]["max_depth"]["choices"] == [4, 8]
    assert sorted(from_toml.names) == sorted(from_yaml.names)  # TOML: seed comes first
    assert MODELS.conditional
    assert not Space((Float("x", 0, 1),)).conditional


def test_flat_names_in_order() -> None:
    assert MODELS.names == [
        "model",
        "logreg.C",
        "forest.n_estimators",
        "forest.max_depth",
        "svm.C",
        "svm.kernel",
        "seed",
    ]
    assert MODELS.fixed() == {"seed": 3}


def test_to_dict_round_trips() -> None:
    data = MODELS.to_dict()
    assert data["model"]["options"]["knn"] is None
    assert space_from_dict(data) == MODELS


def test_choice_of_an_option_without_parameters_in_code() -> None:
    choice = Choice("model", {"a": None, "b": [], "c": {}})
    assert all(branch == Space(()) for branch in choice.options.values())
    assert hash(choice) == hash(Choice("model", {"a": None, "b": None, "c": None}))


def test_nested_choices_nest_prefixes() -> None:
    space = space_from_dict(
        {
            "model": {
                "type": "choice",
                "options": {
                    "forest": {
                        "criterion": {
                            "type": "choice",
                            "options": {"gini": {"x": [1, 2]}, "entropy": None},
                        },
                        "depth": [3, 5],
                    },
                    "knn": {"k": [1, 5]},
                },
            }
        }
    )
    assert space.names == [
        "model",
        "forest.criterion",
        "forest.gini.x",
        "forest.depth",
        "knn.k",
    ]
    assert space.grid() == [
        {"model": "forest", "forest.criterion": "gini", "forest.gini.x": 1, "forest.depth": 3},
        {"model": "forest", "forest.criterion": "gini", "forest.gini.x": 1, "forest.depth": 5},
        {"model": "forest", "forest.criterion": "gini", "forest.gini.x": 2, "forest.depth": 3},
        {"model": "forest", "forest.criterion": "gini", "forest.gini.x": 2, "forest.depth": 5},
        {"model": "forest", "forest.criterion": "entropy", "forest.depth": 3},
        {"model": "forest", "forest.criterion": "entropy", "forest.depth": 5},
        {"model": "knn", "knn.k": 1},
        {"model": "knn", "knn.k": 5},
    ]
    assert branch_params(space.grid()[0], "forest") == {
        "criterion": "gini",
        "gini.x": 1,
        "depth": 3,
    }


def test_two_options_may_share_a_parameter_name() -> None:
    assert {"logreg.C", "svm.C"} <= set(MODELS.names)


def test_branch_params() -> None:
    params = {"model": "forest", "forest.n_estimators": 120, "forest.max_depth": 8, "seed": 3}
    assert branch_params(params, "forest") == {"n_estimators": 120, "max_depth": 8}
    assert branch_params(params, "forest.") == {"n_estimators": 120, "max_depth": 8}
    assert branch_params(params, "svm") == {}


def test_exported() -> None:
    assert paralela.Choice is Choice
    assert paralela.sweeping.Choice is Choice


# -- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "model: {type: choice, options: {forest: {depth: {type: int, low: 5, high: 1}}}}",
            "line 1, parameter 'model', option 'forest', parameter 'depth': low (5) must be less",
        ),
        ("model: {type: choice}", "line 1, parameter 'model': type choice needs 'options'"),
        ("model: {type: choice, options: {}}", "options must be a non-empty mapping"),
        ("model: {type: choice, options: [a, b]}", "options must be a non-empty mapping"),
        ("model: {type: choice, options: {a.b: null}}", "option 'a.b' is not a valid option"),
        ("model: {type: choice, options: {1x: null}}", "option '1x' is not a valid option"),
        ("model: {type: choice, options: {yes: null}}", "quote the name"),
        ("model: {type: choice, options: {a: 3}}", "option 'a' must map parameter names"),
        (
            "model: {type: choice, options: {a: {v: {type: fixed, value: [1, 2]}}}}",
            "option 'a', parameter 'v': a fixed value inside an option",
        ),
        (
            "model: {type: choice, options: {a: {v: {type: nope}}}}",
            "option 'a', parameter 'v': unknown type 'nope'",
        ),
    ],
)
def test_bad_choice_in_yaml(tmp_path: Path, entry: str, message: str) -> None:
    path = _write(tmp_path, "s.yaml", entry + "\n")
    with pytest.raises(ConfigError, match="^" + str(path).replace("\\", "\\\\")) as info:
        load_space(path)
    assert message in str(info.value)


def test_nested_error_names_its_own_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "s.yaml",
        """\
        lr: {type: float, low: 0.001, high: 0.1}
        model:
          type: choice
          options:
            logreg: {C: {type: float, low: 1e-3, high: 1e3, log: true}}
            forest:
              n_estimators: {type: int, low: 50, high: 500}
              max_depth: {type: categorical, choices: []}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert str(info.value) == (
        f"{path}, line 8, parameter 'model', option 'forest', parameter 'max_depth': "
        "choices is empty; give at least one value."
    )


def test_deeply_nested_error_names_the_whole_path(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "s.yaml",
        """\
        model:
          type: choice
          options:
            forest:
              criterion:
                type: choice
                options:
                  gini: {x: {type: float, low: 1, high: 0}}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert str(info.value).startswith(
        f"{path}, line 8, parameter 'model', option 'forest', parameter 'criterion', "
        "option 'gini', parameter 'x': low (1.0) must be less than high (0.0)"
    )


def test_toml_error_names_the_choice_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "s.toml",
        """\
        lr = 0.1
        model = {type = "choice", options = {svm = {C = {type = "float", low = 2, high = 1}}}}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert str(info.value).startswith(
        f"{path}, line 2, parameter 'model', option 'svm', parameter 'C': low (2.0)"
    )


def test_bad_choice_in_code_names_the_path() -> None:
    with pytest.raises(ConfigError, match="Parameter 'model', option 'a', parameter 'v'"):
        Choice("model", {"a": {"v": {"type": "int", "low": 1.5, "high": 3}}})
    with pytest.raises(ConfigError, match=r"Parameter 'model', option 'a': .*'x' is defined twice"):
        Choice("model", {"a": [Int("x", 1, 2), Int("x", 1, 3)]})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            (Choice("model", {"forest": [Int("depth", 1, 3)]}), Int("forest.depth", 1, 3)),
            "Parameter 'forest.depth' is defined twice: in option 'forest' of 'model' and at "
            "the top level",
        ),
        (
            (
                Choice("model", {"forest": [Int("depth", 1, 3)]}),
                Choice("other", {"forest": [Int("depth", 1, 3)]}),
            ),
            "in option 'forest' of 'model' and in option 'forest' of 'other'",
        ),
    ],
)
def test_flat_names_must_not_collide(params: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ConfigError, match="rename one of them") as info:
        Space(params)
    assert message in str(info.value)


def test_flat_name_collision_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "s.yaml",
        """\
        forest.depth: [1, 2]
        model: {type: choice, options: {forest: {depth: [1, 2]}}}
        """,
    )
    with pytest.raises(ConfigError, match=r"'forest\.depth' is defined twice"):
        load_space(path)


# -- validate ------------------------------------------------------------------------


def test_validate_accepts_each_branch() -> None:
    MODELS.validate({"model": "knn"})
    MODELS.validate({"model": "logreg", "logreg.C": 1.0, "seed": 3})
    MODELS.validate({"model": "forest", "forest.n_estimators": 50, "forest.max_depth": None})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"model": "forest", "forest.n_estimators": 60, "forest.max_depth": 4, "svm.C": 1.0},
            "sets 'svm.C', a parameter of option 'svm' of 'model', but 'model' is 'forest' "
            "here; leave 'svm.C' out",
        ),
        ({"logreg.C": 1.0}, "but 'model' is not given"),
        ({"model": "forest", "forest.n_estimators": 60}, "gives no value for 'forest.max_depth'"),
        ({"model": "tree"}, "model = 'tree' is not one of the options ['logreg', 'forest', "),
        ({"model": "logreg", "logreg.C": 1e9}, "logreg.C = 1000000000.0 is outside"),
        ({"model": "knn", "knn.k": 3}, "sets 'knn.k', which the space does not define"),
    ],
)
def test_validate_refuses(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        MODELS.validate(params)
    assert message in str(info.value)


def test_complete_adds_fixed_values_of_the_chosen_option() -> None:
    space = Space((Choice("m", {"a": [Fixed("k", 2), Int("x", 1, 3)], "b": [Fixed("k", 9)]}),))
    assert space.complete({"m": "a", "x": 1, "a.x": 2}) == {"m": "a", "a.k": 2, "a.x": 2, "x": 1}
    assert space.complete({"m": "b"}) == {"m": "b", "b.k": 9}


# -- sampling ------------------------------------------------------------------------


def test_sample_never_mixes_branches_over_200_tpe_trials() -> None:
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=20))
    seen: dict[str, int] = {}
    for _ in range(200):
        trial = study.ask()
        params = MODELS.sample(trial)
        assert params == trial.params
        check_branch(MODELS, params)
        seen[params["model"]] = seen.get(params["model"], 0) + 1
        # a score that only forest with many trees makes good: TPE should head there
        good = params["model"] == "forest" and params["forest.n_estimators"] > 300
        study.tell(trial, 0.0 if good else 1.0)
    assert set(seen) == set(BRANCHES)
    assert seen["forest"] == max(seen.values())


def test_sample_puts_an_options_fixed_values_in_the_trial() -> None:
    space = Space((Choice("m", {"a": [Fixed("n_jobs", 1), Grid("x", (1, 2))], "b": None}),))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        params = space.sample(trial)
        assert params in (
            {"m": "b"},
            {"m": "a", "a.n_jobs": 1, "a.x": 1},
            {"m": "a", "a.n_jobs": 1, "a.x": 2},
        )
        study.tell(trial, 0.0)


def test_sample_of_a_plain_space_matches_its_distributions() -> None:
    space = Space((Float("lr", 1e-4, 1e-1, log=True), Int("layers", 1, 4), Fixed("seed", 1)))
    trial = optuna.create_study().ask()
    params = space.sample(trial)
    assert set(params) == {"lr", "layers"}
    assert trial.distributions == space.distributions()


def test_sample_takes_enqueued_values() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"model": "svm", "svm.C": 2.0, "svm.kernel": "linear"})
    assert MODELS.sample(study.ask()) == {"model": "svm", "svm.C": 2.0, "svm.kernel": "linear"}


def test_sample_with_a_fixed_trial() -> None:
    trial = optuna.trial.FixedTrial(
        {"model": "forest", "forest.n_estimators": 70, "forest.max_depth": 8}
    )
    assert MODELS.sample(trial) == {
        "model": "forest",
        "forest.n_estimators": 70,
        "forest.max_depth": 8,
    }


# -- grid ----------------------------------------------------------------------------


GRID = Space(
    (
        Choice(
            "model",
            {
                "logreg": [Grid("C", (0.1, 1.0, 10.0))],
                "forest": [
                    Int("n_estimators", 100, 300, step=100),
                    Categorical("max_depth", (4, None)),
                ],
                "knn": None,
            },
        ),
        Grid("scale", (True, False)),
        Fixed("seed", 0),
    )
)


def test_grid_enumerates_every_options_grid() -> None:
    points = GRID.grid()
    assert len(points) == (3 + 3 * 2 + 1) * 2
    assert points[:3] == [
        {"model": "logreg", "logreg.C": 0.1, "scale": True, "seed": 0},
        {"model": "logreg", "logreg.C": 0.1, "scale": False, "seed": 0},
        {"model": "logreg", "logreg.C": 1.0, "scale": True, "seed": 0},
    ]
    forest = [p for p in points if p["model"] == "forest"]
    assert {(p["forest.n_estimators"], p["forest.max_depth"], p["scale"]) for p in forest} == {
        (n, d, s) for n in (100, 200, 300) for d in (4, None) for s in (True, False)
    }
    assert [p for p in points if p["model"] == "knn"] == [
        {"model": "knn", "scale": True, "seed": 0},
        {"model": "knn", "scale": False, "seed": 0},
    ]
    for point in points:
        GRID.validate(point)
        assert len({tuple(sorted(p.items(), key=str)) for p in points}) == len(points)


def test_grid_refuses_a_continuous_float_inside_an_option() -> None:
    with pytest.raises(ConfigError, match=r"'logreg\.C', 'svm\.C' is a continuous float"):
        MODELS.grid()


def test_grid_limit_counts_every_option() -> None:
    side = math.isqrt(MAX_GRID_POINTS) + 1
    space = Space((Choice("m", {"a": [Int("x", 1, side), Int("y", 1, side)], "b": None}),))
    with pytest.raises(ConfigError, match=rf"The grid has {side * side + 1:,} points \(m: "):
        space.grid()


def test_conditional_space_has_no_grid_axes() -> None:
    with pytest.raises(ConfigError, match="GridSampler cannot search it"):
        GRID.grid_axes()


# -- sweeps --------------------------------------------------------------------------


def branch_score(params: dict[str, Any]) -> float:
    """A score per option (forest with many trees is best); notes what it was given."""
    from sweep_helpers import note

    note("ran", params=params)
    option = params["model"]
    if option == "forest":
        return 1.0 - float(params["forest.n_estimators"]) / 1000
    if option in ("logreg", "svm"):
        return 1.0 + abs(math.log10(params[f"{option}.C"]))
    return 1.5


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from sweep_helpers import RECORD_VARIABLE

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the same CPU slots on every machine
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv(RECORD_VARIABLE, str(path))
    return path


@pytest.mark.timeout(120)
def test_tpe_sweep_gives_each_trial_its_branch_only(record: Path, tmp_path: Path) -> None:
    from sweep_helpers import notes

    space = _write(tmp_path, "space.yaml", MODELS_YAML)
    result = paralela.sweep(
        branch_score, space, n_trials=30, workers=2, seed=0, run_dir=tmp_path / "run"
    )
    assert len(result.trials) == 30
    assert all(t.state == "COMPLETE" for t in result.trials)
    for t in result.trials:
        check_branch(MODELS, t.params)
        assert t.params["seed"] == 3  # top-level fixed values still reach every trial
    ran = notes(record, "ran")
    assert len(ran) == 30
    for n in ran:  # what the objective itself was given
        check_branch(MODELS, n["params"])
    assert len({n["params"]["model"] for n in ran}) > 1
    assert (tmp_path / "run" / "trials.csv").exists()


@pytest.mark.timeout(120)
def test_grid_sweep_runs_every_point_once(record: Path, tmp_path: Path) -> None:
    from sweep_helpers import notes

    space = GRID.to_dict()
    result = paralela.sweep(
        branch_score_grid, space, sampler="grid", workers=2, run_dir=tmp_path / "run"
    )
    expected = sorted(map(_key, GRID.grid()))
    assert sorted(_key(t.params) for t in result.trials) == expected
    assert sorted(_key(n["params"]) for n in notes(record, "ran")) == expected


def branch_score_grid(params: dict[str, Any]) -> float:
    from sweep_helpers import note

    note("ran", params=params)
    return float(params.get("forest.n_estimators", 0))


def _key(params: dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def test_grid_sweep_refuses_more_trials_than_points(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has 20 points; n_trials=21 would run"):
        paralela.sweep(
            branch_score_grid, GRID.to_dict(), sampler="grid", n_trials=21, run_dir=tmp_path
        )


@pytest.mark.timeout(120)
def test_command_placeholders_of_options_not_chosen_are_empty(tmp_path: Path) -> None:
    script = _write(
        tmp_path,
        "trial.py",
        """\
        import json, os, sys
        import paralela
        params = json.loads(os.environ["PARALELA_TRIAL_PARAMS"])
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps({"argv": sys.argv[2:], "params": params}) + "\\n")
        paralela.report(1.0)
        """,
    )
    seen = tmp_path / "seen.jsonl"
    space = {
        "model": {
            "type": "choice",
            "options": {"logreg": {"C": [0.5, 2.0]}, "knn": {"k": [3]}},
        }
    }
    argv = [sys.executable, str(script), str(seen)]
    command = [*argv, "--model={model}", "--C={logreg.C}", "--k={knn.k}"]
    result = paralela.sweep(command, space, sampler="grid", workers=2, run_dir=tmp_path / "r")
    assert len(result.trials) == 3
    runs = sorted((json.loads(line) for line in seen.read_text().splitlines()), key=str)
    assert sorted(r["argv"] for r in runs) == [
        ["--model=knn", "--C=", "--k=3"],
        ["--model=logreg", "--C=0.5", "--k="],
        ["--model=logreg", "--C=2.0", "--k="],
    ]
    assert sorted(map(_key, (r["params"] for r in runs))) == sorted(
        map(
            _key,
            [
                {"model": "knn", "knn.k": 3},
                *({"model": "logreg", "logreg.C": c} for c in (0.5, 2.0)),
            ],
        )
    )


@pytest.mark.timeout(120)
def test_cli_sweeps_a_conditional_yaml(tmp_path: Path) -> None:
    _write(tmp_path, "space.yaml", MODELS_YAML)
    _write(
        tmp_path,
        "trial.py",
        """\
        import json, os, sys
        import paralela
        params = json.loads(os.environ["PARALELA_TRIAL_PARAMS"])
        assert sys.argv[1:] == ["--model=" + params["model"], f"--C={params.get('svm.C', '')}"]
        paralela.report(float(params.get("forest.n_estimators", 1000)))
        """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALELA_")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "paralela", "sweep", "--space", "space.yaml"),
            *("--trials", "8", "--workers", "2", "--seed", "1", "--run-dir", "out", "--json"),
            *("--", sys.executable, "trial.py", "--model={model}", "--C={svm.C}"),
        ],
        cwd=tmp_path,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)["trials"]
    assert len(trials) == 8
    assert {t["state"] for t in trials} == {"COMPLETE"}
    for t in trials:
        check_branch(MODELS, t["params"])


# -- CSV -----------------------------------------------------------------------------

MODELS_CSV = """\
model,forest.n_estimators,forest.max_depth,logreg.C,scale
forest,100,4,,true
logreg,,,0.1,false
knn,,,,true
forest,200,8,,true
"""


def test_csv_may_leave_the_columns_of_options_not_chosen_empty(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "configs.csv", MODELS_CSV))
    assert space.configurations == (
        {"model": "forest", "forest.n_estimators": 100, "forest.max_depth": 4, "scale": True},
        {"model": "logreg", "logreg.C": 0.1, "scale": False},
        {"model": "knn", "scale": True},
        {"model": "forest", "forest.n_estimators": 200, "forest.max_depth": 8, "scale": True},
    )
    assert space.conditional
    assert space.params == (
        Choice(
            "model",
            {
                "forest": [
                    Categorical("n_estimators", (100, 200)),
                    Categorical("max_depth", (4, 8)),
                ],
                "logreg": [Categorical("C", (0.1,))],
                "knn": None,
            },
        ),
        Categorical("scale", (True, False)),
    )
    assert space.grid() == list(space.configurations)
    assert space_from_dict(space.to_dict()) == space


def test_csv_nested_options(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "configs.csv",
        """\
        model,forest.criterion,forest.gini.x,knn.k
        forest,gini,1,
        forest,entropy,,
        knn,,,5
        """,
    )
    space = load_space(path)
    assert space.names == ["model", "forest.criterion", "forest.gini.x", "knn.k"]
    assert space.configurations is not None
    assert space.configurations[1] == {"model": "forest", "forest.criterion": "entropy"}


def test_a_dotted_column_without_a_choice_is_an_ordinary_column(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "c.csv", "model,model.dropout\nresnet,0.1\n"))
    assert not space.conditional
    with pytest.raises(ConfigError, match=r"column 2 \(model\.dropout\): the value is empty"):
        load_space(_write(tmp_path, "d.csv", "model,model.dropout\nresnet,\n"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "logreg,100,,0.1,true",
            "line 4 (row 3), column 2 (forest.n_estimators): holds 100, but model is 'logreg' "
            "here, not 'forest'; the column belongs to option 'forest' and is set only in rows "
            "that choose it: leave it empty.",
        ),
        (
            "logreg,,,,true",
            "line 4 (row 3), column 4 (logreg.C): the value is empty, but this row chooses "
            "'logreg' (model = logreg), whose parameter it is; give it a value.",
        ),
        (",1,2,,true", "line 4 (row 3), column 1 (model): the value is empty; every"),
        ("3,,,,true", "Column 'model' chooses between the columns named '<option>.<name>', so"),
    ],
)
def test_csv_bad_option_columns_name_line_and_column(
    tmp_path: Path, row: str, message: str
) -> None:
    text = "model,forest.n_estimators,forest.max_depth,logreg.C,scale\n"
    text += "forest,1,2,,true\nlogreg,,,0.5,false\n"
    path = _write(tmp_path, "configs.csv", text + row + "\n")
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_csv_two_columns_holding_an_option_is_ambiguous(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.csv", "a,b,forest.x\nforest,forest,1\n")
    with pytest.raises(ConfigError, match="Columns 'a' and 'b' both hold 'forest'"):
        load_space(path)


def test_configurations_in_yaml_may_be_conditional(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "s.yaml",
        """\
        params:
          model: {type: choice, options: {svm: {C: [1, 10]}, knn: {k: [3, 5]}}}
        configurations:
          - {model: svm, svm.C: 10}
          - {model: knn, knn.k: 3}
        """,
    )
    assert load_space(path).configurations == (
        {"model": "svm", "svm.C": 10},
        {"model": "knn", "knn.k": 3},
    )
    bad = _write(
        tmp_path,
        "t.yaml",
        """\
        params:
          model: {type: choice, options: {svm: {C: [1, 10]}, knn: {k: [3, 5]}}}
        configurations:
          - {model: knn, knn.k: 3, svm.C: 1}
        """,
    )
    with pytest.raises(ConfigError, match=r"Configuration 1 sets 'svm\.C', a parameter of option"):
        load_space(bad)


@pytest.mark.timeout(120)
def test_csv_sweep_runs_exactly_its_rows(record: Path, tmp_path: Path) -> None:
    from sweep_helpers import notes

    path = _write(tmp_path, "configs.csv", MODELS_CSV)
    result = paralela.sweep(branch_score_grid, path, workers=2, run_dir=tmp_path / "run")
    rows = load_space(path).configurations
    assert rows is not None
    assert [t.params for t in result.trials] == list(rows)
    assert sorted(_key(n["params"]) for n in notes(record, "ran")) == sorted(map(_key, rows))
