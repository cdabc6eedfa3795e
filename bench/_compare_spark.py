"""Spark MLlib's ``CrossValidator(parallelism=2)`` on ``local[2]``: the MLlib families.

The MLlib equivalents of ``_compare_grid``'s families, as near as MLlib has them:

- logreg: ``LogisticRegression(family="multinomial", standardization=False)``, sklearn's
  ``C`` as ``regParam = 1 / (C x n_train)`` (the same L2 objective, scaled);
- forest: ``RandomForestClassifier(numTrees, maxDepth)``, ``max_depth=None`` as MLlib's
  deepest, 30;
- mlp: ``MultilayerPerceptronClassifier(layers=[64, h, 10])``; MLlib has no L2 penalty
  (``alpha``), so ``maxIter`` 100/200 takes its place;
- svm: ``OneVsRest(LinearSVC)``, ``regParam = 1 / (C x n_train)``; MLlib has no kernel
  SVM, so the kernels are gone and only ``C`` remains; only with ``--mllib-svm``;
- gbm: ``OneVsRest(GBTClassifier)`` (GBTClassifier is binary only), only with
  ``--mllib-gbt``.

svm and gbm are left out by default for their cost: each is 10 binary models per fit,
and each step of each is a Spark job (see the results' notes for the figures).

Folds: a ``fold`` column holding each row's ``StratifiedKFold(5)`` test fold
(``CrossValidator(foldCol="fold")``), so MLlib scores the same folds as the others;
its models differ, so its scores are its own. ``CrossValidator`` always refits the best
param map on all the data at the end (one fit per family; no switch turns it off).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from _compare_grid import FOLDS, SEED, cv, data, grids

WORKERS = 2


def _n_train(n: int) -> float:
    return n * (FOLDS - 1) / FOLDS


def _families(quick: bool, n: int, gbt: bool, svm: bool) -> dict[str, tuple[Any, Any]]:
    """``{name: (estimator, ParamGridBuilder)}``."""
    from pyspark.ml.classification import (
        GBTClassifier,
        LinearSVC,
        LogisticRegression,
        MultilayerPerceptronClassifier,
        OneVsRest,
        RandomForestClassifier,
    )
    from pyspark.ml.tuning import ParamGridBuilder

    g = grids(quick)
    nt = _n_train(n)
    out: dict[str, tuple[Any, Any]] = {}

    iters = 10 if quick else 100  # MLlib's default maxIter; --quick: only to see it works
    lr = LogisticRegression(family="multinomial", maxIter=iters, standardization=False)
    regs = [1.0 / (c * nt) for c in g["logreg"]["C"]]
    out["logreg"] = (lr, ParamGridBuilder().addGrid(lr.regParam, regs))

    rf = RandomForestClassifier(seed=SEED)
    depths = [30 if d is None else d for d in g["forest"]["max_depth"]]
    out["forest"] = (
        rf,
        ParamGridBuilder()
        .addGrid(rf.numTrees, g["forest"]["n_estimators"])
        .addGrid(rf.maxDepth, depths),
    )

    if gbt:
        gb = GBTClassifier(seed=SEED)
        out["gbm"] = (
            OneVsRest(classifier=gb),
            ParamGridBuilder()
            .addGrid(gb.stepSize, g["gbm"]["learning_rate"])
            .addGrid(gb.maxIter, g["gbm"]["max_iter"]),
        )

    if svm:
        svc = LinearSVC(maxIter=iters)
        regs = [1.0 / (c * nt) for c in g["svm"]["C"]]
        out["svm"] = (OneVsRest(classifier=svc), ParamGridBuilder().addGrid(svc.regParam, regs))

    mlp = MultilayerPerceptronClassifier(seed=SEED)
    layers = [[64, h, 10] for h in g["mlp"]["hidden_layer_sizes"]]
    out["mlp"] = (
        mlp,
        ParamGridBuilder().addGrid(mlp.layers, layers).addGrid(mlp.maxIter, [iters, 2 * iters]),
    )
    return out


MAPS = 2  # param maps run per family: the grid's first and last (both slots busy)


def _subset(maps: list[Any]) -> list[Any]:
    """The first and the last param map: the cheapest and dearest corners of most grids."""
    return maps if len(maps) <= MAPS else [maps[0], maps[-1]]


def run_mllib(quick: bool, gbt: bool = False, svm: bool = False) -> dict[str, Any]:
    """Time import + SparkSession (the JVM), the DataFrame, and each family's CV fit."""
    t_start = time.perf_counter()
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.linalg import Vectors
    from pyspark.ml.tuning import CrossValidator
    from pyspark.sql import SparkSession

    t_import = time.perf_counter() - t_start
    t = time.perf_counter()
    spark = (
        SparkSession.builder.master(f"local[{WORKERS}]")
        .appName("bench-compare")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    t_session = time.perf_counter() - t
    X, y = data()
    fold = [0] * len(y)
    for k, (_, test) in enumerate(cv().split(X, y)):
        for i in test:
            fold[int(i)] = k
    t = time.perf_counter()
    rows = [(Vectors.dense(x.tolist()), float(y[i]), fold[i]) for i, x in enumerate(X)]
    df = spark.createDataFrame(rows, ["features", "label", "fold"]).cache()
    df.count()
    t_data = time.perf_counter() - t

    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    cands: list[dict[str, Any]] = []
    per_family: dict[str, dict[str, Any]] = {}
    fits, full_fits, projected = 0, 0, 0.0
    t0 = time.perf_counter()
    for name, (est, builder) in _families(quick, len(y), gbt, svm).items():
        every = builder.build()
        maps = _subset(every)
        t = time.perf_counter()
        cvm = CrossValidator(
            estimator=est, estimatorParamMaps=maps, evaluator=evaluator, numFolds=FOLDS,
            parallelism=WORKERS, foldCol="fold", seed=SEED,
        ).fit(df)  # fmt: skip
        took = time.perf_counter() - t
        # Linear in fits: FOLDS per param map, and CrossValidator's refit of the best.
        scale = (len(every) * FOLDS + 1) / (len(maps) * FOLDS + 1)
        per_family[name] = {"s": round(took, 2), "maps": f"{len(maps)} of {len(every)}",
                            "projected_s": round(took * scale, 1)}  # fmt: skip
        print(f"mllib {name}: {took:.1f} s, {per_family[name]}", file=sys.stderr, flush=True)
        fits += len(maps) * FOLDS + 1
        full_fits += len(every) * FOLDS + 1
        projected += took * scale
        for pm, mean in zip(maps, cvm.avgMetrics, strict=True):
            params = {p.name: (round(v, 8) if isinstance(v, float) else v) for p, v in pm.items()}
            cands.append({"family": name, "params": params, "mean": float(mean)})
    wall = time.perf_counter() - t0
    spark.stop()
    top = max(c["mean"] for c in cands)
    best = next(c for c in cands if c["mean"] == top)
    startup = t_import + t_session + t_data
    notes = {
        "import_s": round(t_import, 2),
        "session_s (JVM start)": round(t_session, 2),
        "dataframe_s": round(t_data, 2),
        "per_family_s": per_family,
        "gbt": gbt,
        "svm": svm,
        "measured_s (the subset)": round(wall, 2),
    }
    return {"wall": projected, "startup": startup, "candidates": cands, "subset": True,
            "best": {"family": best["family"], "params": best["params"], "mean": best["mean"]},
            "fits": f"{fits} run ({full_fits} projected)", "notes": notes,
            "families": list(per_family)}  # fmt: skip
