"""pytorch/examples ``mnist/main.py``'s train and test loop, unchanged apart from the data
source: its ``DataLoader`` over torchvision's MNIST becomes a ``DataLoader`` over
``TorchIterable(pipeline)`` on scikit-learn's digits (8x8 images: no download), and its
``Net`` is sized for 8x8 images. ``train`` and ``test`` are the published functions
(BSD-3-Clause, Copyright (c) 2017 the PyTorch developers), kept as written there: they
call ``len(train_loader)``, ``len(loader.dataset)`` and ``target.to(device)``, and train
on one pipeline for several epochs without ``set_epoch``."""

from __future__ import annotations

import re
from argparse import Namespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader

from paralela.data import Pipeline, TorchIterable

pytestmark = pytest.mark.slow


class Net(nn.Module):
    """The example's Net for 8x8 images: the same layers, fc1 sized for what remains."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(256, 128)  # 64 channels x 2 x 2 (MNIST: 9216)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output  # noqa: RET504  (as published)


# fmt: off
def train(args, model, device, train_loader, optimizer, epoch):  # type: ignore[no-untyped-def]
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(  # noqa: UP032
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break


def test(model, device, test_loader):  # type: ignore[no-untyped-def]
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(  # noqa: UP032
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
# fmt: on


test.__test__ = False  # type: ignore[attr-defined]  # the example's test(), not pytest's


class Digits:
    """A map-style dataset, as torchvision's MNIST: (image 1x8x8 float32, label int),
    normalised as the example's transform does (mean and std of the training images)."""

    def __init__(self, images: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray[Any, Any], int]:
        image = (self.images[index].reshape(1, 8, 8) / 16.0 - 0.306) / 0.377
        return image.astype(np.float32), int(self.labels[index])


TRAIN = 1400  # of the 1,797 digits; the rest are the test set


@pytest.mark.parametrize("batching", ["dataloader", "pipeline"])
def test_mnist_examples_loop_trains_from_a_pipeline(
    batching: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    images, labels = load_digits(return_X_y=True)
    train_set = Digits(images[:TRAIN], labels[:TRAIN])
    test_set = Digits(images[TRAIN:], labels[TRAIN:])
    args = Namespace(batch_size=64, test_batch_size=1000, epochs=3, lr=1.0, gamma=0.7,
                     log_interval=10, dry_run=False)  # fmt: skip
    torch.manual_seed(1)
    device = torch.device("cpu")

    # The data source: what the example's DataLoader(dataset, shuffle=True) did, as a
    # pipeline (read in parallel, shuffled anew every epoch), batched by the DataLoader
    # or by the pipeline (batch_size=None).
    pipeline = Pipeline.from_map_style(train_set).shuffle(TRAIN)
    if batching == "dataloader":
        train_loader = DataLoader(TorchIterable(pipeline), batch_size=args.batch_size)
    else:
        train_loader = DataLoader(TorchIterable(pipeline.batch(args.batch_size)), batch_size=None)
    test_loader = DataLoader(
        TorchIterable(Pipeline.from_map_style(test_set)), batch_size=args.test_batch_size
    )

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    out = capsys.readouterr().out
    logged = re.findall(r"Train Epoch: (\d) \[(\d+)/(\d+) \((\d+)%\)\]", out)
    assert [int(e) for e, *_ in logged] == [1, 1, 1, 2, 2, 2, 3, 3, 3]  # batches 0, 10, 20
    assert {int(n) for _, _, n, _ in logged} == {len(train_loader.dataset)}
    assert len(train_loader) == 22  # ceil(1400 / 64): the percentages are the example's
    accuracies = re.findall(r"Accuracy: (\d+)/(\d+)", out)
    assert len(accuracies) == 3
    correct, total = (int(x) for x in accuracies[-1])
    assert total == len(images) - TRAIN
    assert correct / total > 0.9, out
