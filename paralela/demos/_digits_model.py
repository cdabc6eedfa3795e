"""The digits MLP as a model class for ``paralela.predict`` and ``paralela serve``.

::

    DigitsClassifier().setup(device)
      checkpoint_path(): $PARALELA_DIGITS_CHECKPOINT, else paralela-runs/digits-mlp.pt
      ├ there: load its weights                       (a few ms)
      └ not:   train_model(DEFAULT_PARAMS) on 1 thread, seeded (about 1 s; the same
               weights every time), save it atomically: workers that train at once
               write the same file, and a reader never sees half of one
    .predict([[64 pixels], ...]) ──> [{"label": 3, "probabilities": [10 floats]}, ...]

A record is one 8x8 image as 64 numbers from 0 (white) to 16 (black), row by row: a row
of scikit-learn's ``load_digits().data``. :func:`validation_set` gives the 360 images
the MLP never trained on, with their labels.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralela.demos._digits import DEFAULT_PARAMS, PURPOSE, _data, train_model
from paralela.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHECKPOINT_ENV",
    "PIXELS",
    "DigitsClassifier",
    "checkpoint_path",
    "digits_set",
    "validation_set",
]

CHECKPOINT_ENV = "PARALELA_DIGITS_CHECKPOINT"
DEFAULT_CHECKPOINT = Path("paralela-runs") / "digits-mlp.pt"  # relative to the working dir
PIXELS = 64  # 8 x 8
MAX_PIXEL = 16.0  # load_digits' darkest value; the MLP sees pixels / 16


def checkpoint_path() -> Path:
    """Where the weights are: ``$PARALELA_DIGITS_CHECKPOINT``, else
    ``paralela-runs/digits-mlp.pt`` in the current directory."""
    return Path(os.environ.get(CHECKPOINT_ENV) or DEFAULT_CHECKPOINT)


def validation_set() -> tuple[list[list[float]], list[int]]:
    """The 360 held-out images as records (64 pixels from 0 to 16) and their labels."""
    _x_train, _y_train, x_val, y_val = _data()
    pixels: list[list[float]] = (x_val * MAX_PIXEL).round().tolist()
    labels: list[int] = y_val.tolist()
    return pixels, labels


def digits_set() -> tuple[list[list[float]], list[int]]:
    """All 1,797 images of the data set as records, in its order, and their labels
    (1,437 of them are the MLP's training images)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingExtraError("scikit-learn", "examples", PURPOSE) from exc
    images, labels = load_digits(return_X_y=True)
    return images.tolist(), labels.tolist()


class DigitsClassifier:
    """The digits MLP: 64 pixels (0 to 16) -> the digit and the probability of each.

    ``predict`` takes lists of 64 numbers, or objects holding one as ``.root`` (a pydantic
    ``RootModel``, as an ``input_model`` makes them).
    """

    def setup(self, device: str) -> None:
        """Load the checkpoint onto ``device``, training and saving it first if there is none.

        Raises:
            ConfigError: the checkpoint holds weights of another shape.
            MissingExtraError: torch or scikit-learn is not installed.
            OSError: the checkpoint cannot be read or written.
        """
        try:
            import torch
        except ImportError as exc:
            raise MissingExtraError("torch", "torch", PURPOSE) from exc
        path = checkpoint_path()
        if not path.exists():
            save_checkpoint(path, train_model(DEFAULT_PARAMS, threads=1))
        self.model = _build(int(DEFAULT_PARAMS["hidden"]))
        state = torch.load(path, map_location="cpu", weights_only=True)
        try:
            self.model.load_state_dict(state)
        except RuntimeError as exc:
            raise ConfigError(
                f"The checkpoint {path} does not hold the digits MLP (64 -> "
                f"{DEFAULT_PARAMS['hidden']} -> 10): {str(exc).splitlines()[0]} Delete it "
                f"to train a new one, or point ${CHECKPOINT_ENV} at another."
            ) from None
        self.model.to(device).eval()
        self.device = device

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        """The most likely digit and the 10 probabilities of each image, in order.

        Raises:
            ValueError: an image is not 64 numbers.
        """
        import torch

        rows = [getattr(image, "root", image) for image in batch]
        for row in rows:
            if not isinstance(row, list | tuple) or len(row) != PIXELS:
                raise ValueError(
                    f"An image is {PIXELS} numbers from 0 to 16 (8x8, row by row); got "
                    f"{str(row)[:60]}."
                )
        x = torch.tensor(rows, dtype=torch.float32, device=self.device) / MAX_PIXEL
        with torch.no_grad():
            probabilities = torch.softmax(self.model(x), dim=1).cpu()
        return [{"label": int(p.argmax()), "probabilities": p.tolist()} for p in probabilities]


def save_checkpoint(path: Path, model: torch.nn.Module) -> None:
    """Write ``model``'s weights to ``path`` atomically (its directory made if needed)."""
    import torch

    from paralela._files import atomic_write

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())


def _build(hidden: int) -> torch.nn.Module:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(PIXELS, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )
