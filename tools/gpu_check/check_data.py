"""Check: a ``paralela.data`` pipeline feeding a CUDA training loop with pinned memory,
against a tuned torch ``DataLoader``.

Proves: the pipeline (decode in parallel threads, batches, prefetch) delivers every
sample once, in order, as pinned batches that a CUDA loop trains on to the same weights
as the DataLoader's; and how busy each keeps the GPU (the share of the epoch's wall time
that the GPU spent in training steps, timed with CUDA events).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from common import Mode, Outcome, max_abs_diff

TOLERANCE = 1e-4  # the same batches in the same order, deterministic kernels


def check(mode: Mode, work: Path) -> Outcome:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from paralela.data import Pipeline, TorchIterable

    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    outcome = Outcome()
    side, batch = mode.size(64, 16), mode.size(256, 32)
    samples = batch * mode.size(40, 4)
    cuda = mode.device == "cuda"
    workers = min(8, len(os.sched_getaffinity(0)))

    def decode(i: int) -> tuple[Any, int]:
        import numpy as np

        image = np.random.default_rng(i).random((3, side, side), dtype=np.float32)
        return torch.from_numpy(np.tanh(image @ image / side)), i

    class Images(Dataset[tuple[Any, int]]):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, i: int) -> tuple[Any, int]:
            return decode(i)

    pipeline = Pipeline.from_iterable(range(samples)).map(decode).batch(batch).prefetch(4)
    loaders = {
        "paralela.data": DataLoader(TorchIterable(pipeline), batch_size=None, pin_memory=cuda),
        f"DataLoader ({workers} workers)": DataLoader(
            Images(), batch_size=batch, num_workers=workers, pin_memory=cuda, prefetch_factor=4
        ),
    }
    results = {}
    for label, loader in loaders.items():
        results[label] = _train(loader, mode.device)
        seen, pinned, busy, wall, _ = results[label]
        outcome.expect(seen == list(range(samples)), f"{label}: samples not each once, in order")
        outcome.expect(pinned or not cuda, f"{label}: batches were not in pinned memory")
        outcome.figures[f"{label}: GPU busy"] = f"{busy:.0%} of {wall:.2f} s"
        outcome.figures[f"{label}: samples/s"] = round(samples / wall)
    (ours, theirs) = results.values()
    diff = max_abs_diff(ours[4], theirs[4])
    outcome.figures["weights difference"] = f"{diff:.1e}"
    outcome.figures["busy share, paralela / DataLoader"] = f"{ours[2] / theirs[2]:.2f}x"
    outcome.expect(diff <= TOLERANCE, f"the two trainings' weights differ by {diff}")
    return outcome


def _train(loader: Any, device: str) -> tuple[list[int], bool, float, float, list[Any]]:
    """One epoch: the sample indices seen, whether batches came pinned, the GPU's busy
    share, the wall seconds and the weights."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, stride=2), nn.ReLU(),
        nn.Conv2d(128, 128, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(128, 10),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cuda = device == "cuda"
    seen: list[int] = []
    pinned = True
    spans: list[Any] = []
    busy_s = 0.0
    warm = torch.zeros(2, 3, 16, 16, device=device)  # kernels load before the clock starts
    nn.functional.cross_entropy(model(warm), torch.zeros(2, dtype=torch.long, device=device))
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for images, indices in loader:
        pinned = pinned and images.is_pinned()
        seen.extend(int(i) for i in indices)
        x = images.to(device, non_blocking=True)
        y = (indices % 10).to(device, non_blocking=True)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)  # type: ignore[no-untyped-call]
            spans.append((start, end))
            spans[-1][0].record()
        step_started = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if cuda:
            spans[-1][1].record()
        else:
            busy_s += time.perf_counter() - step_started
    if cuda:
        torch.cuda.synchronize()
        busy_s = sum(a.elapsed_time(b) for a, b in spans) / 1000
    wall = time.perf_counter() - started
    weights = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    return seen, pinned, busy_s / wall, wall, weights
