"""Cut an ``nn.Sequential`` into contiguous pipeline stages.

The stages keep the layer objects and their names, so the stages' ``state_dict`` keys
together are exactly the whole model's::

    Sequential(0: Linear, 1: ReLU, 2: Linear, 3: ReLU, 4: Linear)
                 └──── stage 0 ────┘  └───────── stage 1 ────────┘
    stage 0 keys: 0.weight 0.bias        stage 1 keys: 2.weight 2.bias 4.weight 4.bias

By default the cut balances the number of parameters (the largest stage is as small
as it can be); ``balance=[2, 3]`` gives the number of layers of each stage instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from paralela.errors import ConfigError

__all__ = ["balance_by_cost", "split_stages", "stages_from_modules"]


def split_stages(
    model: nn.Sequential, n_stages: int, *, balance: Sequence[int] | None = None
) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` contiguous stages.

    Args:
        model: the model, an ``nn.Sequential`` (each layer takes the previous one's output).
        n_stages: how many stages to make.
        balance: the number of layers of each stage (``n_stages`` entries, each at least
            1, summing to ``len(model)``). ``None``: choose the cut that makes the stage
            with the most parameters as small as possible (parameter count is a fair
            proxy for compute in dense layers; give ``balance`` for convolutions).
            Among equal cuts the later boundary wins, so a layer without parameters
            (an activation) stays with the layer before it.

    Returns:
        One ``nn.Sequential`` per stage, holding the same layer objects (not copies)
        under their original names.

    Raises:
        ConfigError: ``model`` is not an ``nn.Sequential``, ``n_stages`` is below 1 or
            above the number of layers, or ``balance`` does not fit the model.
    """
    if not isinstance(model, nn.Sequential):
        raise ConfigError(
            f"split_stages needs an nn.Sequential, got {type(model).__name__}. Wrap the "
            "layers in nn.Sequential, or build the stages yourself and pass the list of "
            "stage modules to pipeline()."
        )
    n_layers = len(model)
    if n_stages < 1:
        raise ConfigError(f"The number of stages must be at least 1, got {n_stages}.")
    if n_stages > n_layers:
        raise ConfigError(
            f"Cannot cut a model of {n_layers} layer(s) into {n_stages} stages: every stage "
            f"needs at least one layer. Use at most {n_layers} stages (ranks or devices), "
            "or a model with more layers."
        )
    if balance is None:
        costs = [sum(p.numel() for p in layer.parameters()) for layer in model]
        counts = balance_by_cost(costs, n_stages)
    else:
        counts = list(balance)
        if (
            len(counts) != n_stages
            or any(not isinstance(c, int) or c < 1 for c in counts)
            or sum(counts) != n_layers
        ):
            raise ConfigError(
                f"balance={list(balance)!r} does not fit: it needs {n_stages} whole numbers "
                f"(one per stage), each at least 1, summing to the model's {n_layers} layers."
            )
    named = list(model.named_children())
    stages = []
    start = 0
    for count in counts:
        stages.append(nn.Sequential(OrderedDict(named[start : start + count])))
        start += count
    return stages


def stages_from_modules(modules: Sequence[nn.Module]) -> list[nn.Sequential]:
    """One stage per module, named ``"0"``, ``"1"``, ... as in ``nn.Sequential(*modules)``.

    Raises:
        ConfigError: the list is empty or holds something that is not an ``nn.Module``.
    """
    if not modules:
        raise ConfigError("The list of stage modules is empty; give one module per stage.")
    stages = []
    for index, module in enumerate(modules):
        if not isinstance(module, nn.Module):
            raise ConfigError(
                f"Stage {index} is a {type(module).__name__}, not an nn.Module; give "
                "pipeline() an nn.Sequential or a list of modules, one per stage."
            )
        stage = nn.Sequential()
        stage.add_module(str(index), module)
        stages.append(stage)
    return stages


def balance_by_cost(costs: Sequence[int], n_stages: int) -> list[int]:
    """Layer counts of the contiguous cut that minimises the costliest stage.

    ``costs[i]`` is layer ``i``'s cost (its parameter count). When every cost is 0 the
    layers count 1 each. Among cuts with the same largest cost, the later boundary wins.
    Dynamic programming over prefixes: ``O(n_stages * len(costs)**2)``, nothing for the
    tens or hundreds of layers of a Sequential.
    """
    n = len(costs)
    if not 1 <= n_stages <= n:
        raise ConfigError(f"Cannot cut {n} layer(s) into {n_stages} non-empty stages.")
    weights = list(costs) if any(costs) else [1] * n
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][j]: the smallest possible largest cost when the first j layers form k stages.
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for j in range(k, n - (n_stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value <= best[k][j]:  # `<=`: the later boundary wins ties
                    best[k][j] = value
                    cut[k][j] = i
    counts = []
    j = n
    for k in range(n_stages, 0, -1):
        i = cut[k][j]
        counts.append(j - i)
        j = i
    return counts[::-1]
