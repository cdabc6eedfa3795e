"""The families a comparison tries: an estimator and the space of its parameters each.

::

    {name: estimator | class | factory | "module:Name" | alias}        one candidate each
    {name: (estimator_or_factory, grid)}        a grid, a list of grids or a space (_grids)
    Space / mapping / YAML-TOML file with one top-level choice  ──> one family per option
          (option -> the file's ``estimators:`` entry, else a built-in alias)
                                   │
                                   v
    Family(name, make, space): make(branch-local params) -> a new unfitted estimator

``make`` is a :class:`_Maker`, a small frozen object holding the estimator (a class, a
factory function or an instance, which is cloned): it pickles by reference for classes
and functions of importable modules, and with cloudpickle otherwise, so worker processes
build their own estimators. Every estimator is given a fixed ``random_state`` (the
``seed``, 0 unless the caller passes the run's seed) where it takes one and neither the
user nor the space set it: two runs, and the folds of one candidate, see the same model.

Every bad input raises :class:`~paralela.errors.ConfigError` naming the family, what was
wrong and what to do (an object without ``fit``/``predict``, an unknown alias with the
closest one, a parameter the estimator does not take with the ones it does).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paralela.comparing._grids import GRIDS, grid_space
from paralela.errors import ConfigError, did_you_mean
from paralela.loading import load_object
from paralela.space import (
    Choice,
    Space,
    load_sweep_file,
    sweep_from_dict,
)

__all__ = ["ALIASES", "DEFAULT_SEED", "Family", "families_from", "resolve_estimator"]

DEFAULT_SEED = 0  # random_state given to estimators that take one and were left unseeded

# alias -> (classifier, regressor); None where the alias has no such estimator
ALIASES: dict[str, tuple[str | None, str | None]] = {
    "logreg": ("sklearn.linear_model:LogisticRegression", None),
    "linear": (None, "sklearn.linear_model:LinearRegression"),
    "ridge": ("sklearn.linear_model:RidgeClassifier", "sklearn.linear_model:Ridge"),
    "lasso": (None, "sklearn.linear_model:Lasso"),
    "forest": (
        "sklearn.ensemble:RandomForestClassifier",
        "sklearn.ensemble:RandomForestRegressor",
    ),
    "extra_trees": (
        "sklearn.ensemble:ExtraTreesClassifier",
        "sklearn.ensemble:ExtraTreesRegressor",
    ),
    "gbm": (
        "sklearn.ensemble:HistGradientBoostingClassifier",
        "sklearn.ensemble:HistGradientBoostingRegressor",
    ),
    "boosting": (
        "sklearn.ensemble:HistGradientBoostingClassifier",
        "sklearn.ensemble:HistGradientBoostingRegressor",
    ),
    "svm": ("sklearn.svm:SVC", "sklearn.svm:SVR"),
    "knn": ("sklearn.neighbors:KNeighborsClassifier", "sklearn.neighbors:KNeighborsRegressor"),
    "tree": ("sklearn.tree:DecisionTreeClassifier", "sklearn.tree:DecisionTreeRegressor"),
    "mlp": ("sklearn.neural_network:MLPClassifier", "sklearn.neural_network:MLPRegressor"),
    "naive_bayes": ("sklearn.naive_bayes:GaussianNB", None),
}

_FAMILY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # no dot: it prefixes flat names
_SETTINGS = ("estimators",)  # what a wrapped space file may hold next to params:
_WRAP = (
    "With estimators:, put the choice under params: (params: {model: {type: choice, "
    "...}}, estimators: {option: 'module:Name'})."
)


@dataclass(frozen=True)
class Family:
    """One kind of model a comparison tries.

    Attributes:
        name: the family's name (``"logreg"``, ``"forest"``, ...): the option of the
            space's choice, or the key of the mapping given.
        make: branch-local parameters (``{"C": 0.1}``, not ``{"logreg.C": 0.1}``) ->
            a new unfitted estimator; picklable with cloudpickle.
        space: the family's parameters, branch-local; ``Space(())`` is one candidate,
            the estimator with its defaults.
    """

    name: str
    make: Callable[[dict[str, Any]], Any]
    space: Space


@dataclass(frozen=True)
class _Maker:
    """Builds one family's estimators: ``kind`` is ``"call"`` (a class or a factory,
    called with the parameters as keywords) or ``"clone"`` (an instance, cloned and
    given the parameters with ``set_params``)."""

    family: str
    target: Any
    kind: str
    seed: int
    # Grid values Optuna cannot store (tuples, estimators): param -> {label: value}.
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __call__(self, params: dict[str, Any]) -> Any:
        params = {k: _decoded(self.values.get(k), v) for k, v in params.items()}
        # A parameter inside a nested choice comes as "rbf.gamma": the estimator's is "gamma".
        params = {_leaf(k): v for k, v in params.items()}
        if self.kind == "clone":
            from sklearn.base import clone

            estimator = clone(self.target, safe=False)
            if params:
                estimator.set_params(**params)
        else:
            estimator = self.target(**params)
        if not _is_estimator(estimator):
            raise ConfigError(
                f"Family {self.family!r}: {_describe(self.target)} returned "
                f"{type(estimator).__name__}, which has no fit/predict methods; return an "
                "estimator (an object with fit(X, y) and predict(X))."
            )
        _seed(estimator, params, self.seed)
        return estimator


def _decoded(labels: Mapping[str, Any] | None, value: Any) -> Any:
    if labels is None or not isinstance(value, str):
        return value
    return labels.get(value, value)


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _is_estimator(obj: object) -> bool:
    return callable(getattr(obj, "fit", None)) and callable(getattr(obj, "predict", None))


def _seed(estimator: Any, params: Mapping[str, Any], seed: int) -> None:
    """Set every ``random_state`` left at None (a pipeline's steps' too) to ``seed``."""
    get_params = getattr(estimator, "get_params", None)
    if not callable(get_params) or not callable(getattr(estimator, "set_params", None)):
        return
    try:
        current = get_params(deep=True)
    except TypeError:
        current = get_params()
    unseeded = {
        k: seed
        for k, v in current.items()
        if (k == "random_state" or k.endswith("__random_state")) and v is None and k not in params
    }
    if unseeded:
        estimator.set_params(**unseeded)


def _describe(target: Any) -> str:
    if inspect.isclass(target):
        return f"{target.__module__}.{target.__qualname__}"
    if callable(target) and not _is_estimator(target):
        name = getattr(target, "__qualname__", None) or type(target).__name__
        return f"factory {getattr(target, '__module__', '?')}.{name}"
    return f"{type(target).__name__} instance"


def resolve_estimator(spec: str, *, classification: bool, family: str = "") -> Any:
    """An alias (``"forest"``) or an import path (``"sklearn.svm:SVC"`` or
    ``"sklearn.svm.SVC"``) as the class or factory it names."""
    who = f"Family {family!r}: " if family else ""
    if spec in ALIASES:
        classifier, regressor = ALIASES[spec]
        path = classifier if classification else regressor
        if path is None:
            task = "classification" if classification else "regression"
            other = "regressor" if classification else "classifier"
            fitting = sorted(a for a, pair in ALIASES.items() if pair[0 if classification else 1])
            raise ConfigError(
                f"{who}the alias {spec!r} is a {other}, but the target asks for "
                f"{task}. Aliases for {task}: {', '.join(fitting)}; or name an estimator "
                "with estimators: {" + f"{family or spec}: 'module:Name'" + "}."
            )
        return load_object(path, who=who, dotted=True, search_cwd=False)
    if ":" in spec or "." in spec:
        return load_object(spec, who=who, dotted=True, search_cwd=False)
    hint = did_you_mean(spec, ALIASES)
    raise ConfigError(
        f"{who}unknown estimator alias {spec!r}.{hint} The aliases are: "
        f"{', '.join(ALIASES)}; or name the estimator's class, e.g. "
        "'sklearn.ensemble:GradientBoostingClassifier' (in a space file: "
        "estimators: {" + f"{family or spec}: 'module:Name'" + "})."
    )


# -- the space of one family ---------------------------------------------------------


def _branch_space(option: Any) -> Space:
    if option is None:
        return Space(())
    if isinstance(option, Space):
        return option
    return Space(tuple(option))


def _param_names(space: Space) -> list[str]:
    """The estimator parameters a space sets: leaf names, nested choices walked."""
    names: list[str] = []
    for p in space.params:
        if p.name != GRIDS:  # the choice among a list of grids is no parameter
            names.append(p.name)
        if isinstance(p, Choice):
            for option in p.options.values():
                names.extend(_param_names(_branch_space(option)))
    return names


def _accepted(target: Any, kind: str) -> tuple[set[str] | None, Any]:
    """The parameter names ``target`` takes (None: cannot tell), and a default
    estimator built from it (None when building one needs arguments)."""
    if kind == "clone":
        return _param_keys(target), target
    if inspect.isclass(target):
        try:
            default = target()
        except Exception:  # needs arguments: read the constructor instead
            default = None
        if default is not None:
            keys = _param_keys(default)
            if keys is not None:
                return keys, default
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None, None
    kinds = {p.kind for p in signature.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return None, None
    names = {
        n
        for n, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    return names, None


def _param_keys(estimator: Any) -> set[str] | None:
    get_params = getattr(estimator, "get_params", None)
    if not callable(get_params):
        return None
    try:
        return set(get_params(deep=True))
    except TypeError:
        return set(get_params())


def _family(
    name: object,
    target: Any,
    space: Space,
    seed: int,
    values: Mapping[str, Mapping[str, Any]] | None = None,
) -> Family:
    if not isinstance(name, str) or not _FAMILY_NAME.fullmatch(name):
        raise ConfigError(
            f"Family name {name!r} is not valid: it prefixes parameter names "
            "(forest.n_estimators), so it must start with a letter or '_' and hold only "
            "letters, digits, '_' and '-'. Rename it, e.g. 'forest'."
        )
    if _is_estimator(target) and not inspect.isclass(target):
        kind = "clone"
    elif inspect.isclass(target):
        if not _is_estimator(target):
            raise ConfigError(
                f"Family {name!r}: {_describe(target)} has no fit and predict methods, so "
                "it is not an estimator; give a class with fit(X, y) and predict(X) "
                "(scikit-learn's API), an instance of one, or a function that returns one."
            )
        kind = "call"
    elif callable(target):
        kind = "call"
    else:
        raise ConfigError(
            f"Family {name!r}: {target!r} ({type(target).__name__}) is not an estimator: "
            "it has no fit and predict methods. Give an estimator (an object with "
            "fit(X, y) and predict(X), e.g. sklearn.svm.SVC()), its class, a function "
            "returning one, an alias (forest, svm, ...) or 'module:Name'."
        )
    accepted, default = _accepted(target, kind)
    if default is None and kind == "call" and not inspect.isclass(target):
        default = _try_default(target, name)
    if accepted is not None:
        for param in _param_names(space):
            leaf = _leaf(param)
            if leaf not in accepted:
                hint = did_you_mean(leaf, accepted)
                raise ConfigError(
                    f"Family {name!r}: {_describe(target)} has no parameter {leaf!r}.{hint} "
                    f"Its parameters are: {', '.join(sorted(accepted)) or '(none)'}."
                )
    return Family(name, _Maker(name, target, kind, seed, dict(values or {})), space)


def _try_default(factory: Any, family: str) -> Any:
    """Call a factory whose parameters all have defaults, to check that it returns an
    estimator before any work starts; one that needs arguments is checked when used."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    required = [
        p
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        return None
    try:
        built = factory()
    except Exception as exc:
        raise ConfigError(
            f"Family {family!r}: calling {_describe(factory)}() to check what it returns "
            f"raised {type(exc).__name__}: {exc}. A factory must build an estimator from "
            "its default arguments and the family's parameters."
        ) from exc
    if not _is_estimator(built):
        raise ConfigError(
            f"Family {family!r}: {_describe(factory)} returned {type(built).__name__}, "
            "which has no fit/predict methods; a factory must return an estimator (an "
            "object with fit(X, y) and predict(X))."
        )
    return built


