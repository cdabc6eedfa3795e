"""``paralela demo``: see what paralela does on this machine, in a few seconds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from paralela.cli._app import app
from paralela.cli._compare import score_text
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WORKER_DIED,
    INTERRUPTED,
    TERMINATED,
    ExitCodes,
    exit_codes_help,
    fail,
    handling_errors,
)
from paralela.cli._options import run_dir_option, workers_option
from paralela.errors import ConfigError, MissingExtraError

# A step that needs an extra that is not installed: bad usage (install it, or skip the
# step), as the epilog says.
EXIT_CODES: ExitCodes = (
    (EXIT_OK, "ok"),
    (
        EXIT_FAILED,
        "the parallel results differ from the serial ones, or a part failed (its error is printed)",
    ),
    (EXIT_USAGE, "bad usage (a missing extra: the line says which to install)"),
    (EXIT_WORKER_DIED, "a worker of the map or of the prediction died too often"),
    INTERRUPTED,
    TERMINATED,
)
NEEDS_EXTRA = ((MissingExtraError, EXIT_USAGE),)

DEMO_HELP = (
    "Run a data-parallel map, a hyperparameter sweep and a data-parallel training, and "
    "show what they measured.\n\n"
    "Extracts 36 spectral and statistical features from synthetic sensor recordings, "
    "once on one core and once with paralela.map on every usable CPU, checks that both "
    "give the same features, and prints the times, the speed-up and how busy the "
    "workers were. Then tunes a small PyTorch MLP on scikit-learn's digits data set "
    "with paralela.sweep: one trial per slot, median pruning, and trains it with 2 "
    "data-parallel ranks started by paralela launch (DDP), and classifies the digits "
    "with the trained MLP through paralela.predict on every worker, checking the "
    "predictions against a serial loop; then serves it with paralela serve, queried by "
    "concurrent clients, and stops it. Takes about 40-50 s on 2 cores.\n\n"
    "Each step keeps its run directory under one demo directory (map/, sweep/, compare/, "
    "launch/, predict/, serve/); "
    "the demo ends by writing their HTML report there (paralela report) and printing "
    "its file:// URL."
)


@app.command(
    help=DEMO_HELP,
    short_help="Run a map, a sweep, a 2-rank training, a batch prediction and a model "
    "server, and show what they measured.",
    epilog=exit_codes_help(EXIT_CODES),
)
def demo(
    items: Annotated[
        int | None,
        typer.Option("--items", "-n", min=1, help="Recordings to process. Default: 400."),
    ] = None,
    workers: Annotated[
        int | None,
        workers_option("Worker processes for the parallel run. Default: every usable CPU."),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(
            "--trials",
            min=0,
            help="Trials of the sweep step (a PyTorch MLP on digits); 0 skips it.",
        ),
    ] = 12,
    folds: Annotated[
        int,
        typer.Option(
            "--folds",
            min=0,
            help="Folds of the compare step (4 model families on digits, cross-validated "
            "with paralela.compare); 0 skips it.",
        ),
    ] = 5,
    ranks: Annotated[
        int,
        typer.Option(
            "--ranks",
            min=0,
            help="Ranks of the data-parallel training step (DDP on digits); 0 skips it.",
        ),
    ] = 2,
    images: Annotated[
        int,
        typer.Option(
            "--images",
            min=0,
            help="Images of the predict step (the digits MLP with paralela.predict); "
            "0 skips it. Default: all 1,797.",
            show_default=False,
        ),
    ] = 1797,
    requests: Annotated[
        int,
        typer.Option(
            "--requests",
            min=0,
            help="Requests of the serve step (the digits MLP behind paralela serve, 16 "
            "clients); 0 skips it.",
        ),
    ] = 300,
    run_dir: Annotated[
        Path | None,
        run_dir_option(
            "Where the steps keep their runs and the report goes (a new directory). "
            "Default: paralela-runs/demo-<time>."
        ),
    ] = None,
) -> None:
    """Run the map demo (:func:`paralela.demos.run_map_demo`) and print what it measured."""
    from rich.console import Console
    from rich.table import Table

    from paralela.demos import DEFAULT_ITEMS, run_map_demo

    n = DEFAULT_ITEMS if items is None else items
    console = Console(highlight=False)
    directory = _demo_dir(run_dir)
    # torch makes an (empty) compiler cache directory in TMPDIR when an optimizer is
    # created, in the sweep's trials and the training's ranks; the demo keeps what it
    # makes in its own directory instead, so that it leaves nothing in /tmp.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(directory / ".torch-cache"))
    console.print(
        f"[bold]paralela demo[/bold]: extracting features from {n} synthetic sensor "
        "recordings, serially and then in parallel..."
    )
    with handling_errors():
        result = run_map_demo(n, workers, run_dir=directory / "map")

    table = Table(title="Data-parallel map: feature extraction", title_justify="left")
    table.add_column("items", justify="right")
    table.add_column("serial s", justify="right")
    table.add_column("parallel s", justify="right")
    table.add_column("speed-up", justify="right")
    table.add_column("workers", justify="right")
    table.add_column("busy", justify="right")
    table.add_row(
        str(result.items),
        f"{result.serial_seconds:.2f}",
        f"{result.parallel_seconds:.2f}",
        f"{result.speedup:.2f}x",
        str(result.workers),
        f"{result.busy_fraction:.0%}",
    )
    console.print(table)
    console.print(f"Summary: {result.summary}")
    console.print(
        f"Speed-up: {result.speedup:.2f}x on {result.workers} workers "
        f"(ideal {result.ideal_speedup:.0f}x; parallel time includes starting the workers)."
    )
    if not result.results_equal:
        fail("Results equal: no. The parallel features differ from the serial ones.", EXIT_FAILED)
    console.print(
        f"Results equal: yes ({result.items} x {result.features} features, serial == parallel)."
    )
    if trials > 0:
        _sweep_step(console, trials, workers, directory / "sweep")
    if folds > 0:
        _compare_step(console, folds, workers, directory / "compare")
    if ranks > 0:
        _training_step(console, ranks, directory / "launch")
    if images > 0:
        _predict_step(console, images, workers, directory / "predict")
    if requests > 0:
        _serve_step(console, requests, directory / "predict" if images > 0 else directory / "serve")
    _report_step(console, directory)


def _demo_dir(run_dir: Path | None) -> Path:
    """A new directory for the demo's runs: ``run_dir``, or paralela-runs/demo-<time>."""
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path("paralela-runs") / f"demo-{stamp}-{os.getpid()}"
    if run_dir.exists() and any(run_dir.iterdir()):
        fail(
            f"--run-dir {run_dir} is not empty; the demo needs a new directory (its map "
            "would resume from an earlier run). Give another, or leave it out.",
            EXIT_USAGE,
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"Cannot create the demo's directory {run_dir}: {exc.strerror}.", EXIT_USAGE)
    return run_dir.resolve()


