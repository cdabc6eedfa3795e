"""The error a served or predicting model's failure becomes: raised where the model is
loaded and called (``._model``) and by the LitServe adapter around it (``._litapi``)."""

from __future__ import annotations

from paralela.errors import ParalelaError

__all__ = ["ModelError"]


class ModelError(ParalelaError):
    """The user's model failed: its ``setup`` or ``predict`` raised, or ``predict``
    returned something other than a list as long as its batch. The model's own
    exception is ``__cause__``."""