# -- the inputs ----------------------------------------------------------------------


def _from_estimators(
    estimators: Mapping[Any, Any], *, classification: bool, seed: int
) -> list[Family]:
    families = []
    for name, value in estimators.items():
        target, grid = value, None
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ConfigError(
                    f"Family {name!r}: a tuple must be (estimator_or_factory, grid), got "
                    f"{len(value)} items."
                )
            target, grid = value
        if isinstance(target, str):
            target = resolve_estimator(target, classification=classification, family=str(name))
        space, values = grid_space(str(name), grid)
        families.append(_family(name, target, space, seed, values))
    return families


def _choice_of(space: Space, source: str) -> Choice:
    choices = [p for p in space.params if isinstance(p, Choice)]
    others = [p.name for p in space.params if p not in choices]
    if len(choices) != 1 or others:
        found = f"{len(choices)} choices" if len(choices) != 1 else f"also {', '.join(others)}"
        raise ConfigError(
            f"{source}: a comparison's space holds exactly one top-level choice whose "
            f"options are the families ({found}). Write model: {{type: choice, options: "
            "{logreg: {C: ...}, forest: {n_estimators: ...}}}, with every parameter "
            "under its family."
        )
    return choices[0]


def _from_space(
    space: Space,
    estimators: Mapping[str, Any],
    *,
    classification: bool,
    seed: int,
    source: str,
) -> list[Family]:
    choice = _choice_of(space, source)
    options: Mapping[str, Any] = choice.options
    unknown = [k for k in estimators if k not in options]
    if unknown:
        raise ConfigError(
            f"{source}: estimators names {', '.join(map(repr, unknown))}, which is not an "
            f"option of {choice.name!r}; its options are: {', '.join(options)}."
        )
    families = []
    for option, branch in options.items():
        spec = estimators.get(option, option)
        if isinstance(spec, str):
            target = resolve_estimator(spec, classification=classification, family=option)
        else:
            target = spec
        families.append(_family(option, target, _branch_space(branch), seed))
    return families


