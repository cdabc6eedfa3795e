"""The model protocol shared by ``serve`` and ``predict``: checks before any worker
starts, and errors that name the model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pydantic
import pytest

from paralela.errors import ConfigError
from paralela.serving import LoadedModel, ModelError, check_model, model_name


class Doubler:
    def setup(self, device: str) -> None:
        self.device = device
        self.factor = 2

    def predict(self, batch: list[float]) -> list[float]:
        return [x * self.factor for x in batch]


class NoSetup:
    def predict(self, batch: list[Any]) -> Any:
        return np.asarray(batch) + 1  # an array: one row per input


class Short:
    def predict(self, batch: list[Any]) -> list[Any]:
        return batch[:-1]


class Raises:
    def predict(self, batch: list[Any]) -> list[Any]:
        raise ValueError("bad input")


class BadSetup:
    def setup(self, device: str) -> None:
        raise FileNotFoundError("weights.pt")

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class Item(pydantic.BaseModel):
    x: float


class Typed(Doubler):
    input_model = Item


def test_a_model_is_set_up_once_and_predicts_a_batch() -> None:
    model = LoadedModel(check_model(Doubler), "cpu")
    assert model.instance.device == "cpu"
    assert model.predict([1.0, 2.5]) == [2.0, 5.0]
    assert LoadedModel(check_model(NoSetup), "cpu").predict([1, 2]) == [2, 3]
    assert check_model(Typed) is Typed
    assert model_name(Doubler) == f"{__name__}:Doubler"


def test_outputs_must_match_the_batch() -> None:
    with pytest.raises(ModelError, match="returned 1 outputs for a batch of 2"):
        LoadedModel(Short, "cpu").predict([1, 2])
    with pytest.raises(ModelError, match=r"Raises.predict raised ValueError: bad input") as info:
        LoadedModel(Raises, "cpu").predict([1])
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ModelError, match="failed to set up on cpu: FileNotFoundError") as setup:
        LoadedModel(BadSetup, "cpu")
    assert isinstance(setup.value.__cause__, FileNotFoundError)


class NeedsArgs:
    def __init__(self, path: str) -> None:
        self.path = path

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class NoPredict:
    def setup(self, device: str) -> None:
        pass


class SetupWithoutDevice:
    def setup(self) -> None:
        pass

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class BadSchema(Doubler):
    input_model = dict


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (Doubler(), "Pass the class itself"),
        (NeedsArgs, "takes constructor arguments"),
        (NoPredict, "has no predict method"),
        (SetupWithoutDevice, r"setup must take one argument: define setup\(self, device\)"),
        (BadSchema, "must be a pydantic BaseModel subclass"),
    ],
)
def test_bad_model_classes_are_refused_before_any_worker(model: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_model(model)
