"""A small, deterministic PyTorch training run for the sweep example and demo.

A two-layer perceptron (64 pixels -> ``hidden`` ReLU units -> 10 classes) learns
scikit-learn's digits data set: 1,797 grey 8x8 images of the digits 0-9, shipped inside
scikit-learn (no download). Training uses Adam and cross-entropy on a fixed split of
1,437 training and 360 validation images; the objective is the validation loss (lower
is better), about 2.3 before training and about 0.1 for a good configuration.

Hyperparameters (the keys of ``params``, see :data:`DEFAULT_PARAMS`)::

    lr          learning rate of Adam           float > 0
    hidden      width of the hidden layer       int >= 1
    batch_size  images per optimiser step       int >= 1
    epochs      passes over the training set    int >= 1
    seed        initial weights and batch order int

Determinism: the split is fixed, and ``seed`` sets the initial weights and the batch
order, so the same parameters give the same losses in the same environment (same torch
build and thread count). Torch's global random state and thread count are restored when
:func:`train` returns.

Threads: torch uses ``$OMP_NUM_THREADS`` threads (1 if unset), the count paralela gives
each worker slot. One trial of 8 epochs takes about 0.15 s on one CPU thread (0.06 to
0.25 s across the example's search space), after a one-off start-up of about 3 s per
process: importing torch (1 s) and scikit-learn (0.9 s), and torch.optim's first use,
which imports torch._dynamo (1.2 s). The data stays cached for the next trial in the
same process.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paralela.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_PARAMS", "VALIDATION_SIZE", "train", "train_model"]

DEFAULT_PARAMS: dict[str, Any] = {
    "lr": 0.01,
    "hidden": 64,
    "batch_size": 32,
    "epochs": 8,
    "seed": 0,
}
VALIDATION_SIZE = 360  # images held out for validation: 20 % of the data set
SPLIT_SEED = 0  # the train/validation split; never changes with the trial's seed
PURPOSE = "The digits example"


@dataclass(frozen=True)
class _Config:
    lr: float
    hidden: int
    batch_size: int
    epochs: int
    seed: int


def _positive_int(params: Mapping[str, Any], name: str) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
    return value


def _config(params: Mapping[str, Any]) -> _Config:
    unknown = sorted(set(params) - set(DEFAULT_PARAMS))
    if unknown:
        raise ConfigError(
            f"Unknown parameter(s) {', '.join(map(repr, unknown))} for the digits MLP; "
            f"valid parameters are: {', '.join(DEFAULT_PARAMS)}."
        )
    merged = {**DEFAULT_PARAMS, **params}
    lr = merged["lr"]
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < math.inf:
        raise ConfigError(f"lr must be a positive number, got {lr!r}.")
    seed = merged["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}.")
    return _Config(
        lr=float(lr),
        hidden=_positive_int(merged, "hidden"),
        batch_size=_positive_int(merged, "batch_size"),
        epochs=_positive_int(merged, "epochs"),
        seed=seed,
    )


def _threads() -> int:
    raw = os.environ.get("OMP_NUM_THREADS", "1")
    try:
        threads = int(raw.split(",")[0])  # OpenMP allows a list per nesting level
    except ValueError:
        threads = 0
    if threads < 1:
        raise ConfigError(
            f"OMP_NUM_THREADS={raw!r} is not a positive integer; set it to the number of "
            "threads a trial may use, or unset it for 1."
        )
    return threads


@functools.lru_cache(maxsize=1)
def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training and validation images (scaled to [0, 1]) and labels, once per process."""
    import torch

    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingExtraError("scikit-learn", "examples", PURPOSE) from exc

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0  # pixels are 0..16
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, tr = order[:VALIDATION_SIZE], order[VALIDATION_SIZE:]
    return x[tr], y[tr], x[val], y[val]


def train(
    params: Mapping[str, Any], *, report: Callable[[float, int], None] | None = None
) -> float:
    """Train the MLP with ``params`` and return its final validation loss.

    Args:
        params: hyperparameters; missing keys take their value from
            :data:`DEFAULT_PARAMS`.
        report: called as ``report(val_loss, epoch)`` after each epoch, epochs counted
            from 0 as Optuna's and ``paralela.report``'s steps are. Whatever it raises
            (for instance a sweep's ``TrialPruned``) stops training and propagates.

    Returns:
        The validation loss after the last epoch: mean cross-entropy over the 360
        validation images. It is ``nan`` or ``inf`` if training diverged (a learning
        rate far too high); training then still runs every epoch.

    Raises:
        ConfigError: an unknown parameter, a value out of range, or an invalid
            ``$OMP_NUM_THREADS``.
        MissingExtraError: torch or scikit-learn is not installed.
    """
    config = _config(params)
    threads = _threads()
    try:
        import torch  # noqa: F401  (the extra's message if it is missing)
    except ImportError as exc:
        raise MissingExtraError("torch", "torch", PURPOSE) from exc

    _model, val_loss = _fit(config, threads, report)
    return val_loss


def train_model(params: Mapping[str, Any], *, threads: int = 1) -> torch.nn.Module:
    """Train the MLP with ``params`` on ``threads`` threads and return it (in eval mode).

    The same run as :func:`train`: the same parameters give the same weights in the same
    environment. ``paralela.demos._digits_model`` keeps it as a checkpoint.

    Raises:
        ConfigError: an unknown parameter or a value out of range.
        MissingExtraError: torch or scikit-learn is not installed.
    """
    config = _config(params)
    try:
        import torch  # noqa: F401  (the extra's message if it is missing)
    except ImportError as exc:
        raise MissingExtraError("torch", "torch", PURPOSE) from exc
    model, _val_loss = _fit(config, threads, None)
    return model.eval()


def _fit(
    config: _Config, threads: int, report: Callable[[float, int], None] | None
) -> tuple[torch.nn.Module, float]:
    """The training loop of :func:`train` and :func:`train_model`: the model, and its
    validation loss after the last epoch."""
    import torch
    from torch.nn import functional

    x_train, y_train, x_val, y_val = _data()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = torch.nn.Sequential(
                torch.nn.Linear(x_train.shape[1], config.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(config.hidden, 10),
            )
            optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
            val_loss = math.nan
            for epoch in range(config.epochs):
                order = torch.randperm(len(y_train))
                for batch in torch.split(order, config.batch_size):
                    optimizer.zero_grad()
                    loss = functional.cross_entropy(model(x_train[batch]), y_train[batch])
                    loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch 2.13
                    optimizer.step()
                with torch.no_grad():
                    val_loss = functional.cross_entropy(model(x_val), y_val).item()
                if report is not None:
                    report(val_loss, epoch)
    finally:
        torch.set_num_threads(previous_threads)
    return model, val_loss
