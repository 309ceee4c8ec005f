"""Model zoo of the study: the networks of Hsieh et al., "The Non-IID Data Quagmire of
Decentralized Machine Learning" (ICML 2020) §3-§5 and Appendix C, plus two FL baselines.

* ``lenet``    -- LeNet / BN-LeNet / GN-LeNet (norm none / batch / group), §5.
* ``resnet20`` -- ResNet-20 with BatchNorm or GroupNorm (group size 2), §4-§5.
* ``logreg``   -- multinomial logistic regression.
* ``mlp``      -- McMahan et al.'s 2NN (200-200).

Every rank of a run builds its model with ``build_model(..., generator_seed=run_seed)``
and so starts from bit-identical weights without any broadcast, and without disturbing
the global RNG streams that data loading or dropout may rely on.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import nn

from geodml.config import MODEL_NORMS, NORMS
from geodml.config import MODELS as MODEL_NAMES  # the registries are geodml.config's (the one validator)
from geodml.models.lenet import GROUP_SIZE, LeNet
from geodml.models.resnet import ResNet20
from geodml.models.simple import MLP, LogisticRegression

__all__ = ["GROUP_SIZE", "LeNet", "LogisticRegression", "MLP", "MODEL_NAMES", "MODEL_NORMS", "NORMS",
           "ResNet20", "build_model", "count_parameters"]


def _construct(name: str, norm: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    channels, height, width = input_shape
    if name == "lenet":
        return LeNet(channels, height, width, num_classes, norm)
    if name == "resnet20":
        return ResNet20(channels, num_classes, norm)
    in_features = math.prod(input_shape)
    if name == "logreg":
        return LogisticRegression(in_features, num_classes)
    return MLP(in_features, num_classes)


_GLOBAL_RNG_LOCK = threading.Lock()


def build_model(name: str, norm: str, input_shape: tuple[int, int, int], num_classes: int, *,
                generator_seed: int | None = None) -> nn.Module:
    """Build model ``name`` with normalization ``norm`` for ``input_shape = (C, H, W)`` images.

    Args:
        name: one of ``MODEL_NAMES``.
        norm: one of ``NORMS``; ``MODEL_NORMS[name]`` lists what the model supports.
        input_shape: (channels, height, width) of one sample, e.g. (1, 8, 8), (1, 28, 28),
            (3, 32, 32).
        num_classes: number of output logits (>= 2).
        generator_seed: when given, the initial weights are a pure function of this seed
            (same seed -> bit-identical weights on every rank and every run) and the global
            torch RNG state is left exactly as it was. When ``None``, initialization draws
            from (and advances) the global CPU RNG, like any ``nn.Module`` constructor.

    Returns:
        A float32 module on the CPU in training mode; ``model(x)`` maps ``[B, C, H, W]`` to
        logits ``[B, num_classes]``. Move it to a device afterwards.

    Raises:
        ValueError: unknown model or norm, a norm the model does not support, a malformed
            input shape, fewer than 2 classes, or an input too small for the model.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    if norm not in MODEL_NORMS[name]:
        raise ValueError(f"model {name!r} does not support norm {norm!r}; "
                         f"use one of {', '.join(MODEL_NORMS[name])}")
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"input_shape must be (channels, height, width) of positive ints, got {input_shape!r}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if generator_seed is None:
        return _construct(name, norm, shape, num_classes)
    # Module constructors draw their initial weights from the global CPU generator. Fork it
    # (restored on exit) and seed only the CPU generator: torch.manual_seed would also reseed
    # every CUDA device, which fork_rng(devices=[]) does not restore. Weights are created on
    # the CPU, so the CPU generator alone determines them.
    # The generator is the process's: partitions hosted as threads of one process build their
    # models one at a time, so each gets exactly the weights it gets in a process of its own.
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(generator_seed)
        return _construct(name, norm, shape, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (``nn.Parameter`` elements, each shared one counted once).

    Buffers such as BatchNorm's running mean/variance are not parameters and not counted.
    """
    return sum(p.numel() for p in model.parameters())
