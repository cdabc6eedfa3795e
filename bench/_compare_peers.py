"""The engines ``bench_compare.py`` runs, one per child process.

Each ``run_*`` function loads the data, times the search alone and returns a JSON-able
dict: ``wall`` (the search), ``candidates`` (``family``, ``params``, ``mean``,
``folds``...), ``best`` (``family``, ``params``, ``mean``), ``fits`` (fold fits done) and
``notes``. Imports happen before the clock, except where the row says otherwise.
"""

from __future__ import annotations

import inspect
import tempfile
import time
from typing import Any

from _compare_grid import FOLDS, SEED, cv, data, families, family_of, plain

WORKERS = 2


def _records(res: dict[str, Any], family: str | None) -> list[dict[str, Any]]:
    """``cv_results_`` as candidate records; ``family=None``: the Pipeline's ``model`` step."""
    out = []
    for i, params in enumerate(res["params"]):
        fam = family
        if fam is None:
            fam = family_of(params["model"])
            params = {k.split("__", 1)[1]: v for k, v in params.items() if k != "model"}
        rec = {
            "family": fam,
            "params": plain(params),
            "mean": float(res["mean_test_score"][i]),
            "folds": [float(res[f"split{k}_test_score"][i]) for k in range(FOLDS)],
            "fit_s": FOLDS * float(res["mean_fit_time"][i]),
        }
        if "n_resources" in res:
            rec["n_resources"] = int(res["n_resources"][i])
            rec["iter"] = int(res["iter"][i])
        out.append(rec)
    return out


def _busy(cands: list[dict[str, Any]], wall: float) -> dict[str, float]:
    """Seconds of ``fit`` summed over every fold run, and that / (2 x wall)."""
    fit = sum(c.get("fit_s", 0.0) for c in cands)
    return {"fit_s": round(fit, 1), "fit_share": round(fit / (WORKERS * wall), 3)}


def _best(cands: list[dict[str, Any]]) -> dict[str, Any]:
    """The highest mean; on a tie the first in grid order (GridSearchCV's rule)."""
    top = max(c["mean"] for c in cands)
    first = next(c for c in cands if c["mean"] == top)
    return {"family": first["family"], "params": first["params"], "mean": first["mean"]}


def run_gscv_family(quick: bool) -> dict[str, Any]:
    """GridSearchCV(n_jobs=2, refit=False), one family after another; best of the bests."""
    from sklearn.model_selection import GridSearchCV

    X, y = data()
    cands: list[dict[str, Any]] = []
    per_family: dict[str, float] = {}
    t0 = time.perf_counter()
    for name, (est, grid) in families(quick).items():
        t = time.perf_counter()
        gs = GridSearchCV(est, grid, cv=cv(), scoring="accuracy", n_jobs=WORKERS, refit=False)
        gs.fit(X, y)
        per_family[name] = time.perf_counter() - t
        cands += _records(gs.cv_results_, name)
    wall = time.perf_counter() - t0
    notes = {"per_family_s": {k: round(v, 2) for k, v in per_family.items()}, **_busy(cands, wall)}
    return {"wall": wall, "candidates": cands, "best": _best(cands), "fits": len(cands) * FOLDS,
            "notes": notes}  # fmt: skip


