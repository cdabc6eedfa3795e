"""Classify handwritten digits with a trained MLP, as a model class for predict and serve.

``DigitsClassifier`` is the two-layer perceptron of ``sweep_digits_mlp.py`` (it lives in
``paralela.demos._digits_model``, which ``paralela demo`` uses too). ``setup(device)``
loads its weights from ``$PARALELA_DIGITS_CHECKPOINT`` (default
``paralela-runs/digits-mlp.pt`` in the current directory); where there is no checkpoint
it trains the MLP first, seeded, in about 1 s, and saves it atomically, so every worker
and every run uses the same weights. A record is one 8x8 image as 64 numbers from 0 to
16, row by row (a row of scikit-learn's ``load_digits().data``); ``predict`` returns
``{"label": 3, "probabilities": [10 floats]}`` for each. Needs torch, scikit-learn and
pydantic.

Here the class also has an ``input_model``, ``Pixels``: a pydantic root model of exactly
64 numbers from 0 to 16. ``paralela predict`` validates each record into it (a record of
63 numbers is an ``InputError`` naming its file and line, before the model sees it) and
``predict`` gets the instances; ``paralela serve`` uses it for request validation and
its OpenAPI page.

    python examples/digits_model.py [--workers 2]

predicts the 360 held-out images with ``paralela.predict``, checks the outputs against a
serial loop over the same images and prints the accuracy. From a shell, on a JSONL file
with one list of 64 numbers per line::

    paralela predict examples/digits_model.py:DigitsClassifier --input images.jsonl \\
                     --output labels/
    paralela serve examples/digits_model.py:DigitsClassifier
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, RootModel

import paralela
from paralela.demos._digits_model import DigitsClassifier as MLPClassifier
from paralela.demos._digits_model import validation_set

Pixel = Annotated[float, Field(ge=0, le=16)]


class Pixels(RootModel[Annotated[list[Pixel], Field(min_length=64, max_length=64)]]):
    """One 8x8 image: 64 numbers from 0 (white) to 16 (black), row by row."""


class DigitsClassifier(MLPClassifier):
    """The digits MLP, its records validated as :class:`Pixels`."""

    input_model = Pixels


def read_outputs(directory: Path) -> list[dict[str, Any]]:
    """The ``output`` of every row of a predict output directory, in input order."""
    import json

    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [json.loads(line)["output"] for line in part.read_text().splitlines()]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Classify the held-out digits in parallel.")
    parser.add_argument("--workers", type=int, default=None, help="default: one per CPU")
    args = parser.parse_args(argv)
    images, labels = validation_set()
    # The serial loop first: its setup trains and saves the checkpoint if there is none,
    # and the workers then load it (each would train the same weights otherwise).
    serial = DigitsClassifier()
    serial.setup("cpu")
    expected = serial.predict([Pixels(image) for image in images])
    given = {} if args.workers is None else {"workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        result = paralela.predict(
            DigitsClassifier, images, output=Path(tmp) / "labels", records_per_split=90, **given
        )
        outputs = read_outputs(result.output)
    print(result)
    agree = sum(
        out["label"] == exp["label"]
        and all(
            math.isclose(a, b, abs_tol=1e-6)
            for a, b in zip(out["probabilities"], exp["probabilities"], strict=True)
        )
        for out, exp in zip(outputs, expected, strict=True)
    )
    print(f"predictions agree with a serial loop: {agree} of {len(images)}")
    correct = sum(out["label"] == label for out, label in zip(outputs, labels, strict=True))
    print(f"accuracy on the held-out images: {correct / len(images):.1%}")


if __name__ == "__main__":
    main()
