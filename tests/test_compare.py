"""paralela.compare: the same scores as GridSearchCV, threads per slot, data sent once,
pruning, successive halving, failures, results files and bad input.

Every test runs real worker processes (the processes backend) on scikit-learn's bundled
data sets; grids are small and folds few, to keep them fast.
"""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compare_engine_helpers import Crashing, Exploding, NoFit, make_no_fit
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.dummy import DummyClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline
from sklearn.tree import DecisionTreeClassifier

import paralela
from paralela.comparing._families import Family
from paralela.comparing._schedule import halving_rounds
from paralela.errors import ConfigError
from paralela.resources import detect, make_slots
from paralela.space import Grid, Space


def _digits() -> tuple[Any, Any]:
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def _folds_log(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "folds.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _grid_search(
    families: dict[str, tuple[Any, dict[str, list[Any]]]], X: Any, y: Any, **kwargs: Any
) -> GridSearchCV:
    """GridSearchCV over the same families: one pipeline step swapped per family."""
    grids = [
        {"model": [estimator], **{f"model__{k}": v for k, v in grid.items()}}
        for estimator, grid in families.values()
    ]
    first = next(iter(families.values()))[0]
    return GridSearchCV(Pipeline([("model", first)]), grids, **kwargs).fit(X, y)


def _same_as_grid_search(result: Any, search: GridSearchCV) -> None:
    records = sorted(result.candidates, key=lambda c: c.number)
    means = search.cv_results_["mean_test_score"]
    stds = search.cv_results_["std_test_score"]
    assert len(records) == len(means)
    for record, mean, std, params in zip(
        records, means, stds, search.cv_results_["params"], strict=True
    ):
        assert record.state == "COMPLETE"
        assert record.params == {
            k.removeprefix("model__"): v for k, v in params.items() if k != "model"
        }
        assert record.mean == pytest.approx(mean, abs=1e-9)
        assert record.std == pytest.approx(std, abs=1e-9)
    assert result.best.number == search.best_index_
    assert result.best.mean == pytest.approx(search.best_score_, abs=1e-9)


def test_digits_equals_grid_search_cv(tmp_path: Path) -> None:
    X, y = _digits()
    families = {
        "logreg": (LogisticRegression(max_iter=300, random_state=0), {"C": [0.05, 0.5]}),
        "knn": (KNeighborsClassifier(), {"n_neighbors": [1, 3, 5], "weights": ["distance"]}),
    }
    result = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "run", workers=2)
    search = _grid_search(families, X, y, cv=3)
    _same_as_grid_search(result, search)
    # The refit best model predicts as GridSearchCV's.
    assert result.best_estimator is not None
    np.testing.assert_array_equal(
        result.best_estimator.predict(X), search.best_estimator_.predict(X)
    )
    assert set(result.families()) == {"logreg", "knn"}
    assert result.families()["logreg"].params == {"C": 0.5}
    assert [c.family for c in result.leaderboard("knn")] == ["knn"] * 3


def test_breast_cancer_with_a_scorer_name_equals_grid_search_cv(tmp_path: Path) -> None:
    X, y = load_breast_cancer(return_X_y=True)
    families = {
        "tree": (DecisionTreeClassifier(random_state=0), {"max_depth": [2, 4, None]}),
        "bayes": (GaussianNB(), {"var_smoothing": [1e-9, 1e-6]}),
    }
    result = paralela.compare(
        families, X, y, cv=3, scoring="roc_auc", run_dir=tmp_path / "run", refit=False
    )
    search = _grid_search(families, X, y, cv=3, scoring="roc_auc")
    _same_as_grid_search(result, search)
    assert result.scoring == "roc_auc"
    assert result.best_estimator is None
    assert not (tmp_path / "run" / "best.pkl").exists()


def _balanced(estimator: Any, X: Any, y: Any) -> float:
    return float(balanced_accuracy_score(y, estimator.predict(X)))