def run_gscv_pipeline(quick: bool) -> dict[str, Any]:
    """One GridSearchCV over Pipeline([("model", ...)]) with a list of param grids."""
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    X, y = data()
    fams = families(quick)
    param_grid = [
        {"model": [est], **{f"model__{k}": v for k, v in grid.items()}}
        for est, grid in fams.values()
    ]
    first = next(iter(fams.values()))[0]
    gs = GridSearchCV(
        Pipeline([("model", first)]), param_grid, cv=cv(), scoring="accuracy",
        n_jobs=WORKERS, refit=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    gs.fit(X, y)
    wall = time.perf_counter() - t0
    cands = _records(gs.cv_results_, None)
    return {"wall": wall, "candidates": cands, "best": _best(cands), "fits": len(cands) * FOLDS,
            "notes": _busy(cands, wall)}  # fmt: skip


def run_halving(quick: bool) -> dict[str, Any]:
    """HalvingGridSearchCV(n_jobs=2, factor=3, resource n_samples), family by family.

    The overall pick is the family whose winner has the highest ``best_score_`` (what a
    user sees); that score comes from the last rung, on that rung's samples.
    """
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import HalvingGridSearchCV

    X, y = data()
    cands: list[dict[str, Any]] = []
    winners: list[dict[str, Any]] = []
    per_family: dict[str, Any] = {}
    t0 = time.perf_counter()
    for name, (est, grid) in families(quick).items():
        t = time.perf_counter()
        hs = HalvingGridSearchCV(
            est, grid, cv=cv(), scoring="accuracy", n_jobs=WORKERS, factor=3,
            resource="n_samples", refit=False, random_state=SEED,
        )  # fmt: skip
        hs.fit(X, y)
        recs = _records(hs.cv_results_, name)
        cands += recs
        best = recs[int(hs.best_index_)]
        winners.append({"family": name, "params": best["params"], "mean": best["mean"]})
        per_family[name] = {
            "s": round(time.perf_counter() - t, 2),
            "rungs": [int(r) for r in hs.n_resources_],
            "candidates": [int(c) for c in hs.n_candidates_],
        }
    wall = time.perf_counter() - t0
    best = max(winners, key=lambda w: w["mean"])  # first on a tie, in family order
    return {"wall": wall, "candidates": cands, "best": best, "fits": len(cands) * FOLDS,
            "notes": {"per_family": per_family, **_busy(cands, wall)}}  # fmt: skip


# ------------------------------------------------------------------------- paralela

PARALELA_VARIANTS: dict[str, dict[str, Any]] = {
    "grid": {},
    "median": {"pruner": "median"},
    "halving": {"halving": True},
}


def run_paralela(quick: bool, variant: str) -> dict[str, Any]:
    """``paralela.compare`` over the same families, exhaustive grid, with or without pruning."""
    try:
        import paralela

        compare = paralela.compare  # type: ignore[attr-defined]
    except (ImportError, AttributeError) as exc:
        return {"unavailable": f"paralela.compare does not import yet ({exc})"}
    accepted = inspect.signature(compare).parameters
    extra = PARALELA_VARIANTS[variant]
    missing = [k for k in extra if k not in accepted]
    if missing:
        return {"unavailable": f"paralela.compare takes no {', '.join(missing)}"}
    X, y = data()
    fams = families(quick)
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        kwargs: dict[str, Any] = {
            "cv": cv(), "scoring": "accuracy", "sampler": "grid", "refit": False,
            "run_dir": tmp + "/run", "workers": WORKERS, "seed": SEED, "progress": False,
            **extra,
        }  # fmt: skip
        dropped = sorted(k for k in kwargs if k not in accepted)
        for k in dropped:
            del kwargs[k]
        t0 = time.perf_counter()
        result = compare(fams, X, y, **kwargs)
        wall = time.perf_counter() - t0
    cands, states = [], {}
    for c in result.candidates:
        states[c.state] = states.get(c.state, 0) + 1
        folds = [None if s is None else float(s) for s in c.fold_scores]
        ran = sum(f is not None for f in folds)
        cands.append({"family": c.family, "params": plain(dict(c.params)),
                      "mean": None if c.mean is None else float(c.mean),
                      "folds": folds, "state": c.state,
                      "fit_s": float(c.fit_seconds) * ran})  # fmt: skip
    b = result.best
    notes = {
        "states": states,
        "wall_seconds (its own)": round(float(result.wall_seconds), 2),
        **_busy(cands, wall),
        "kwargs": {k: str(v) for k, v in kwargs.items() if k not in ("run_dir", "cv")},
    }
    if dropped:
        notes["not accepted"] = dropped
    fits = sum(1 for c in cands for s in c["folds"] if s is not None)
    best = {"family": b.family, "params": plain(dict(b.params)), "mean": float(b.mean)}
    return {"wall": wall, "candidates": cands, "best": best, "fits": fits, "notes": notes}
