"""The search space of a sweep: parameters, Optuna distributions, files, grids and CSVs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paralela.errors import ConfigError, MissingExtraError
from paralela.space import (
    MAX_GRID_POINTS,
    Categorical,
    Fixed,
    Float,
    Grid,
    Int,
    Space,
    as_space,
    load_space,
    load_sweep_file,
    space_from_dict,
    sweep_from_dict,
)

REPO = Path(__file__).resolve().parents[1]

EVERY_FORM_YAML = """\
lr:         {type: float, low: 1e-5, high: 0.1, log: true}
hidden:     {type: int, low: 16, high: 256, step: 16}
batch_size: {type: categorical, choices: [32, 64, 128]}
dropout:    {type: grid, values: [0.0, 0.2, 0.5]}
epochs:     {type: fixed, value: 10}
optimizer: adam
activation: [relu, tanh]
"""

EVERY_FORM_TOML = """\
lr = {type = "float", low = 1e-5, high = 0.1, log = true}
batch_size = {type = "categorical", choices = [32, 64, 128]}
dropout = {type = "grid", values = [0.0, 0.2, 0.5]}
epochs = {type = "fixed", value = 10}
optimizer = "adam"
activation = ["relu", "tanh"]

[hidden]
type = "int"
low = 16
high = 256
step = 16
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def check_every_form(space: Space) -> None:
    """The parameters of EVERY_FORM_YAML / EVERY_FORM_TOML (whose order differs)."""
    by_name = {p.name: p for p in space.params}
    assert by_name["lr"] == Float("lr", 1e-5, 0.1, log=True)
    assert by_name["hidden"] == Int("hidden", 16, 256, step=16)
    assert by_name["batch_size"] == Categorical("batch_size", (32, 64, 128))
    assert by_name["dropout"] == Grid("dropout", (0.0, 0.2, 0.5))
    assert by_name["epochs"] == Fixed("epochs", 10)
    assert by_name["optimizer"] == Fixed("optimizer", "adam")
    assert by_name["activation"] == Categorical("activation", ("relu", "tanh"))
    assert space.fixed() == {"epochs": 10, "optimizer": "adam"}
    assert set(space.distributions()) == {"lr", "hidden", "batch_size", "dropout", "activation"}


# -- parameters and their Optuna distributions ----------------------------------------


def test_float_to_float_distribution() -> None:
    plain = Float("lr", 0.001, 0.1).distribution()
    assert isinstance(plain, FloatDistribution)
    assert (plain.low, plain.high, plain.log, plain.step) == (0.001, 0.1, False, None)
    log = Float("lr", 1e-5, 1, log=True).distribution()
    assert isinstance(log, FloatDistribution)
    assert (log.low, log.high, log.log) == (1e-5, 1.0, True)
    stepped = Float("p", 0, 1, step=0.25).distribution()
    assert isinstance(stepped, FloatDistribution)
    assert (stepped.low, stepped.high, stepped.step) == (0.0, 1.0, 0.25)


def test_int_to_int_distribution() -> None:
    d = Int("hidden", 16, 256, step=16).distribution()
    assert isinstance(d, IntDistribution)
    assert (d.low, d.high, d.step, d.log) == (16, 256, 16, False)
    log = Int("n", 1, 1024, log=True).distribution()
    assert isinstance(log, IntDistribution)
    assert (log.low, log.high, log.step, log.log) == (1, 1024, 1, True)


def test_int_accepts_whole_floats() -> None:
    p = Int("n", 1.0, 1e3)  # type: ignore[arg-type]  # YAML reads 1e3 as a float
    assert (p.low, p.high) == (1, 1000)
    assert isinstance(p.high, int)


def test_categorical_and_grid_to_categorical_distribution() -> None:
    c = Categorical("bs", (32, 64)).distribution()
    assert isinstance(c, CategoricalDistribution)
    assert c.choices == (32, 64)
    g = Grid("dropout", (0.0, 0.5)).distribution()
    assert isinstance(g, CategoricalDistribution)
    assert g.choices == (0.0, 0.5)


def test_lists_become_tuples() -> None:
    assert Categorical("a", ["x", "y"]).choices == ("x", "y")  # type: ignore[arg-type]
    assert Grid("b", [1, 2]).values == (1, 2)  # type: ignore[arg-type]