def test_wine_with_a_splitter_and_a_scorer_function_equals_grid_search_cv(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    cv = KFold(4, shuffle=True, random_state=3)
    families = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 5, 9, 15]})}
    result = paralela.compare(families, X, y, cv=cv, scoring=_balanced, run_dir=tmp_path / "r")
    search = _grid_search(families, X, y, cv=cv, scoring=_balanced)
    _same_as_grid_search(result, search)
    assert result.scoring == "_balanced"


def test_threads_are_limited_to_the_slot_and_data_is_sent_once_per_worker(
    tmp_path: Path,
) -> None:
    X, y = _digits()
    for workers in (1, 2):
        run_dir = tmp_path / f"w{workers}"
        families = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 3, 5, 7]})}
        paralela.compare(families, X, y, cv=3, run_dir=run_dir, workers=workers, refit=False)
        slots = make_slots(detect(), n_slots=workers)
        folds = [e for e in _folds_log(run_dir) if e["kind"] == "fold"]
        assert len(folds) == 12
        # threadpoolctl, inside each task, saw its pools limited to its slot's CPUs.
        assert {e["slot_threads"] for e in folds} <= {s.threads for s in slots}
        assert all(e["threads"] == e["slot_threads"] for e in folds), folds
        # 12 tasks on at most `workers` processes, each of which unpickled the data once.
        assert len({e["pid"] for e in folds}) <= workers
        assert {e["data_loads"] for e in folds} == {1}


def test_median_pruning_stops_a_hopeless_family_after_its_first_fold(tmp_path: Path) -> None:
    import optuna

    X, y = _digits()
    families = {
        "knn": (KNeighborsClassifier(), {"n_neighbors": [3]}),
        "dummy": (
            DummyClassifier(),
            {
                "strategy": ["most_frequent", "prior", "uniform", "stratified", "constant"],
                "constant": [0],
            },
        ),
    }
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    result = paralela.compare(
        families, X, y, cv=3, pruner=pruner, workers=1, run_dir=tmp_path / "r", refit=False
    )
    dummies = result.leaderboard("dummy")
    pruned = [c for c in dummies if c.state == "PRUNED"]
    # The first dummy ran beside the good candidate; every later one stopped at fold 0.
    assert len(pruned) >= len(dummies) - 1
    for c in pruned:
        assert c.fold_scores[0] is not None
        assert c.fold_scores[1:] == [None, None]
    assert result.best is not None
    assert result.best.family == "knn"
    assert result.leaderboard("knn")[0].state == "COMPLETE"
    assert (tmp_path / "r" / "study.db").exists()


def test_halving_keeps_a_third_of_the_candidates_each_round(tmp_path: Path) -> None:
    X, y = _digits()
    ks = [1, 3, 5, 7, 9, 11, 13, 15, 17]
    families = {"knn": (KNeighborsClassifier(), {"n_neighbors": ks})}
    result = paralela.compare(
        families, X, y, cv=5, halving=True, run_dir=tmp_path / "r", refit=False
    )
    assert halving_rounds(5) == [1, 3, 5]
    ran = [sum(s is not None for s in c.fold_scores) for c in result.candidates]
    assert sorted(ran) == [1] * 6 + [3] * 2 + [5]
    by_first = sorted(result.candidates, key=lambda c: (-c.fold_scores[0], c.number))
    promoted = {c.number for c in by_first[:3]}
    assert {c.number for c, n in zip(result.candidates, ran, strict=True) if n >= 3} == promoted
    best = [c for c in result.candidates if c.state == "COMPLETE"]
    assert len(best) == 1
    assert result.best == best[0]
    assert (
        best[0].number
        == min(
            (c for c in result.candidates if c.number in promoted),
            key=lambda c: (-float(np.mean(c.fold_scores[:3])), c.number),
        ).number
    )
    assert {c.state for c in result.candidates if c is not best[0]} == {"PRUNED"}


