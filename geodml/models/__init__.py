"""Model zoo of the study, each network named by its source.

* ``lenet``    -- the authors' Caffe LeNet / BN- / GN- / BRN-LeNet of Hsieh et al., "The Non-IID
  Data Quagmire" (ICML 2020), from the released prototxts (norm none / batch / group /
  batchrenorm; geodml.models.lenet).
* ``cnn``      -- McMahan et al. 2017's CNN (the network called ``lenet`` before issue 21), with
  optional BN / GN after each conv (geodml.models.cnn).
* ``resnet20`` -- He et al. 2016's CIFAR ResNet-20 with BatchNorm or GroupNorm, Quagmire §4-§5.
* ``logreg``   -- multinomial logistic regression.
* ``mlp``      -- McMahan et al. 2017's 2NN (200-200).
* ``cifar-cnn`` -- McMahan et al. 2017's CIFAR-10 CNN, the TensorFlow tutorial's network (two 5x5x64
  convolutions, 3x3/2 max-pools, LRN, fully connected 384 and 192), as Hsu et al. 2019 use it
  (geodml.models.cifar_cnn).

Every rank of a run builds its model with ``build_model(..., generator_seed=run_seed)``
and so starts from bit-identical weights without any broadcast, and without disturbing
the global RNG streams that data loading or dropout may rely on.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import nn

from geodml.config import MODEL_NORMS, NORMS, PROTOTXT_MODELS, ModelConfig
from geodml.config import MODELS as MODEL_NAMES  # the registries are geodml.config's (the one validator)
from geodml.models.cifar_cnn import CifarCNN
from geodml.models.cnn import CNN
from geodml.models.lenet import LeNet
from geodml.models.norms import GROUP_SIZE, BatchReNormSchedule
from geodml.models.resnet import ResNet20
from geodml.models.simple import MLP, LogisticRegression

__all__ = ["BatchReNormSchedule", "CifarCNN", "CNN", "build_from_config", "GROUP_SIZE", "LeNet",
           "LogisticRegression", "MLP", "MODEL_NAMES", "MODEL_NORMS", "NORMS", "PROTOTXT_MODELS", "ResNet20",
           "build_model", "count_parameters", "param_multipliers"]


def _construct(name: str, norm: str, input_shape: tuple[int, int, int], num_classes: int, *,
               group_size: int | None, groups: int | None, brn: BatchReNormSchedule | None,
               input_scale: float) -> nn.Module:
    channels, height, width = input_shape
    if name == "lenet":
        return LeNet(channels, height, width, num_classes, norm, group_size=group_size, groups=groups, brn=brn,
                     input_scale=input_scale)
    if name == "cnn":
        return CNN(channels, height, width, num_classes, norm, group_size=group_size, groups=groups)
    if name == "resnet20":
        return ResNet20(channels, num_classes, norm, group_size=group_size, groups=groups)
    if name == "cifar-cnn":
        return CifarCNN(channels, height, width, num_classes)
    in_features = math.prod(input_shape)
    if name == "logreg":
        return LogisticRegression(in_features, num_classes)
    return MLP(in_features, num_classes)


_GLOBAL_RNG_LOCK = threading.Lock()


def build_model(name: str, norm: str, input_shape: tuple[int, int, int], num_classes: int, *,
                generator_seed: int | None = None, gn_group_size: int | None = None, gn_groups: int | None = None,
                brn: BatchReNormSchedule | None = None, input_scale: float = 1.0) -> nn.Module:
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
        gn_group_size, gn_groups: with ``norm="group"``, channels per group or groups per layer
            (at most one; neither: group size 2, the Quagmire text's G_size).
        brn: with ``norm="batchrenorm"``, the schedule (default: the authors' K=2 prototxt's).
        input_scale: ``lenet`` multiplies its input by this (Caffe's pixel scale: pass the dataset's
            ``pixel_std``, as ``build_from_config`` does); the other models take standardized input
            and ignore it.

    Returns:
        A float32 module on the CPU in training mode; ``model(x)`` maps ``[B, C, H, W]`` to
        logits ``[B, num_classes]``. Move it to a device afterwards.

    Raises:
        ValueError: unknown model or norm, a norm the model does not support, a malformed
            input shape, fewer than 2 classes, an input too small for the model, or a GroupNorm
            grouping that does not divide the channels.
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
    if gn_group_size is not None and gn_groups is not None:
        raise ValueError("give gn_group_size or gn_groups, not both")
    if not (isinstance(input_scale, (int, float)) and math.isfinite(input_scale) and input_scale > 0):
        raise ValueError(f"input_scale must be a finite number > 0, got {input_scale!r}")
    kw = {"group_size": gn_group_size, "groups": gn_groups, "brn": brn, "input_scale": float(input_scale)}
    if generator_seed is None:
        return _construct(name, norm, shape, num_classes, **kw)
    # Module constructors draw their initial weights from the global CPU generator. Fork it
    # (restored on exit) and seed only the CPU generator: torch.manual_seed would also reseed
    # every CUDA device, which fork_rng(devices=[]) does not restore. Weights are created on
    # the CPU, so the CPU generator alone determines them.
    # The generator is the process's: partitions hosted as threads of one process build their
    # models one at a time, so each gets exactly the weights it gets in a process of its own.
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(generator_seed)
        return _construct(name, norm, shape, num_classes, **kw)


def build_from_config(cfg: ModelConfig, input_shape: tuple[int, int, int], num_classes: int, *,
                      generator_seed: int | None = None, pixel_std: float = 1.0) -> nn.Module:
    """``build_model`` with the network, normalization and its options of a (validated) ModelConfig;
    ``pixel_std`` is the dataset's (``Dataset.pixel_std``), LeNet's input scale."""
    if cfg.is_plugin:
        return _plugin_model(cfg.model, input_shape, num_classes, generator_seed=generator_seed)
    init, r_step, d_step = (int(x) for x in cfg.brn_steps)
    brn = BatchReNormSchedule(step_to_init=init, step_to_r_max=r_step, step_to_d_max=d_step, r_max=cfg.brn_r_max,
                              d_max=cfg.brn_d_max, moving_average_fraction=cfg.brn_average_fraction)
    return build_model(cfg.model, cfg.norm, input_shape, num_classes, generator_seed=generator_seed,
                       gn_group_size=cfg.gn_group_size, gn_groups=cfg.gn_groups, brn=brn, input_scale=pixel_std)


def _plugin_model(name: str, input_shape: tuple[int, int, int], num_classes: int, *,
                  generator_seed: int | None) -> nn.Module:
    """``--model MODULE:FUNCTION`` (geodml.plugins): ``FUNCTION(input_shape, num_classes)`` returns the
    network; with ``generator_seed`` its initial weights come from that seed alone, as geodml's own
    models' do (the global generator forked and restored). Returned as float32 in training mode."""
    from geodml import plugins

    fn = plugins.load("model", name)
    if generator_seed is None:
        model = fn(tuple(input_shape), num_classes)
    else:
        with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(generator_seed)
            model = fn(tuple(input_shape), num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {name}: returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise ValueError(f"--model {name}: the network has no parameters to train")
    return model.float().train()


def param_multipliers(cfg: ModelConfig, model: nn.Module) -> dict[str, tuple[float, float]] | None:
    """The ``{parameter name: (lr_mult, decay_mult)}`` a run trains ``model`` with: the model's
    ``prototxt_multipliers()`` under ``--param-mults prototxt``, else None (every parameter 1, 1).
    geodml.algorithms.base.regularize applies them."""
    if cfg.param_mults == "none":
        return None
    mults = getattr(model, "prototxt_multipliers", None)
    if mults is None:  # ModelConfig refuses this combination; a model built by hand may still get here
        raise ValueError(f"--param-mults {cfg.param_mults}: {type(model).__name__} has no prototxt multipliers")
    return dict(mults())


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (``nn.Parameter`` elements, each shared one counted once).

    Buffers such as BatchNorm's running mean/variance are not parameters and not counted.
    """
    return sum(p.numel() for p in model.parameters())
