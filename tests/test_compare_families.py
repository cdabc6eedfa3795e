"""The families of a comparison: estimators, grids, spaces and files, and their errors."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from paralela.comparing._families import ALIASES, Family, families_from, resolve_estimator
from paralela.errors import ConfigError
from paralela.space import Categorical, Choice, Float, Grid, Int, Space

COMPARE_YAML = """\
model:
  type: choice
  options:
    logreg: {C: {type: float, low: 1e-3, high: 1e3, log: true}}
    forest: {n_estimators: {type: int, low: 50, high: 500}, max_depth: [4, 8, null]}
    svm:    {C: {type: float, low: 1e-2, high: 1e2, log: true}, kernel: [rbf, linear]}
    knn:
"""


def by_name(families: list[Family]) -> dict[str, Family]:
    return {f.name: f for f in families}


def make_forest(n_estimators: int = 10, max_depth: int | None = None) -> Any:
    return RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth)


class NoPredict:
    def fit(self, X: Any, y: Any) -> NoPredict:
        return self


# -- {name: estimator} and {name: (estimator, grid)} ---------------------------------


def test_instances_are_one_candidate_each_and_cloned() -> None:
    svc = SVC(C=3.0)
    families = by_name(
        families_from({"svm": svc, "logreg": LogisticRegression()}, classification=True)
    )
    assert list(families) == ["svm", "logreg"]
    assert families["svm"].space == Space(())
    built = families["svm"].make({})
    assert isinstance(built, SVC)
    assert built is not svc
    assert built.C == 3.0
    assert svc.random_state is None  # the user's instance is left as it was


def test_a_grid_of_lists_becomes_grid_parameters() -> None:
    (family,) = families_from(
        {"svm": (SVC(), {"C": [0.1, 1.0, 10.0], "kernel": ["rbf", "linear"]})},
        classification=True,
    )
    assert family.space.params == (Grid("C", (0.1, 1.0, 10.0)), Grid("kernel", ("rbf", "linear")))
    assert len(family.space.grid()) == 6
    built = family.make({"C": 10.0, "kernel": "linear"})
    assert (built.C, built.kernel) == (10.0, "linear")


def test_a_list_of_grids_is_parameter_grids_candidates_in_its_order() -> None:
    """As GridSearchCV's param_grid: each grid in turn, its names sorted, the last one
    fastest; a candidate holds the estimator's parameters only. A point in two grids is
    one candidate."""
    grids = [
        {"kernel": ["rbf"], "gamma": [1e-3, 1e-4], "C": [1, 10]},
        {"kernel": ["linear"], "C": [1, 10]},
        {"kernel": ["linear"], "C": [10]},
    ]
    (family,) = families_from({"svc": (SVC(), grids)}, classification=True)
    from sklearn.model_selection import ParameterGrid

    from paralela.comparing._candidates import family_grid

    assert family_grid(family.space) == list(ParameterGrid(grids[:2]))
    built = family.make({"C": 10, "kernel": "linear"})
    assert (built.C, built.kernel) == (10, "linear")
    (one,) = families_from({"svc": (SVC(), grids[1:2])}, classification=True)
    assert one.space.params == (Grid("kernel", ("linear",)), Grid("C", (1, 10)))


def test_a_grid_may_hold_space_entries() -> None:
    (family,) = families_from(
        {
            "forest": (
                RandomForestClassifier,
                {"n_estimators": {"type": "int", "low": 10, "high": 50}, "max_depth": [4, None]},
            )
        },
        classification=True,
    )
    assert family.space.params == (Int("n_estimators", 10, 50), Grid("max_depth", (4, None)))
    built = family.make({"n_estimators": 12, "max_depth": 4})
    assert isinstance(built, RandomForestClassifier)
    assert (built.n_estimators, built.max_depth) == (12, 4)


def test_a_space_as_the_grid() -> None:
    space = Space((Float("C", 0.01, 10.0, log=True),))
    (family,) = families_from({"logreg": (LogisticRegression, space)}, classification=True)
    assert family.space is space


def test_a_factory_is_called_with_the_params_as_keywords() -> None:
    (family,) = families_from(
        {"forest": (make_forest, {"n_estimators": [5, 7]})}, classification=True
    )
    built = family.make({"n_estimators": 7})
    assert built.n_estimators == 7
    assert built.random_state == 0


def test_a_lambda_factory_travels_with_cloudpickle() -> None:
    (family,) = families_from(
        {"scaled": (lambda C=1.0: make_pipeline(StandardScaler(), SVC(C=C)), {"C": [1.0, 2.0]})},
        classification=True,
    )
    make = cloudpickle.loads(cloudpickle.dumps(family.make))
    built = make({"C": 2.0})
    assert built.steps[-1][1].C == 2.0


def test_aliases_and_import_paths() -> None:
    families = by_name(
        families_from(
            {"forest": "forest", "a": "sklearn.svm:SVC", "b": "sklearn.svm.SVC"},
            classification=True,
        )
    )
    assert isinstance(families["forest"].make({}), RandomForestClassifier)
    assert type(families["a"].make({})) is SVC
    assert type(families["b"].make({})) is SVC
    regressors = by_name(families_from({"forest": "forest"}, classification=False))
    assert isinstance(regressors["forest"].make({}), RandomForestRegressor)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_imports(alias: str) -> None:
    for classification in (True, False):
        if ALIASES[alias][0 if classification else 1] is None:
            continue
        estimator = resolve_estimator(alias, classification=classification)()
        assert callable(estimator.fit)
        assert callable(estimator.predict)


def test_make_is_deterministic_and_picklable() -> None:
    (family,) = families_from({"forest": "forest"}, classification=True, seed=7)
    make = pickle.loads(pickle.dumps(family.make))  # a class target pickles by reference
    assert make({}).random_state == 7
    assert make({"random_state": 3}).random_state == 3  # the space's own value wins


def test_a_pipelines_steps_are_seeded() -> None:
    pipe = make_pipeline(StandardScaler(), RandomForestClassifier())
    (family,) = families_from({"pipe": pipe}, classification=True)
    assert family.make({}).get_params()["randomforestclassifier__random_state"] == 0
    built = family.make({"randomforestclassifier__n_estimators": 3})
    assert built.get_params()["randomforestclassifier__n_estimators"] == 3


def test_a_user_random_state_is_kept() -> None:
    (family,) = families_from(
        {"forest": RandomForestClassifier(random_state=5)}, classification=True
    )
    assert family.make({}).random_state == 5


# -- spaces and files ----------------------------------------------------------------


def test_space_file_names_the_families(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(COMPARE_YAML)
    families = by_name(families_from(path, classification=True))
    assert list(families) == ["logreg", "forest", "svm", "knn"]
    assert families["logreg"].space.names == ["C"]
    assert families["forest"].space.names == ["n_estimators", "max_depth"]
    assert families["knn"].space == Space(())
    assert isinstance(families["logreg"].make({"C": 0.5}), LogisticRegression)
    svm = families["svm"].make({"C": 2.0, "kernel": "linear"})
    assert (type(svm), svm.C, svm.kernel) == (SVC, 2.0, "linear")


def test_the_example_space_file_loads() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "compare_space.yaml"
    families = by_name(families_from(example, classification=True))
    assert {"logreg", "forest", "svm"} <= set(families)


def test_estimators_setting_maps_an_option_to_a_class(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            params:
              model:
                type: choice
                options:
                  gbc: {learning_rate: [0.05, 0.1]}
                  forest: {max_depth: [4, 8]}
            estimators:
              gbc: sklearn.ensemble:GradientBoostingClassifier
            """
        )
    )
    families = by_name(families_from(path, classification=True))
    assert type(families["gbc"].make({"learning_rate": 0.05})).__name__ == (
        "GradientBoostingClassifier"
    )
    assert isinstance(families["forest"].make({}), RandomForestClassifier)