def _is_space_mapping(data: Mapping[Any, Any]) -> bool:
    if "params" in data:
        return True
    return any(
        isinstance(v, Mapping) and str(v.get("type", "")).lower() == "choice" for v in data.values()
    )


def _estimators_setting(settings: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    unknown = [k for k in settings if k not in _SETTINGS]
    if unknown:
        hint = did_you_mean(str(unknown[0]), _SETTINGS)
        raise ConfigError(
            f"{source}: unknown setting {unknown[0]!r} next to params:.{hint} A comparison's "
            f"file holds params: (the choice of families) and {', '.join(_SETTINGS)}:."
        )
    estimators = settings.get("estimators") or {}
    if not isinstance(estimators, Mapping):
        raise ConfigError(
            f"{source}: estimators: maps an option to 'module:Name', e.g. estimators: "
            "{gbc: 'sklearn.ensemble:GradientBoostingClassifier'}; got "
            f"{estimators!r}."
        )
    return estimators


def families_from(
    estimators_or_space: Any, *, classification: bool, seed: int = DEFAULT_SEED
) -> list[Family]:
    """The families to compare, from any form ``paralela.compare`` accepts.

    Args:
        estimators_or_space: ``{name: estimator}`` (one candidate each: the estimator as
            it is; an instance, a class, a factory function, an alias or
            ``"module:Name"``); ``{name: (estimator_or_factory, grid)}`` with a
            scikit-learn grid (``{"C": [0.1, 1]}``: lists are grid axes; or a list of
            grids, as ``GridSearchCV``'s ``param_grid``) or space-file entries
            (``{"C": {"type": "float", ...}}``); or a :class:`Space`, a mapping in
            the file form or the path of a YAML/TOML file whose one top-level choice names
            the families, each mapped to an estimator by the file's ``estimators:``
            setting or by a built-in alias (:data:`ALIASES`).
        classification: pick aliases' classifiers (True) or regressors (False).
        seed: the ``random_state`` of estimators that take one and leave it unset.

    Raises:
        ConfigError: the input is none of these, an object is not an estimator, an
            alias is unknown, a parameter is not the estimator's, no family is given.
    """
    data = estimators_or_space
    if isinstance(data, (str, os.PathLike)):
        source = str(data)
        try:
            space, settings = load_sweep_file(data)
        except ConfigError as exc:
            if "'estimators'" in str(exc):  # read as a parameter: the file is not wrapped
                raise ConfigError(f"{exc}\n{_WRAP}") from None
            raise
        families = _from_space(
            space,
            _estimators_setting(settings, source),
            classification=classification,
            seed=seed,
            source=source,
        )
    elif isinstance(data, Space):
        families = _from_space(data, {}, classification=classification, seed=seed, source="space")
    elif isinstance(data, Mapping) and _is_space_mapping(data):
        if "estimators" in data and "params" not in data:
            raise ConfigError(f"space: 'estimators' is next to the choice. {_WRAP}")
        space, settings = sweep_from_dict(data, source="space")
        families = _from_space(
            space,
            _estimators_setting(settings, "space"),
            classification=classification,
            seed=seed,
            source="space",
        )
    elif isinstance(data, Mapping):
        families = _from_estimators(data, classification=classification, seed=seed)
    elif isinstance(data, Sequence):
        raise ConfigError(
            "Give the estimators as a mapping of family name to estimator, e.g. "
            "{'logreg': LogisticRegression(), 'forest': RandomForestClassifier()}, not a "
            f"{type(data).__name__}."
        )
    else:
        raise ConfigError(
            "compare takes a mapping of family name to estimator (or to (estimator, grid)), "
            "a Space with one choice, a mapping in the space-file form or the path of a "
            f"YAML/TOML space file; got {type(data).__name__}."
        )
    if not families:
        raise ConfigError(
            "No family to compare: give at least one estimator, e.g. {'forest': 'forest'}."
        )
    return families