def test_a_fit_that_raises_fails_its_candidate_and_the_others_go_on(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    families = {
        "exploding": (Exploding(), {"explode": [True, False]}),
        "knn": (KNeighborsClassifier(), {"n_neighbors": [1, 5]}),
    }
    result = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r")
    states = {(c.family, json.dumps(c.params)): c for c in result.candidates}
    failed = states[("exploding", '{"explode": true}')]
    assert failed.state == "FAIL"
    assert failed.error is not None
    assert "ValueError: boom" in failed.error
    assert [c.state for c in result.candidates].count("COMPLETE") == 3
    assert result.best is not None
    assert result.best.family == "knn"
    board = result.leaderboard()
    assert board[-1] is failed  # failed candidates rank last


def test_every_candidate_failing_raises_naming_the_first_failure(tmp_path: Path) -> None:
    """Today compare returned best=None while the command line exited 1."""
    X, y = load_wine(return_X_y=True)
    families = {"exploding": (Exploding(), {"explode": [True]}), "also": Exploding(explode=True)}
    with pytest.raises(paralela.CompareError, match=r"every candidate failed \(2 of 2\)") as caught:
        paralela.compare(families, X, y, cv=2, workers=1, run_dir=tmp_path / "r")
    message = str(caught.value)
    assert 'The first, #0 exploding {"explode": true}: ValueError: boom' in message
    assert str(tmp_path / "r" / "compare.json") in message
    result = caught.value.result  # what ran, as compare would have returned it
    assert [c.state for c in result.candidates] == ["FAIL", "FAIL"]
    assert result.best is None
    assert len(json.loads((tmp_path / "r" / "compare.json").read_text())["candidates"]) == 2
    assert not (tmp_path / "r" / "best.pkl").exists()


def test_results_files(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    run_dir = tmp_path / "r"
    families = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 5, 9]})}
    result = paralela.compare(families, X, y, cv=3, run_dir=run_dir)
    assert isinstance(result, paralela.CompareResult)
    data = json.loads((run_dir / "compare.json").read_text())
    assert data["scoring"] == "score"
    assert data["greater_is_better"] is True
    assert data["cv"] == 3
    assert data["slots"] == result.slots
    assert data["best"] == result.best.number
    assert [c["params"] for c in data["candidates"]] == [
        {"n_neighbors": 1},
        {"n_neighbors": 5},
        {"n_neighbors": 9},
    ]
    assert data["candidates"][0]["fold_scores"] == result.candidates[0].fold_scores
    rows = list(csv.DictReader((run_dir / "leaderboard.csv").read_text().splitlines()))
    assert [int(r["number"]) for r in rows] == [c.number for c in result.leaderboard()]
    assert rows[0]["state"] == "COMPLETE"
    assert json.loads(rows[0]["params"]) == result.best.params
    assert float(rows[0]["fold_2"]) == result.best.fold_scores[2]
    best = json.loads((run_dir / "best.json").read_text())
    assert best["family"] == "knn"
    assert best["params"] == result.best.params
    model = pickle.loads((run_dir / "best.pkl").read_bytes())
    np.testing.assert_array_equal(model.predict(X), result.best_estimator.predict(X))


