"""Serving a trained model over HTTP (``paralela serve``) and batch prediction over files
(``paralela predict``): the user's model class (``_model``), built once per worker."""

from paralela.serving._model import LoadedModel, ModelError, check_model, model_name
from paralela.serving._serve import ExposedServerWarning

__all__ = ["ExposedServerWarning", "LoadedModel", "ModelError", "check_model", "model_name"]