def test_fixed_has_no_distribution() -> None:
    fixed = Fixed("epochs", 10)
    assert fixed.distribution() is None
    assert fixed.grid_values() == [10]
    space = Space((Fixed("epochs", 10), Int("n", 1, 4)))
    assert list(space.distributions()) == ["n"]
    assert space.fixed() == {"epochs": 10}
    assert space.names == ["epochs", "n"]


def test_grid_values_of_each_param() -> None:
    assert Float("lr", 0.001, 0.1).grid_values() is None
    assert Float("lr", 1e-5, 0.1, log=True).grid_values() is None
    assert Float("p", 0.1, 0.5, step=0.1).grid_values() == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert Int("n", 2, 10, step=4).grid_values() == [2, 6, 10]
    assert Int("n", 1, 4, log=True).grid_values() == [1, 2, 3, 4]
    assert Categorical("c", ("a", "b")).grid_values() == ["a", "b"]
    assert Grid("g", (3, 1)).grid_values() == [3, 1]


@pytest.mark.parametrize(
    "param",
    [
        Float("lr", 1e-5, 0.1, log=True),
        Float("p", 0, 1, step=0.5),
        Int("n", 16, 256, step=16),
        Int("m", 1, 8, log=True),
        Categorical("c", ("a", 2, None, True)),
        Grid("g", (0.1, 0.2)),
        Fixed("f", [1, 2]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_param_to_dict_round_trips(param: Any) -> None:
    assert space_from_dict({param.name: param.to_dict()}).params == (param,)


# -- files ------------------------------------------------------------------------------


def test_yaml_every_form(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "space.yaml", EVERY_FORM_YAML))
    check_every_form(space)
    assert space.names[:3] == ["lr", "hidden", "batch_size"]  # the file's order
    assert space.configurations is None
    lr = space.distributions()["lr"]
    assert isinstance(lr, FloatDistribution)
    assert lr.low == 1e-5  # 1e-5 without a dot is a float, not YAML 1.1's string


def test_yml_extension_and_str_path(tmp_path: Path) -> None:
    path = write(tmp_path, "space.YML", EVERY_FORM_YAML)
    check_every_form(load_space(str(path)))


def test_toml_every_form(tmp_path: Path) -> None:
    check_every_form(load_space(write(tmp_path, "space.toml", EVERY_FORM_TOML)))


def test_type_aliases_are_log_floats() -> None:
    space = space_from_dict(
        {
            "a": {"type": "loguniform", "low": 1e-4, "high": 1},
            "b": {"type": "logfloat", "low": 1e-4, "high": 1, "log": True},
            "c": {"type": "FLOAT", "low": 0, "high": 1},
        }
    )
    assert space.params == (
        Float("a", 1e-4, 1, log=True),
        Float("b", 1e-4, 1, log=True),
        Float("c", 0, 1),
    )


def test_yaml_params_wrapper_returns_other_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "sweep.yaml",
        """\
        sampler: tpe
        direction: maximize
        params:
          lr: {type: float, low: 1.0e-5, high: 0.1, log: true}
          layers: [2, 4]
        """,
    )
    space, settings = load_sweep_file(path)
    assert settings == {"sampler": "tpe", "direction": "maximize"}
    assert space.names == ["lr", "layers"]
    assert load_space(path) == space


def test_toml_params_wrapper_returns_other_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "sweep.toml",
        """\
        sampler = "grid"
        n_trials = 20

        [params]
        dropout = {type = "grid", values = [0.1, 0.2]}

        [params.hidden]
        type = "int"
        low = 8
        high = 32
        step = 8
        """,
    )
    space, settings = load_sweep_file(path)
    assert settings == {"sampler": "grid", "n_trials": 20}
    assert space.params == (Grid("dropout", (0.1, 0.2)), Int("hidden", 8, 32, step=8))


def test_unwrapped_file_has_no_settings(tmp_path: Path) -> None:
    _, settings = load_sweep_file(write(tmp_path, "space.yaml", EVERY_FORM_YAML))
    assert settings == {}


def test_configurations_in_a_mapping() -> None:
    space, settings = sweep_from_dict(
        {
            "direction": "minimize",
            "params": {"lr": {"type": "float", "low": 0.0, "high": 1.0}, "epochs": 3},
            "configurations": [{"lr": 0.5, "model": "a"}, {"lr": 0.1, "model": "b"}],
        }
    )
    assert settings == {"direction": "minimize"}
    assert space.names == ["lr", "epochs", "model"]
    assert space.params[2] == Categorical("model", ("a", "b"))
    assert space.grid() == [
        {"lr": 0.5, "epochs": 3, "model": "a"},
        {"lr": 0.1, "epochs": 3, "model": "b"},
    ]


