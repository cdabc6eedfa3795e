"""``paralela compare``: cross-validate the families of a space file on a CSV table.

::

    paralela compare space.yaml --data data.csv --target label --cv 5 --n-trials 60
      ──> load_table(data.csv, label) ──> X (float64), y; classes or numbers (--task)
      ──> families_from(space.yaml)    ──> one family per option of the space's choice
      ──> paralela.compare(families, X, y, ...) ──> the best of each family, the top 10,
          where compare.json, leaderboard.csv and best.pkl are; --json: compare.json
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from paralela.cli._app import app
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    INTERRUPTED,
    TERMINATED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
    kept_from_notes,
)
from paralela.cli._options import json_option, progress_option, run_dir_option, workers_option
from paralela.errors import ConfigError

if TYPE_CHECKING:
    from paralela.comparing import CandidateRecord, CompareResult

__all__ = ["TOP", "compare_command"]

TOP = 10  # candidates in the overall leaderboard printed
PRUNERS = ("none", "median", "halving")
TASKS = ("auto", "classification", "regression")

COMPARE_HELP = (
    "Compare model families on a CSV table: every candidate (a family and its "
    "parameters) cross-validated on the same folds, the (candidate, fold) fits spread "
    "over every core, resumable.\n\n"
    "SPACE is a YAML or TOML file with one choice whose options are the families: an "
    "alias (logreg, forest, extra_trees, gbm, svm, knn, tree, mlp, ridge, naive_bayes, "
    "...) or an estimator named in the file's estimators: setting ('module:Name'), each "
    "with the parameters searched for it (see docs/compare.md and "
    "examples/compare_space.yaml).\n\n"
    "Example: paralela compare examples/compare_space.yaml --data wine.csv --target "
    "label --cv 5 --n-trials 60 --pruner median"
)
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "compared (failed candidates are listed, not fatal)"),
    (EXIT_FAILED, "every candidate failed"),
    (
        EXIT_USAGE,
        "bad usage or input (space file, data, target, scoring, a run directory holding "
        "another comparison)",
    ),
    INTERRUPTED,
    TERMINATED,
)
EPILOG = exit_codes_help(EXIT_CODES, "After 130 or 143, run the same command again to go on.")


@app.command(
    "compare",
    help=COMPARE_HELP,
    short_help="Compare model families by cross-validation: leaderboards, best model.",
    epilog=EPILOG,
)
def compare_command(
    space: Annotated[
        Path,
        typer.Argument(metavar="SPACE", help="YAML/TOML file whose choice names the families."),
    ],
    data: Annotated[Path, typer.Option("--data", help="CSV file with a header line (UTF-8).")],
    target: Annotated[str, typer.Option("--target", help="The column to predict.")],
    cv: Annotated[int, typer.Option("--cv", min=2, help="Folds (stratified for classes).")] = 5,
    scoring: Annotated[
        str | None,
        typer.Option(
            help="A scikit-learn scorer name (accuracy, f1_macro, r2, "
            "neg_mean_squared_error...). Default: the estimators' score."
        ),
    ] = None,
    n_trials: Annotated[
        int | None,
        typer.Option(
            "--n-trials",
            min=1,
            help="Candidates to run (needed for continuous parameters, sampled with TPE). "
            "Default: every grid point.",
        ),
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(
            "--time-budget", metavar="SECONDS", min=0.001, help="Start no candidate after this."
        ),
    ] = None,
    sampler: Annotated[
        str | None, typer.Option(help="grid (every grid point), tpe, random, ...")
    ] = None,
    pruner: Annotated[
        str,
        typer.Option(
            help="none; median: stop a candidate below the median after a fold; halving: "
            "successive halving with folds as the resource."
        ),
    ] = "none",
    task: Annotated[
        str,
        typer.Option(
            help="auto: classes when the target is text or has at most 20 whole-number "
            "values; or classification, regression."
        ),
    ] = "auto",
    run_dir: Annotated[
        Path | None, run_dir_option("Default: paralela-runs/compare-<hash>.")
    ] = None,
    refit: Annotated[
        bool,
        typer.Option("--refit/--no-refit", help="Fit the best on all the data: best.pkl."),
    ] = True,
    workers: Annotated[int | None, workers_option("Fits at once. Default: the CPUs.")] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Sampler seed, and the random_state of unseeded estimators (0)."),
    ] = None,
    progress: Annotated[bool | None, progress_option("a line per candidate")] = None,
    json_out: Annotated[bool, json_option("Print compare.json on stdout.")] = False,
) -> None:
    from paralela.comparing import DEFAULT_SEED, families_from, is_classification, load_table

    if pruner.lower() not in PRUNERS:
        fail(f"unknown --pruner {pruner!r}; valid pruners are: {', '.join(PRUNERS)}.", EXIT_USAGE)
    if task.lower() not in TASKS:
        fail(f"unknown --task {task!r}; valid tasks are: {', '.join(TASKS)}.", EXIT_USAGE)
    # estimators: 'mymodels:make_model' in the space file imports from here, as python -m
    # does; the workers receive this sys.path and import it by the same name.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    with handling_errors():
        X, y, _ = load_table(data, target)
        if task.lower() == "regression" and y.dtype.kind in "US":
            raise ConfigError(
                f"--task regression needs a numeric target, but {target!r} holds text "
                f"labels (such as {str(y[0])!r}); use --task classification."
            )
        classification = (
            is_classification(y) if task.lower() == "auto" else task.lower() == "classification"
        )
        families = families_from(
            space, classification=classification, seed=DEFAULT_SEED if seed is None else seed
        )
    import paralela.comparing

    with handling_errors(kept_from_notes("The comparison was interrupted."), say=_in_option_words):
        result = paralela.comparing.compare(
            families,
            X,
            y,
            cv=cv,
            scoring=scoring,
            n_trials=n_trials,
            time_budget=time_budget,
            sampler=sampler,
            pruner=None if pruner.lower() == "none" else pruner.lower(),
            refit=refit,
            run_dir=run_dir,
            workers=workers,
            seed=seed,
            progress=progress,
        )
    if json_out:
        typer.echo((result.run_dir / "compare.json").read_text())
    else:
        _print_result(result, "classification" if classification else "regression")
    _print_warnings(result)
    _report_failures(result)


def _in_option_words(exc: BaseException) -> str:
    """The API's words for the budget, as this command's options."""
    return str(exc).replace("give n_trials or time_budget", "give --n-trials or --time-budget")


def score_text(record: CandidateRecord) -> str:
    """``0.9667 ± 0.0123`` over every fold; ``0.9667 (2/5 folds, pruned)`` for a
    candidate that stopped early (its mean is over the folds it ran, not comparable)."""
    if record.mean is None or math.isnan(record.mean):
        return "-"
    run, total = record.folds_run, len(record.fold_scores)
    if record.state != "COMPLETE" or run < total:
        how = {"PRUNED": "pruned", "FAIL": "failed"}.get(record.state, record.state.lower())
        return f"{record.mean:.4f} ({run}/{total} folds, {how})"
    return f"{record.mean:.4f} ± {record.std or 0.0:.4f}"


WARNING_CHARS = 240  # a warning's message is cut there, on its one line


def _print_warnings(result: CompareResult) -> None:
    """Each distinct warning of the candidates once, on one line with its count, on
    stderr (scikit-learn's nine-line ConvergenceWarning, raised by every fold of every
    candidate that did not converge, was printed by each worker each time)."""
    raised = result.warnings()
    for w in raised:
        message = " ".join(w["message"].split())
        if len(message) > WARNING_CHARS:
            message = message[:WARNING_CHARS].rsplit(" ", 1)[0] + " ..."
        numbers = ", ".join(f"#{n}" for n in w["candidates"][:10])
        more = ", ..." if len(w["candidates"]) > 10 else ""
        times = "once" if w["count"] == 1 else f"{w['count']} times"
        typer.echo(
            f"Warning: {w['category']} ({times}, candidates {numbers}{more}): {message}",
            err=True,
        )
    if raised:
        typer.echo(
            f"paralela compare: each candidate's warnings are in "
            f'{result.run_dir / "compare.json"} (its "warnings").',
            err=True,
        )


def _params(record: CandidateRecord) -> str:
    """The exact parameters, as JSON (copyable)."""
    return json.dumps(record.params, sort_keys=True, default=repr) if record.params else "{}"


def _short(record: CandidateRecord) -> str:
    """The parameters for a table: ``C=155, kernel=rbf``, floats to 4 digits."""
    if not record.params:
        return "(defaults)"
    return ", ".join(f"{k}={_value(v)}" for k, v in sorted(record.params.items()))


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=repr)  # None as null, True as true: as in the file


def _print_result(result: CompareResult, task: str) -> None:
    from rich.console import Console
    from rich.table import Table

    # No markup: parameter values and paths print as they are; soft wrap keeps a long
    # line whole (copyable parameters).
    console = Console(stderr=False, markup=False)
    scoring = result.scoring
    per_family = Table(
        title=f"Best of each family ({task}, {scoring}, {result.n_folds} folds)",
        title_justify="left",
    )
    for column in ("family", "candidate", "mean ± std", "fit s", "state", "params"):
        per_family.add_column(column)
    for family, record in result.families().items():
        per_family.add_row(
            family,
            f"#{record.number}",
            score_text(record),
            f"{record.fit_seconds:.3f}",
            record.state.lower(),
            _short(record),
        )
    console.print(per_family)
    complete = [c for c in result.leaderboard() if c.state == "COMPLETE"]
    board = Table(title=f"Top {min(TOP, len(complete))} of {len(complete)}", title_justify="left")
    for column in ("rank", "candidate", "family", "mean ± std", "fit s", "params"):
        board.add_column(column)
    for rank, record in enumerate(complete[:TOP], 1):
        board.add_row(
            str(rank),
            f"#{record.number}",
            record.family,
            score_text(record),
            f"{record.fit_seconds:.3f}",
            _short(record),
        )
    if board.row_count:
        console.print(board)
    states = {
        s: sum(c.state == s for c in result.candidates) for s in ("COMPLETE", "PRUNED", "FAIL")
    }
    console.print(
        f"{len(result.candidates)} candidates ({states['COMPLETE']} complete, "
        f"{states['PRUNED']} pruned, {states['FAIL']} failed) in "
        f"{result.wall_seconds:.1f} s on {result.slots} slots.",
        soft_wrap=True,
    )
    best = result.best
    if best is not None:
        console.print(
            f"Best: #{best.number} {best.family} {_params(best)}: {scoring} {score_text(best)}",
            soft_wrap=True,
        )
    for note in result.notes:
        console.print(f"Note: {note}", soft_wrap=True)
    root = result.run_dir
    console.print(
        f"Results: {root / 'compare.json'}, {root / 'leaderboard.csv'}, {root / 'best.json'}",
        soft_wrap=True,
    )
    if result.best_estimator is not None:
        console.print(
            f"Best model, refit on all the data: {root / 'best.pkl'} (pickle.load it).",
            soft_wrap=True,
        )
    console.print(f"Report: paralela report {root}", soft_wrap=True)


def _report_failures(result: CompareResult) -> None:
    """Failed candidates on stderr; none complete is exit 1 with the first error."""
    failed = [c for c in result.candidates if c.state == "FAIL"]
    first = failed[0] if failed else None
    detail = (
        ""
        if first is None
        else f" The first, #{first.number} {first.family} {_params(first)}: "
        + _last_line(first.error)
    )
    if result.best is None:
        fail(
            f"no candidate completed ({len(failed)} of {len(result.candidates)} failed).{detail}"
            "\nFix the estimators or the data (fit one by hand) and run again with a new "
            "--run-dir: ended candidates are not run again in the same one.",
            EXIT_FAILED,
        )
    if failed:
        typer.echo(
            f"paralela compare: {len(failed)} of {len(result.candidates)} candidates "
            f"failed.{detail}",
            err=True,
        )


def _last_line(text: Any) -> str:
    line = str(text or "").strip().splitlines()[-1:] or ["(no error recorded)"]
    return line[0][:300]