def test_sampled_candidates_over_continuous_parameters(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    families = {
        "knn": (KNeighborsClassifier(), {"n_neighbors": {"type": "int", "low": 1, "high": 30}}),
        "tree": (DecisionTreeClassifier(), {"ccp_alpha": {"type": "float", "low": 0, "high": 0.1}}),
    }
    with pytest.raises(ConfigError, match="n_trials or time_budget"):
        paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r")
    result = paralela.compare(
        families, X, y, cv=3, n_trials=6, seed=0, run_dir=tmp_path / "r", refit=False
    )
    assert len(result.candidates) == 6
    for c in result.candidates:
        assert c.state == "COMPLETE"
        name, (low, high) = {"knn": ("n_neighbors", (1, 30)), "tree": ("ccp_alpha", (0, 0.1))}[
            c.family
        ]
        assert set(c.params) == {name}
        assert low <= c.params[name] <= high
    assert (tmp_path / "r" / "study.db").exists()


def test_family_objects_are_taken_as_they_are(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)

    family = Family("knn", _make_knn, Space((Grid("n_neighbors", (2, 4)),)))
    result = paralela.compare([family], X, y, cv=3, run_dir=tmp_path / "r", refit=False)
    assert [c.params for c in result.candidates] == [{"n_neighbors": 2}, {"n_neighbors": 4}]


def _make_knn(params: dict[str, Any]) -> KNeighborsClassifier:
    return KNeighborsClassifier(**params)


def _knn_with(n_neighbors: int, p: float) -> KNeighborsClassifier:
    """A factory whose arguments have no defaults."""
    return KNeighborsClassifier(n_neighbors=n_neighbors, p=p)


def test_a_factory_without_defaults_is_built_with_a_candidates_parameters(
    tmp_path: Path,
) -> None:
    X, y = load_wine(return_X_y=True)
    grid = {"n_neighbors": [3], "p": [1.0, 2.0]}
    result = paralela.compare({"knn": (_knn_with, grid)}, X, y, cv=3, run_dir=tmp_path / "g")
    assert [c.params for c in result.candidates] == [
        {"n_neighbors": 3, "p": 1.0},
        {"n_neighbors": 3, "p": 2.0},
    ]
    sampled = {"n_neighbors": [3], "p": {"type": "float", "low": 1.0, "high": 2.0}}
    result = paralela.compare(
        {"knn": (_knn_with, sampled)}, X, y, cv=3, n_trials=2, run_dir=tmp_path / "s"
    )
    assert [c.state for c in result.candidates] == ["COMPLETE", "COMPLETE"]
    assert (tmp_path / "s" / "study.db").exists()  # sampled, not a grid


def test_bad_estimators_are_refused_before_any_task(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    with pytest.raises(ConfigError, match=r"(?s)'broken'.*fit"):
        paralela.compare({"broken": NoFit()}, X, y, run_dir=tmp_path / "a")
    family = Family("nofit", make_no_fit, Space(()))
    with pytest.raises(ConfigError, match="Family 'nofit': NoFit has no fit method"):
        paralela.compare([family], X, y, run_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="Unknown scoring 'acurracy'"):
        paralela.compare(
            {"knn": KNeighborsClassifier()}, X, y, scoring="acurracy", run_dir=tmp_path / "c"
        )
    with pytest.raises(ConfigError, match="X has 178 rows but y has 10"):
        paralela.compare({"knn": KNeighborsClassifier()}, X, y[:10], run_dir=tmp_path / "d")
    with pytest.raises(ConfigError, match="cannot split"):
        paralela.compare({"knn": KNeighborsClassifier()}, X, y, cv=1000, run_dir=tmp_path / "e")
    assert not (tmp_path / "a" / "folds.jsonl").exists()


def test_a_target_with_one_class_is_refused_before_any_fit(tmp_path: Path) -> None:
    """Today a forest scored "1.0000 ± 0" on it and a best.pkl was written."""
    X, _ = load_wine(return_X_y=True)
    families = {"tree": DecisionTreeClassifier(), "knn": KNeighborsClassifier()}
    with pytest.raises(ConfigError, match=r"y has one class \(2\) in all 178 rows") as caught:
        paralela.compare(families, X, np.full(len(X), 2), cv=3, run_dir=tmp_path / "r")
    assert "at least two classes" in str(caught.value)
    assert not (tmp_path / "r").exists()


def test_a_missing_target_is_refused_naming_its_rows(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    labels = np.array([str(v) for v in y], dtype=object)
    labels[[4, 9]] = [None, float("nan")]
    with pytest.raises(ConfigError, match=r"y is missing \(None or NaN\) at rows 4 and 9"):
        paralela.compare({"knn": KNeighborsClassifier()}, X, labels, run_dir=tmp_path / "r")
    numbers = y.astype(float)
    numbers[7] = np.nan
    with pytest.raises(ConfigError, match=r"at row 7\b"):
        paralela.compare({"knn": KNeighborsClassifier()}, X, numbers, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_run_dir_of_another_comparison_is_refused(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    families = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 3]})}
    paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r", refit=False)
    with pytest.raises(ConfigError, match=r"the data set .* differ"):
        paralela.compare(families, X[:-1], y[:-1], cv=3, run_dir=tmp_path / "r")
    with pytest.raises(ConfigError, match="cross-validation folds"):
        paralela.compare(families, X, y, cv=4, run_dir=tmp_path / "r")
    other = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 5]})}
    with pytest.raises(ConfigError, match="families"):
        paralela.compare(other, X, y, cv=3, run_dir=tmp_path / "r")