def test_space_to_dict_round_trips(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "space.yaml", EVERY_FORM_YAML))
    assert space_from_dict(space.to_dict()) == space
    csv_space = load_space(write(tmp_path, "c.csv", "a,b\n1,x\n2,y\n"))
    assert space_from_dict(csv_space.to_dict()) == csv_space


def test_as_space_accepts_each_form(tmp_path: Path) -> None:
    path = write(tmp_path, "space.yaml", EVERY_FORM_YAML)
    space = load_space(path)
    assert as_space(space) is space
    assert as_space(path) == space
    assert as_space(str(path)) == space
    assert as_space(space.to_dict()) == space
    with pytest.raises(ConfigError, match="a Space, a mapping or a file path, got int"):
        as_space(3)  # type: ignore[arg-type]


# -- grids ------------------------------------------------------------------------------


def test_grid_is_the_cartesian_product_with_fixed_values() -> None:
    space = Space(
        (
            Int("hidden", 16, 48, step=16),
            Fixed("epochs", 5),
            Grid("dropout", (0.0, 0.5)),
            Categorical("act", ("relu", "tanh")),
        )
    )
    grid = space.grid()
    assert len(grid) == 3 * 2 * 2
    assert grid[0] == {"hidden": 16, "epochs": 5, "dropout": 0.0, "act": "relu"}
    assert grid[1] == {"hidden": 16, "epochs": 5, "dropout": 0.0, "act": "tanh"}
    assert grid[-1] == {"hidden": 48, "epochs": 5, "dropout": 0.5, "act": "tanh"}
    assert len({tuple(point.items()) for point in grid}) == len(grid)
    assert space.grid_axes() == {
        "hidden": [16, 32, 48],
        "dropout": [0.0, 0.5],
        "act": ["relu", "tanh"],
    }


def test_grid_of_stepped_floats_has_clean_values() -> None:
    grid = Space((Float("p", 0.0, 0.3, step=0.1),)).grid()
    assert grid == [{"p": 0.0}, {"p": 0.1}, {"p": 0.2}, {"p": 0.3}]


def test_grid_of_only_fixed_values_is_one_point() -> None:
    assert Space((Fixed("a", 1), Fixed("b", "x"))).grid() == [{"a": 1, "b": "x"}]


def test_grid_refuses_a_continuous_float() -> None:
    space = Space((Float("lr", 1e-5, 0.1, log=True), Int("n", 1, 3)))
    with pytest.raises(ConfigError, match=r"'lr' is a continuous float; give it a step, or use"):
        space.grid()
    with pytest.raises(ConfigError, match=r"values: \[\.\.\.\]"):
        space.grid_axes()


def test_grid_refuses_more_than_the_limit() -> None:
    space = Space((Int("a", 1, 1000), Int("b", 1, 1000)))
    with pytest.raises(ConfigError, match=r"1,000,000 points \(a: 1,000 x b: 1,000\), more than"):
        space.grid()
    assert MAX_GRID_POINTS == 100_000


def test_grid_of_huge_float_range_is_refused_before_listing_it() -> None:
    space = Space((Float("p", 0, 1, step=1e-9),))
    with pytest.raises(ConfigError, match="1,000,000,001 points"):
        space.grid()


def test_grid_axes_drive_optuna_grid_sampler() -> None:
    import optuna

    space = Space((Int("n", 1, 3), Grid("g", ("a", "b")), Fixed("f", 0)))
    seen: list[dict[str, Any]] = []

    def objective(trial: optuna.Trial) -> float:
        params: dict[str, Any] = {}
        for name, d in space.distributions().items():
            if isinstance(d, IntDistribution):
                params[name] = trial.suggest_int(name, d.low, d.high, step=d.step)
            else:
                assert isinstance(d, CategoricalDistribution)
                params[name] = trial.suggest_categorical(name, d.choices)
        seen.append(space.complete(params))
        return 0.0

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.GridSampler(space.grid_axes(), seed=0))
    study.optimize(objective, n_trials=20)  # the sampler stops the study after 6
    assert sorted(seen, key=lambda p: (p["n"], p["g"])) == space.grid()


def test_complete_adds_fixed_values_in_space_order() -> None:
    space = Space((Int("n", 1, 3), Fixed("epochs", 10), Categorical("c", ("a", "b"))))
    assert list(space.complete({"c": "a", "n": 2}).items()) == [
        ("n", 2),
        ("epochs", 10),
        ("c", "a"),
    ]
    assert space.complete({"n": 1, "extra": True})["extra"] is True