def _report_step(console: Any, directory: Path) -> None:
    """Write the report of every step that ran and print its URL."""
    from paralela.reporting import write_report

    with handling_errors(
        codes=((ConfigError, EXIT_FAILED),),
        say=lambda exc: f"The report could not be written: {exc}",
    ):
        written = write_report(directory)
    for problem in written.problems:
        console.print(f"Note: {problem}", markup=False)
    console.print(
        f"\n[bold]Report[/bold] of the {len(written.runs)} run(s) above that keep a run "
        "directory (map, sweep, comparison, training): timelines, busy time per worker, "
        "where the time went, the sweep's and the comparison's leaderboards and plots."
    )
    console.print(f"Report: {written.url}", soft_wrap=True, markup=False, highlight=False)


def _sweep_step(console: Any, trials: int, workers: int | None, run_dir: Path) -> None:
    """The sweep step: tune the digits MLP, one trial per slot, with median pruning."""
    from rich.table import Table

    from paralela.demos import run_sweep_demo

    console.print(
        f"\n[bold]Hyperparameter sweep[/bold]: {trials} trials of a PyTorch MLP on the "
        "digits data set (learning rate, width, batch size), one trial per slot, "
        "hopeless trials pruned..."
    )
    with handling_errors(codes=NEEDS_EXTRA):
        sweep = run_sweep_demo(trials, workers, run_dir=run_dir)
    table = Table(title="Sweep: digits MLP", title_justify="left")
    for column in ("trials", "complete", "pruned", "failed", "slots", "wall s", "slots busy"):
        table.add_column(column, justify="right")
    table.add_row(
        str(sweep.trials),
        str(sweep.complete),
        str(sweep.pruned),
        str(sweep.failed),
        str(sweep.slots),
        f"{sweep.wall_seconds:.1f}",
        f"{sweep.busy_fraction:.0%}",
    )
    console.print(table)
    if sweep.best_value is None:
        fail("No trial of the sweep completed; see the logs in " + str(sweep.run_dir), EXIT_FAILED)
    console.print(
        f"Best validation loss {sweep.best_value:.4f} with {sweep.best_params} "
        f"(trials, logs and plots in {sweep.run_dir})."
    )


