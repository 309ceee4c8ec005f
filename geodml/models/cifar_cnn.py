"""The CIFAR-10 CNN of McMahan et al. 2017 and Hsu, Qi & Brown 2019: ``--model cifar-cnn``.

Sources, in the order each defers to the next:

* Hsu, Qi & Brown, "Measuring the effects of non-identical data distribution for federated visual
  classification" (2019), Section 4: "the same CNN architecture ... as in McMahan et al. [2017]
  except that a weight decay of 0.004 is used and no learning rate decay schedule".
* McMahan et al., "Communication-efficient learning of deep networks from decentralized data"
  (AISTATS 2017), Section 3, CIFAR: "taken from the TensorFlow tutorial ... two convolutional layers
  followed by two fully connected layers and then a linear transformation layer to produce logits,
  for a total of about 10^6 parameters".
* The TensorFlow "Advanced convolutional neural networks" tutorial (tensorflow/models,
  ``tutorials/image/cifar10/cifar10.py``, ``inference``), which fixes what the papers leave out:

      conv1 5x5, 64 channels, stride 1, SAME padding, bias, ReLU
      max-pool 3x3, stride 2, SAME padding;  LRN (depth radius 4, bias 1, alpha 0.001/9, beta 0.75)
      conv2 5x5, 64 channels, stride 1, SAME padding, bias, ReLU
      LRN (the same);  max-pool 3x3, stride 2, SAME padding
      fully connected 384, ReLU;  fully connected 192, ReLU;  linear classifier

  (The issue's paraphrase "2x2 max-pool" has the same output size, H/2 rounded up, but the
  tutorial's windows are 3x3 and overlap.) Here the pools use TensorFlow's SAME rule exactly: the
  -inf padding goes after the input first (bottom/right), so the windows start at 0, 2, 4, ...
  LRN is torch's LocalResponseNorm(size 9, alpha 0.001, beta 0.75, k 1): torch divides alpha by
  the window size, so 0.001 here is the tutorial's 0.001/9 per squared neighbour; ``lrn=False``
  drops both LRN layers (the network the issue's paraphrase describes).

Not reproduced here, because they are not the network: the tutorial's 24x24 random crops (McMahan
et al. train on them; the network adapts to any input size, 32x32 gives 8x8x64 features into the
first fully connected layer, 24x24 gives 6x6x64 and the ~10^6 parameters McMahan et al. quote),
its weight decay of 0.004 on the two hidden fully connected layers only (geodml's --weight-decay
applies to every weight), and its truncated-normal initialization (torch's defaults here).

Parameters, 10 classes: conv1 5*5*C*64 + 64, conv2 5*5*64*64 + 64 = 102,464, fc1 (64*h*w)*384 + 384,
fc2 384*192 + 192 = 73,920, fc3 192*10 + 10 = 1,930, with h = ceil(ceil(H/2)/2): 1,756,426 on 3x32x32,
1,384,586 on 1x28x28, 1,068,298 on 3x24x24 (tests/test_models.py).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from geodml.models.compiled import LocalResponseNorm, MaxPool2d

CONV_CHANNELS = 64
KERNEL_SIZE = 5
FC1_FEATURES = 384
FC2_FEATURES = 192
POOL_KERNEL, POOL_STRIDE = 3, 2
LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K = 9, 0.001, 0.75, 1.0   # TF: depth_radius 4, alpha 0.001/9 per element


def same_pool_padding(size: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of a 3x3 stride-2 pool along one side: (before, after), output ceil(size/2)."""
    out = math.ceil(size / POOL_STRIDE)
    total = max((out - 1) * POOL_STRIDE + POOL_KERNEL - size, 0)
    return total // 2, total - total // 2


def cifar_cnn_features(height: int, width: int) -> tuple[int, int]:
    """Spatial size (h, w) into fc1: each stage keeps the size (SAME conv) and the pool halves it, rounding up."""
    h, w = height, width
    for _ in range(2):
        h, w = math.ceil(h / POOL_STRIDE), math.ceil(w / POOL_STRIDE)
    return h, w


class _SamePool(nn.Module):
    """Max-pool 3x3, stride 2, with TensorFlow's SAME padding (-inf, the extra pixel after the input)."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        (top, bottom), (left, right) = same_pool_padding(height), same_pool_padding(width)
        self.pad = (left, right, top, bottom)
        self.pool = MaxPool2d(POOL_KERNEL, POOL_STRIDE)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(F.pad(x, self.pad, value=float("-inf")))


class CifarCNN(nn.Module):
    """The TensorFlow tutorial's CIFAR-10 network (module docstring) for (C, H, W) inputs.

    Args:
        in_channels, height, width: input image shape.
        num_classes: number of output logits.
        lrn: keep the tutorial's two local response normalizations (default True).
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int, *, lrn: bool = True) -> None:
        super().__init__()
        pad = KERNEL_SIZE // 2                                       # SAME for an odd kernel at stride 1
        h1, w1 = math.ceil(height / POOL_STRIDE), math.ceil(width / POOL_STRIDE)
        h2, w2 = cifar_cnn_features(height, width)
        self.flatten_features = CONV_CHANNELS * h2 * w2
        self.conv1 = nn.Conv2d(in_channels, CONV_CHANNELS, KERNEL_SIZE, padding=pad)
        self.pool1 = _SamePool(height, width)
        self.norm1: nn.Module = LocalResponseNorm(LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K) if lrn else nn.Identity()
        self.conv2 = nn.Conv2d(CONV_CHANNELS, CONV_CHANNELS, KERNEL_SIZE, padding=pad)
        self.norm2: nn.Module = LocalResponseNorm(LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K) if lrn else nn.Identity()
        self.pool2 = _SamePool(h1, w1)
        self.fc1 = nn.Linear(self.flatten_features, FC1_FEATURES)
        self.fc2 = nn.Linear(FC1_FEATURES, FC2_FEATURES)
        self.fc3 = nn.Linear(FC2_FEATURES, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(self.pool1(self.relu(self.conv1(x))))        # tutorial order: pool, then LRN
        x = self.pool2(self.norm2(self.relu(self.conv2(x))))        # LRN, then pool
        x = x.flatten(1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)