# -- validate ---------------------------------------------------------------------------


def test_validate_accepts_a_fitting_configuration() -> None:
    space = Space(
        (Float("lr", 0.0, 1.0), Int("n", 0, 10, step=2), Categorical("c", ("a",)), Fixed("f", 1))
    )
    space.validate({"lr": 0.5, "n": 4, "c": "a"})
    space.validate({"lr": 1, "n": 10, "c": "a", "f": 1})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lr": 0.5, "n": 4, "c": "a", "zz": 1}, r"sets 'zz', which the space does not define"),
        ({"lr": 0.5, "c": "a"}, r"gives no value for 'n'"),
        ({"lr": 1.5, "n": 4, "c": "a"}, r"lr = 1.5 is outside \[0.0, 1.0\]"),
        ({"lr": "x", "n": 4, "c": "a"}, r"lr = 'x' is not a number"),
        ({"lr": 0.5, "n": 3, "c": "a"}, r"n = 3 is not low \+ a multiple of step \(2\)"),
        ({"lr": 0.5, "n": 4.0, "c": "a"}, r"n = 4.0 is not a whole number"),
        ({"lr": 0.5, "n": 4, "c": "b"}, r"c = 'b' is not one of \['a'\]"),
        ({"lr": 0.5, "n": 4, "c": "a", "f": 2}, r"f = 2 differs from the fixed value 1"),
    ],
    ids=["unknown", "missing", "range", "type", "step", "int-type", "choice", "fixed"],
)
def test_validate_refuses(params: dict[str, Any], message: str) -> None:
    space = Space(
        (Float("lr", 0.0, 1.0), Int("n", 0, 10, step=2), Categorical("c", ("a",)), Fixed("f", 1))
    )
    with pytest.raises(ConfigError, match=message):
        space.validate(params)


def test_validate_of_a_csv_space_allows_unknown_names(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "c.csv", "a,b\n1,x\n"))
    space.validate({"a": 1, "b": "x", "note": "anything"})


# -- CSV of configurations --------------------------------------------------------------


def test_csv_values_types_and_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "runs.csv",
        """\
        lr,batch_size,model,pretrained,wd
        0.1,32,resnet,true,1e-4
        1e-3,64,"vit, base",FALSE,0
        0.1,-8,resnet,True,-.5
        """,
    )
    space = load_space(path)
    assert space.configurations == (
        {"lr": 0.1, "batch_size": 32, "model": "resnet", "pretrained": True, "wd": 1e-4},
        {"lr": 0.001, "batch_size": 64, "model": "vit, base", "pretrained": False, "wd": 0},
        {"lr": 0.1, "batch_size": -8, "model": "resnet", "pretrained": True, "wd": -0.5},
    )
    row = space.configurations[1]
    assert type(row["wd"]) is int
    assert type(row["pretrained"]) is bool
    assert space.params == (
        Categorical("lr", (0.1, 0.001)),
        Categorical("batch_size", (32, 64, -8)),
        Categorical("model", ("resnet", "vit, base")),
        Categorical("pretrained", (True, False)),
        Categorical("wd", (1e-4, 0, -0.5)),
    )
    assert space.grid() == [dict(c) for c in space.configurations]
    assert set(space.distributions()) == set(space.names)