def _compare_step(console: Any, folds: int, workers: int | None, run_dir: Path) -> None:
    """The compare step: model families cross-validated together, checked serially."""
    from rich.table import Table

    from paralela.demos import run_compare_demo

    console.print(
        f"\n[bold]Model comparison[/bold]: logistic regression, k-nearest neighbours, a "
        f"random forest and an SVM, each with its grid, {folds}-fold cross-validated on "
        "digits, every (candidate, fold) pair a task on the slots..."
    )
    with handling_errors(codes=NEEDS_EXTRA):
        run = run_compare_demo(folds, workers, run_dir=run_dir)
    table = Table(title="Comparison: best of each family", title_justify="left")
    for column in ("family", "accuracy", "± std", "parameters"):
        table.add_column(column, justify="left" if column in ("family", "parameters") else "right")
    ranked = sorted(run.best_by_family.items(), key=lambda kv: -(kv[1].mean or 0.0))
    for family, record in ranked:
        shown = ", ".join(f"{k}={v}" for k, v in record.params.items())
        # a pruned best ran fewer folds: its spread is not comparable, say so instead
        mean, _, spread = score_text(record).partition(" ")
        table.add_row(family, mean, spread.removeprefix("± "), shown)
    console.print(table)
    console.print(
        f"{run.candidates} candidates x {run.folds} folds on {run.slots} slots in "
        f"{run.wall_seconds:.1f} s (the best one refit on all the data; leaderboard, "
        f"best.json and best.pkl in {run.run_dir}).",
        soft_wrap=True,
    )
    if run.best_family is None:
        fail("No candidate of the comparison completed; see " + str(run.run_dir), EXIT_FAILED)
    if not run.scores_equal:
        fail(
            f"Scores equal: no. paralela.compare's fold scores of the best candidate "
            f"({run.paralela_scores}) differ from cross_val_score's ({run.serial_scores}).",
            EXIT_FAILED,
        )
    console.print(
        f"Scores equal: yes (the best, {run.best_family} {run.best_params}, scores "
        f"{run.best_mean:.4f} in both paralela.compare and a serial cross_val_score)."
    )


def _training_step(console: Any, ranks: int, log_dir: Path) -> None:
    """The training step: ``ranks`` processes train the digits MLP with all-reduce."""
    from rich.table import Table

    from paralela.demos import run_ddp_demo
    from paralela.errors import DistributedError

    console.print(
        f"\n[bold]Data-parallel training[/bold]: paralela launch starts {ranks} ranks that "
        "train the MLP together (PyTorch DDP: each rank a share of every epoch, gradients "
        "averaged with all-reduce)..."
    )
    with handling_errors(codes=(*NEEDS_EXTRA, (DistributedError, EXIT_FAILED))):
        run = run_ddp_demo(ranks, log_dir=log_dir)
    table = Table(title="Training: digits MLP, DDP", title_justify="left")
    for column in ("ranks", "epochs", "val accuracy", "val loss", "wall s"):
        table.add_column(column, justify="right")
    table.add_row(
        str(run.ranks),
        str(run.epochs),
        f"{run.accuracy:.1%}",
        f"{run.val_loss:.4f}",
        f"{run.wall_seconds:.1f}",
    )
    console.print(table)
    console.print(f"Each rank's log: {run.log_dir}")