def test_a_mapping_in_the_file_form() -> None:
    data = {
        "model": {
            "type": "choice",
            "options": {"tree": {"max_depth": [2, 3]}, "knn": {"n_neighbors": [3, 5]}},
        }
    }
    families = by_name(families_from(data, classification=False))
    assert type(families["tree"].make({"max_depth": 2})).__name__ == "DecisionTreeRegressor"
    assert type(families["knn"].make({})).__name__ == "KNeighborsRegressor"


def test_a_space_object_with_a_choice() -> None:
    space = Space((Choice("model", {"svm": (Float("C", 0.1, 10.0),), "knn": None}),))
    families = by_name(families_from(space, classification=True))
    assert families["svm"].space.names == ["C"]
    assert families["knn"].space.names == []


# -- errors --------------------------------------------------------------------------


def test_an_object_without_fit_or_predict() -> None:
    with pytest.raises(ConfigError, match=r"Family 'x'.*no fit and predict"):
        families_from({"x": NoPredict}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 'y'.*not an estimator"):
        families_from({"y": 42}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 'z'.*not an estimator"):
        families_from({"z": NoPredict()}, classification=True)


def test_a_factory_returning_no_estimator() -> None:
    with pytest.raises(ConfigError, match=r"Family 'f'.*returned int.*no fit/predict"):
        families_from({"f": lambda: 3}, classification=True)
    # a factory that needs arguments is checked when it builds
    (family,) = families_from({"g": (lambda depth: depth, {"depth": [1]})}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 'g'.*returned int"):
        family.make({"depth": 1})


def test_unknown_alias_suggests_the_closest() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown estimator alias 'forrest'\. Did you mean 'forest'\?.*logreg"
    ):
        families_from({"f": "forrest"}, classification=True)


def test_a_classifier_alias_for_regression() -> None:
    with pytest.raises(ConfigError, match=r"'logreg' is a classifier.*regression.*ridge"):
        families_from({"logreg": "logreg"}, classification=False)


def test_an_unknown_parameter_lists_the_estimators() -> None:
    with pytest.raises(ConfigError) as info:
        families_from({"svm": (SVC(), {"kernal": ["rbf"]})}, classification=True)
    message = str(info.value)
    assert "Family 'svm'" in message
    assert "no parameter 'kernal'. Did you mean 'kernel'?" in message
    assert "C, break_ties, cache_size" in message


def test_an_unknown_parameter_of_a_factory() -> None:
    with pytest.raises(ConfigError, match=r"no parameter 'depth'.*max_depth, n_estimators"):
        families_from({"f": (make_forest, {"depth": [1, 2]})}, classification=True)


def test_an_unknown_parameter_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(COMPARE_YAML.replace("max_depth", "max_dept"))
    with pytest.raises(ConfigError, match=r"Family 'forest'.*'max_dept'.*'max_depth'"):
        families_from(path, classification=True)


def test_an_unknown_alias_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(COMPARE_YAML.replace("svm:", "svn:"))
    with pytest.raises(ConfigError, match=r"Family 'svn'.*Did you mean 'svm'.*estimators:"):
        families_from(path, classification=True)


def test_a_space_without_a_choice(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("C: {type: float, low: 0.1, high: 10}\n")
    with pytest.raises(ConfigError, match=r"exactly one top-level choice"):
        families_from(path, classification=True)
    with pytest.raises(ConfigError, match=r"exactly one top-level choice"):
        families_from(Space((Float("C", 0.1, 1.0),)), classification=True)


def test_estimators_setting_errors(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    body = "params:\n" + textwrap.indent(COMPARE_YAML, "  ")
    path.write_text(body + "estimators: {gbc: sklearn.ensemble:GradientBoostingClassifier}\n")
    with pytest.raises(ConfigError, match=r"'gbc'.*not an option of 'model'.*logreg, forest"):
        families_from(path, classification=True)
    path.write_text(body + "estimator: {}\n")
    with pytest.raises(
        ConfigError, match=r"unknown setting 'estimator'.*Did you mean 'estimators'"
    ):
        families_from(path, classification=True)
    path.write_text(body + "estimators: {svm: sklearn.svm:SVCs}\n")
    with pytest.raises(
        ConfigError, match=r"Family 'svm'.*has no attribute 'SVCs'.*Did you mean 'SVC'"
    ):
        families_from(path, classification=True)
    path.write_text(body + "estimators: {svm: nosuchmodule_xyz:Thing}\n")
    with pytest.raises(ConfigError, match=r"cannot import 'nosuchmodule_xyz'"):
        families_from(path, classification=True)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match=r"mapping of family name to estimator"):
        families_from([SVC()], classification=True)
    with pytest.raises(ConfigError, match=r"got int"):
        families_from(3, classification=True)
    with pytest.raises(ConfigError, match=r"No family to compare"):
        families_from({}, classification=True)
    with pytest.raises(ConfigError, match=r"Family name 'a.b' is not valid"):
        families_from({"a.b": SVC()}, classification=True)
    with pytest.raises(ConfigError, match=r"\(estimator_or_factory, grid\), got 3"):
        families_from({"s": (SVC(), {}, 1)}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 's': grid 2 of the list is a str"):
        families_from({"s": (SVC(), [{"C": [1]}, "C=2"])}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 's': the list of grids is empty"):
        families_from({"s": (SVC(), [])}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 's': SVC instance has no parameter 'gama'"):
        families_from({"s": (SVC(), [{"C": [1]}, {"gama": [1]}])}, classification=True)
    with pytest.raises(ConfigError, match=r"Family 's'.*low"):
        families_from(
            {"s": (SVC(), {"C": {"type": "float", "low": 2, "high": 1}})}, classification=True
        )


def test_a_nested_choice_sets_the_estimators_parameter() -> None:
    grid = {
        "kernel": {
            "type": "choice",
            "options": {"rbf": {"gamma": [0.1, 1.0]}, "linear": None},
        }
    }
    (family,) = families_from({"svm": (SVC, grid)}, classification=True)
    built = family.make({"kernel": "rbf", "rbf.gamma": 0.1})
    assert (built.kernel, built.gamma) == ("rbf", 0.1)
    bad = {"kernel": {"type": "choice", "options": {"rbf": {"gama": [0.1]}}}}
    with pytest.raises(ConfigError, match=r"no parameter 'gama'\. Did you mean 'gamma'"):
        families_from({"svm": (SVC, bad)}, classification=True)


def test_estimators_next_to_an_unwrapped_choice(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(COMPARE_YAML + "estimators: {svm: sklearn.svm:SVC}\n")
    with pytest.raises(ConfigError, match=r"'estimators'(.|\n)*put the choice under params:"):
        families_from(path, classification=True)
    data = {
        "model": {"type": "choice", "options": {"svm": None}},
        "estimators": {"svm": "sklearn.svm:SVC"},
    }
    with pytest.raises(ConfigError, match=r"put the choice under params:"):
        families_from(data, classification=True)


def test_estimators_setting_from_python_may_hold_classes() -> None:
    data = {
        "params": {"model": {"type": "choice", "options": {"scaled": {"C": [1.0, 2.0]}}}},
        "estimators": {"scaled": scaled_svc},
    }
    (family,) = families_from(data, classification=True)
    assert family.make({"C": 2.0}).steps[-1][1].C == 2.0


def scaled_svc(C: float = 1.0) -> Any:
    return make_pipeline(StandardScaler(), SVC(C=C))


def test_a_factory_that_raises_is_named() -> None:
    def broken() -> Any:
        raise RuntimeError("no GPU")

    with pytest.raises(
        ConfigError, match=r"Family 'b': calling factory .*broken\(\).*RuntimeError: no GPU"
    ):
        families_from({"b": broken}, classification=True)


def test_a_toml_space_file(tmp_path: Path) -> None:
    path = tmp_path / "space.toml"
    path.write_text(
        textwrap.dedent(
            """\
            [params.model]
            type = "choice"

            [params.model.options.forest]
            max_depth = [2, 3]

            [params.model.options.gbc]
            learning_rate = {type = "float", low = 0.01, high = 0.3, log = true}

            [params.model.options.knn]

            [estimators]
            gbc = "sklearn.ensemble.GradientBoostingClassifier"
            """
        )
    )
    families = by_name(families_from(path, classification=True))
    assert families["forest"].space.params == (Categorical("max_depth", (2, 3)),)
    assert families["gbc"].space.names == ["learning_rate"]
    assert families["knn"].space == Space(())
    assert type(families["gbc"].make({"learning_rate": 0.1})).__name__ == (
        "GradientBoostingClassifier"
    )