def test_csv_skips_blank_lines_and_strips_spaces(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", "a, b\n\n1, x\n\n2,y\n\n")
    assert load_space(path).configurations == ({"a": 1, "b": "x"}, {"a": 2, "b": "y"})


def test_csv_ragged_row_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", "a,b,c\n1,2,3\n4,5\n")
    with pytest.raises(ConfigError, match=r"runs.csv, line 3 \(row 2\): has 2 values but"):
        load_space(path)


def test_csv_unterminated_quote_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", 'lr,act\n0.1,relu\n0.2,"tanh\n0.3,relu\n0.4,gelu\n')
    with pytest.raises(ConfigError, match=r"runs.csv, line 3: a quote opened on this line is not"):
        load_space(path)


def test_csv_malformed_quote_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", 'lr,act\n0.1,relu\n0.2,"tanh"x\n')
    with pytest.raises(ConfigError, match=r"runs.csv, line 3: .*double a quote"):
        load_space(path)


def test_csv_quoted_values_still_work(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", 'a,b\n1,"x,y"\n2,"say ""hi"""\n')
    assert load_space(path).configurations == ({"a": 1, "b": "x,y"}, {"a": 2, "b": 'say "hi"'})


def test_csv_empty_cell_names_row_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", "a,b\n1,2\n3,\n")
    with pytest.raises(ConfigError, match=r"line 3 \(row 2\), column 2 \(b\): the value is empty"):
        load_space(path)


def test_csv_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is empty; its first line must name the parameters"):
        load_space(write(tmp_path, "runs.csv", ""))


def test_csv_header_without_rows(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has a header but no configurations; add one per line"):
        load_space(write(tmp_path, "runs.csv", "a,b\n"))


def test_csv_duplicate_column(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 1: column 'a' appears twice"):
        load_space(write(tmp_path, "runs.csv", "a,b,a\n1,2,3\n"))


def test_csv_bad_column_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 1, column 2 \('batch size'\): is not a valid"):
        load_space(write(tmp_path, "runs.csv", "lr,batch size\n1,2\n"))


# -- errors: one per case, each naming the problem --------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{type: normal, low: 0, high: 1}", r"unknown type 'normal'; valid types are: float, "),
        ("{low: 0, high: 1}", r"has no 'type'; valid types are: .*type: fixed, value"),
        ("{type: float, low: 0}", r"type float needs 'high'"),
        ("{type: int}", r"type int needs 'low' and 'high'"),
        ("{type: float, low: 1, high: 1}", r"low \(1.0\) must be less than high \(1.0\); swap"),
        ("{type: int, low: 5, high: 2}", r"low \(5\) must be less than high \(2\)"),
        ("{type: float, low: 0, high: 1, log: true}", r"log: true needs low > 0, got low = 0"),
        ("{type: int, low: -1, high: 9, log: true}", r"log: true needs low > 0, got low = -1"),
        ("{type: float, low: 0, high: 1, step: 0}", r"step must be positive, got 0"),
        ("{type: int, low: 0, high: 8, step: -2}", r"step must be positive, got -2"),
        ("{type: int, low: 0, high: 10, step: 3}", r"not a whole number of steps of 3; set high"),
        ("{type: float, low: 0, high: 1, step: 0.3}", r"set high to 0.9 or 1.2"),
        ("{type: int, low: 0, high: 1, step: 2}", r"set high to 2, or change step"),
        ("{type: int, low: 0, high: 4, step: null}", r"step must be a number, got None"),
        ("{type: float, low: 1, high: 9, step: 1, log: true}", r"log: true cannot be combined"),
        ("{type: int, low: 1, high: 9, step: 2, log: true}", r"log: true cannot be combined"),
        ("{type: categorical, choices: []}", r"choices is empty; give at least one value"),
        ("[]", r"choices is empty"),
        ("{type: grid, values: []}", r"values is empty"),
        ("{type: categorical, choices: 3}", r"choices must be a list, e.g. choices: \[32, 64\]"),
        ("{type: categorical, choices: [[1, 2]]}", r"value 1 is \[1, 2\] \(list\); encode it"),
        ("{type: grid, values: [1, 2, 1]}", r"values holds 1 twice; keep one"),
        ("{type: grid, values: [1, true]}", r"values holds True and 1, which are equal"),
        (
            "{type: float, low: 0, hihg: 1}",
            r"unknown key 'hihg' for type float; allowed keys are: ",
        ),
        ("{type: float, low: 0, hihg: 1}", r"Did you mean 'high'\?"),
        ("{type: fixed, value: 1, choices: [1]}", r"allowed keys are: type, value\."),
        (
            '{type: float, low: "abc", high: 1}',
            r"low must be a number, got 'abc' \(str\); give one, e",
        ),
        ("{type: float, low: '1e-3', high: 1}", r"got '1e-3' \(str\); write it without quotes"),
        ("{type: int, low: 1.5, high: 4}", r"low must be a whole number for type int, got 1.5"),
        ("{type: float, low: 0, high: .inf}", r"high must be a finite number"),
        ("{type: float, low: 0, high: 1, log: yes please}", r"log must be true or false"),
        ("{type: 3}", r"unknown type 3"),
        ("{type: loguniform, low: 1, high: 9, log: false}", r"type loguniform is always log"),
    ],
)
def test_bad_parameter_in_yaml(tmp_path: Path, entry: str, message: str) -> None:
    path = write(tmp_path, "space.yaml", f"ok: [1, 2]\nbad: {entry}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_space(path)
    assert f"{path}, line 2, parameter 'bad': " in str(info.value)


def test_bad_parameter_in_toml_names_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "space.toml",
        """\
        [params]
        ok = [1, 2]

        [params.bad]
        type = "int"
        low = 4
        high = 2
        """,
    )
    with pytest.raises(ConfigError, match=r"space.toml, line 4, parameter 'bad': low \(4\)"):
        load_space(path)


def test_bad_parameter_in_code_names_it() -> None:
    with pytest.raises(ConfigError, match=r"Parameter 'lr': low \(0.1\) must be less than"):
        Float("lr", 0.1, 0.01)


@pytest.mark.parametrize("name", ["learning rate", "1lr", "a{b}", "", "x/y"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a valid parameter name; names are used as"):
        space_from_dict({name: 1})


def test_valid_unusual_names() -> None:
    assert space_from_dict({"model.lr": 1, "_x": 2, "a-b": 3}).names == ["model.lr", "_x", "a-b"]


def test_non_text_name_in_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"parameter 1: is not a valid parameter name"):
        load_space(write(tmp_path, "space.yaml", "1: x\n"))


def test_duplicate_names_in_code() -> None:
    with pytest.raises(ConfigError, match=r"Parameter 'a' is defined twice"):
        Space((Int("a", 1, 2), Fixed("a", 1)))


def test_duplicate_names_in_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "space.yaml", "lr: [1, 2]\nn: 3\nlr: [3]\n")
    with pytest.raises(ConfigError, match=r"line 3: 'lr' is given twice \(first on line 1\)"):
        load_space(path)


def test_duplicate_keys_inside_a_parameter_in_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "space.yaml", "n:\n  type: int\n  low: 1\n  low: 2\n  high: 5\n")
    with pytest.raises(ConfigError, match=r"line 4: 'low' is given twice"):
        load_space(path)


def test_duplicate_names_in_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"space.toml, line 2, column \d+: TOML syntax error"):
        load_space(write(tmp_path, "space.toml", "a = 1\na = 2\n"))


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "space.yaml", "a: [1, 2]\nb: {type: int, low: 1\nc: 3\n")
    with pytest.raises(ConfigError, match=r"space.yaml, line \d+, column \d+: YAML syntax error"):
        load_space(path)


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "space.toml", "a = 1\noptimizer = adam\n")
    with pytest.raises(ConfigError, match=r"space.toml, line 2, column \d+: TOML syntax error"):
        load_space(path)


def test_unknown_extension_lists_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"use one of: .yaml, .yml, .toml, .csv"):
        load_space(write(tmp_path, "space.json", "{}"))


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="Search space file not found") as info:
        load_space(path)
    assert str(path) in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        load_space(tmp_path / "d.yaml")


def test_empty_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is empty; give one entry per parameter"):
        load_space(write(tmp_path, "space.yaml", "# nothing yet\n"))


def test_yaml_file_that_is_a_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"must be a mapping of parameter name to spec.*got list"):
        load_space(write(tmp_path, "space.yaml", "- a\n- b\n"))


def test_no_parameters() -> None:
    with pytest.raises(ConfigError, match="defines no parameters; give at least one"):
        space_from_dict({"params": {}, "sampler": "tpe"})


def test_params_wrapper_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="'params' must be a mapping"):
        space_from_dict({"params": [1, 2]})


def test_configuration_that_misses_a_parameter() -> None:
    with pytest.raises(ConfigError, match=r"Configuration 2 gives no value for 'b'"):
        space_from_dict({"configurations": [{"a": 1, "b": 2}, {"a": 3}]})


def test_configuration_that_holds_a_list() -> None:
    with pytest.raises(ConfigError, match=r"configuration 1: a = \[1\]; configurations hold"):
        space_from_dict({"configurations": [{"a": [1]}]})


def test_not_a_param_in_space() -> None:
    with pytest.raises(ConfigError, match=r"A space holds Param objects"):
        Space(("lr",))  # type: ignore[arg-type]


# -- optional dependencies --------------------------------------------------------------


def test_missing_yaml_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(MissingExtraError, match=r"paralela\[sweep\]"):
        load_space(write(tmp_path, "space.yaml", "a: 1\n"))


def test_missing_optuna_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(MissingExtraError, match=r"paralela\[sweep\]"):
        Int("n", 1, 2).distribution()


def test_import_loads_no_optional_dependency() -> None:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import paralela.space\n"
        "print(sorted(m for m in ('optuna', 'yaml', 'tomllib', 'tomli') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