def _predict_step(console: Any, images: int, workers: int | None, directory: Path) -> None:
    """The predict step: the digits MLP over the images, serially and with predict."""
    from rich.table import Table

    from paralela.demos import run_predict_demo

    console.print(
        f"\n[bold]Batch prediction[/bold]: the digits MLP classifies {images} images, in a "
        "serial loop and with paralela.predict (each worker loads the model once)..."
    )
    with handling_errors(codes=NEEDS_EXTRA):
        run = run_predict_demo(images, workers, run_dir=directory)
    table = Table(title="Prediction: digits MLP", title_justify="left")
    for column in ("images", "workers", "shards", "serial s", "predict s", "images/s",
                   "accuracy"):  # fmt: skip
        table.add_column(column, justify="right")
    table.add_row(
        str(run.images),
        str(run.workers),
        str(run.shards),
        f"{run.serial_seconds:.2f}",
        f"{run.parallel_seconds:.2f}",
        f"{run.parallel_rate:,.0f}",
        f"{run.accuracy:.1%}",
    )
    console.print(table)
    console.print(
        f"paralela.predict: {run.parallel_rate:,.0f} records/s, starting {run.workers} "
        f"workers and writing {run.shards} part files included (the serial loop, the "
        f"model already loaded: {run.serial_rate:,.0f} records/s; a model this small is "
        "worth spreading over workers only for far more images). Outputs in "
        f"{run.output}. The accuracy is over all the images, 1,437 of which the MLP "
        "trained on.",
        soft_wrap=True,
    )
    if run.agree != run.images:
        fail(
            f"Predictions equal: no. {run.images - run.agree} of {run.images} predictions "
            "of paralela.predict differ from the serial loop's.",
            EXIT_FAILED,
        )
    console.print(
        f"Predictions equal: yes ({run.images} of {run.images} images, paralela.predict "
        "== serial loop)."
    )


def _serve_step(console: Any, requests: int, directory: Path) -> None:
    """The serve step: the digits MLP behind ``paralela serve``, queried, stopped."""
    from rich.table import Table

    from paralela.demos import run_serve_demo

    clients = 16
    console.print(
        f"\n[bold]Serving[/bold]: paralela serve starts the digits MLP behind HTTP on "
        f"127.0.0.1; {clients} clients send {requests} images, then SIGTERM stops it..."
    )
    with handling_errors(codes=(*NEEDS_EXTRA, (RuntimeError, EXIT_FAILED))):
        run = run_serve_demo(requests, clients, run_dir=directory)
    table = Table(title="Serving: digits MLP over HTTP", title_justify="left")
    for column in ("requests", "clients", "start s", "req/s", "p50 ms", "p99 ms", "mean batch"):
        table.add_column(column, justify="right")
    table.add_row(
        str(run.requests),
        str(run.clients),
        f"{run.start_seconds:.1f}",
        f"{run.rate:,.0f}",
        f"{run.p50_ms:.1f}",
        f"{run.p99_ms:.1f}",
        f"{run.mean_batch:.1f}",
    )
    console.print(table)
    console.print(
        f"paralela serve on {run.url}: one model worker; the server grouped the concurrent "
        f"requests into batches of {run.mean_batch:.1f} images on average (dynamic "
        f"batching); it drained and exited with status {run.exit_code} on SIGTERM.",
        soft_wrap=True,
    )
    if run.agree != run.requests or run.exit_code != 0:
        fail(
            f"Answers equal: {'no' if run.agree != run.requests else 'yes'}. "
            f"{run.requests - run.agree} of {run.requests} answers differ from the model's "
            f"own; the server exited with {run.exit_code}.",
            EXIT_FAILED,
        )
    console.print(
        f"Answers equal: yes ({run.requests} of {run.requests}, each == the model's own "
        "answer for its image alone)."
    )
