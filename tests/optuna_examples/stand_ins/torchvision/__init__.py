"""A stand-in for the two names of torchvision that Optuna's ``pytorch_simple.py`` uses.

The machines that run these tests cannot download FashionMNIST, and torchvision is not
installed: ``datasets.FashionMNIST`` here gives 28x28 grey images of the same shape and
10 classes, made from scikit-learn's bundled digits (upscaled, with pixel noise), so the
example's objective runs as published and has something learnable to optimise.
"""

from torchvision import datasets, transforms

__all__ = ["datasets", "transforms"]