def test_a_worker_that_dies_is_replaced_and_its_fold_run_once_more(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    marker = str(tmp_path / "crashed")
    families = {
        "once": (Crashing(marker=marker), {}),
        "always": (Crashing(), {}),
        "knn": (KNeighborsClassifier(), {"n_neighbors": [1, 5]}),
    }
    result = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "r", refit=False)
    by_family = {c.family: c for c in result.candidates}
    assert by_family["once"].state == "COMPLETE"  # its first fold ran again
    assert (tmp_path / "crashed").exists()
    assert by_family["always"].state == "FAIL"
    assert "WorkerDiedError" in (by_family["always"].error or "")
    assert [c.state for c in result.leaderboard("knn")] == ["COMPLETE", "COMPLETE"]


def test_time_budget_and_progress(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    families = {"knn": (KNeighborsClassifier(), {"n_neighbors": [1, 3, 5]})}
    seen: list[Any] = []
    result = paralela.compare(
        families, X, y, cv=3, run_dir=tmp_path / "r", progress=seen.append, refit=False
    )
    assert sorted(r.number for r in seen) == [0, 1, 2]
    assert sorted(seen, key=lambda r: r.number) == result.candidates
    assert all(isinstance(r, paralela.comparing.CandidateRecord) for r in seen)
    # A budget spent before any candidate starts: none runs, and no best.
    late = paralela.compare(families, X, y, cv=3, run_dir=tmp_path / "late", time_budget=1e-9)
    assert late.candidates == []
    assert late.best is None
    assert late.best_estimator is None
    assert json.loads((tmp_path / "late" / "best.json").read_text()) is None


def test_n_trials_draws_grid_points(tmp_path: Path) -> None:
    X, y = load_wine(return_X_y=True)
    grid = {"n_neighbors": [1, 3, 5], "weights": ["uniform", "distance"]}
    families = {"knn": (KNeighborsClassifier(), grid)}
    runs = [
        paralela.compare(
            families, X, y, cv=3, n_trials=3, seed=7, sampler=sampler, run_dir=tmp_path / d
        )
        for d, sampler in (("a", None), ("b", "grid"))
    ]
    points = [[c.params for c in r.candidates] for r in runs]
    assert points[0] == points[1]  # the same seed draws the same points
    assert len(points[0]) == 3
    every = [{"n_neighbors": k, "weights": w} for k in grid["n_neighbors"] for w in grid["weights"]]
    assert all(p in every for p in points[0])
    assert len({json.dumps(p, sort_keys=True) for p in points[0]}) == 3
    continuous = {"knn": (KNeighborsClassifier(), {"p": {"type": "float", "low": 1, "high": 2}})}
    with pytest.raises(ConfigError, match="sampler='grid' needs a list of values"):
        paralela.compare(continuous, X, y, sampler="grid", run_dir=tmp_path / "c")


def test_a_whole_number_regression_target_gets_regressors(tmp_path: Path) -> None:
    """Aliases follow the command line's rule: 200-odd distinct whole numbers are a
    regression target, not 200 classes (scikit-learn's type_of_target says multiclass)."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    y = np.round(y).astype(int)
    result = paralela.compare(
        {"ridge": ("ridge", {"alpha": [0.1, 1.0]})},
        X,
        y,
        cv=3,
        refit=True,
        run_dir=tmp_path / "run",
        progress=False,
    )
    assert type(result.best_estimator).__name__ == "Ridge"
    assert result.best is not None
    assert 0.0 < result.best.mean < 1.0  # R², not accuracy over 200 "classes"


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_grids_written_for_grid_search_cv_run_unchanged(tmp_path: Path) -> None:
    """Tuples (hidden_layer_sizes), numpy arrays of values and estimators as a pipeline
    step's values: GridSearchCV's grids as they are, the same scores."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    X, y = X[:300] / 16.0, y[:300]
    mlp = MLPClassifier(max_iter=30, random_state=0)
    mlp_grid = {"hidden_layer_sizes": [(8,), (16, 8)], "alpha": np.logspace(-4, -2, 2)}
    pipe = Pipeline([("scale", StandardScaler()), ("model", SVC())])
    pipe_grid = {"model": [SVC(C=1.0), SVC(C=10.0), LogisticRegression(max_iter=500)]}
    result = paralela.compare(
        {"mlp": (mlp, mlp_grid), "pipe": (pipe, pipe_grid)},
        X, y, cv=3, workers=2, run_dir=tmp_path / "run", progress=False,
    )  # fmt: skip
    expected = []
    for estimator, grid in ((mlp, mlp_grid), (pipe, pipe_grid)):
        search = GridSearchCV(estimator, grid, cv=3, refit=False).fit(X, y)
        expected += list(search.cv_results_["mean_test_score"])
    assert [c.mean for c in result.candidates] == pytest.approx(expected, abs=1e-9)
    # values Optuna cannot store go by their repr in the results
    assert [c.params["hidden_layer_sizes"] for c in result.candidates[:4]] == [
        "(8,)", "(16, 8)", "(8,)", "(16, 8)",
    ]  # fmt: skip
    assert result.candidates[4].params == {"model": "SVC()"}
    assert result.best_estimator is not None
    best = result.best
    assert best is not None
    if best.family == "pipe":  # refit with the value itself, not its label
        assert not isinstance(result.best_estimator.get_params()["model"], str)
    else:
        assert isinstance(result.best_estimator.hidden_layer_sizes, tuple)


def test_a_list_of_grids_runs_as_grid_search_cvs_param_grid(tmp_path: Path) -> None:
    """scikit-learn's examples/model_selection/plot_grid_search_digits.py: SVC with two
    kernels, each with a grid of its own, as it is (on 300 digits, 3 folds)."""
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    X, y = X[:300], y[:300]
    tuned_parameters = [
        {"kernel": ["rbf"], "gamma": [1e-3, 1e-4], "C": [1, 10, 100, 1000]},
        {"kernel": ["linear"], "C": [1, 10, 100, 1000]},
    ]
    result = paralela.compare(
        {"svc": (SVC(), tuned_parameters)}, X, y, cv=3, workers=2, run_dir=tmp_path / "r"
    )
    search = GridSearchCV(SVC(), tuned_parameters, cv=3).fit(X, y)
    assert [c.params for c in result.candidates] == search.cv_results_["params"]
    means = search.cv_results_["mean_test_score"]
    assert [c.mean for c in result.candidates] == pytest.approx(list(means), abs=1e-9)
    stds = search.cv_results_["std_test_score"]
    assert [c.std for c in result.candidates] == pytest.approx(list(stds), abs=1e-9)
    assert result.best is not None
    assert result.best.number == search.best_index_
    refit, expected = result.best_estimator.get_params(), search.best_estimator_.get_params()
    assert (refit.pop("random_state"), expected.pop("random_state")) == (0, None)  # seeded
    assert refit == expected


def test_a_list_of_grids_is_sampled_one_grid_then_its_parameters(tmp_path: Path) -> None:
    """As RandomizedSearchCV takes a list of distributions: a grid is drawn, then its
    parameters; each candidate holds the estimator's parameters only."""
    X, y = load_wine(return_X_y=True)
    grids = [
        {"n_neighbors": {"type": "int", "low": 1, "high": 30}, "weights": ["distance"]},
        {"n_neighbors": [3], "p": {"type": "float", "low": 1.0, "high": 2.0}},
    ]
    result = paralela.compare(
        {"knn": (KNeighborsClassifier(), grids)},
        X, y, cv=2, n_trials=6, sampler="random", seed=3, run_dir=tmp_path / "r", refit=False,
    )  # fmt: skip
    assert [c.state for c in result.candidates] == ["COMPLETE"] * 6
    keys = {tuple(sorted(c.params)) for c in result.candidates}
    assert keys == {("n_neighbors", "weights"), ("n_neighbors", "p")}
