"""The authors' LeNet, BN-LeNet, GN-LeNet and BRN-LeNet of Hsieh et al., "The Non-IID Data
Quagmire of Decentralized Machine Learning" (ICML 2020): ``--model lenet``.

Source: the Caffe prototxts of the authors' released code, github.com/kevinhsieh/non_iid_dml,
``apps/caffe/examples/cifar10/<K>parts/`` (the paper itself gives no architecture):

* LeNet (``lenet_train_val.prototxt.template``; its own comment: "different from original
  lenet"): conv1 5x5x32 pad 2 -> max-pool 3/2 -> ReLU -> LRN -> conv2 5x5x32 pad 2 -> ReLU ->
  avg-pool 3/2 -> LRN -> conv3 5x5x64 pad 2 -> ReLU -> avg-pool 3/2 -> ip1 (classes).
  LRN: across channels, local_size 3, alpha 5e-5, beta 0.75, k 1 (Caffe's defaults for k and
  the region). 89,578 parameters on 3x32x32 with 10 classes.
* BN-LeNet (``bnlenet_...``), GN-LeNet (``gnlenet_...``), BRN-LeNet (``brnlenet_...``): no LRN;
  conv1 -> max-pool -> norm1 -> ReLU -> conv2 -> norm2 -> ReLU -> avg-pool -> conv3 -> norm3 ->
  ReLU -> avg-pool -> ip1. The convolutions have no bias (``bias_term: false``) and the norm
  layers no scale or shift (no ``Scale`` layer follows them; Caffe's GroupNorm has no
  parameters): 89,450 parameters on 3x32x32. Note norm1 sits after the first pooling.
  BatchNorm and BatchReNorm are Caffe's (geodml.models.norms); GroupNorm: eps 1e-5.

**GroupNorm: the text and the code disagree.** The paper (§5.2) says group size G_size = 2
(two channels per group: 16 groups of conv1's 32 channels, 32 of conv3's 64); the released
gnlenet prototxt sets ``group_num: 2`` (two groups of 16 or 32 channels). ``group_size`` /
``groups`` choose the reading (``--gn-group-size`` / ``--gn-groups``); the default is the text's.

**Pooling** rounds up, as Caffe's: a 3/2 pool of an h-pixel side gives ``ceil((h - 3) / 2) + 1``
(32 -> 16 -> 8 -> 4 on CIFAR-10, 28 -> 14 -> 7 -> 3, 8 -> 4 -> 2 -> 1 on digits); a window that
runs past the edge covers only the pixels inside it, and average pooling divides by their
count (Caffe's ``pool_size`` without padding; PyTorch's ``ceil_mode=True`` does the same).

**Initialization** as the prototxts' fillers: Gaussian weights with std 1e-4 (conv1), 0.01
(conv2, conv3, ip1); biases 0.

**Input** at Caffe's scale: the prototxts' data layers feed raw 0-255 pixels minus the mean
image, with no scaling (a pixel standard deviation of ~63 on CIFAR-10, ~90 on Fashion-MNIST).
geodml's readers standardize each channel to standard deviation 1, so ``LeNet`` multiplies its
input by ``input_scale`` = the dataset's pixel standard deviation in 8-bit units
(``Dataset.pixel_std``, which ``build_from_config`` passes). Without it conv1's 1e-4 filler
sees a ~90 times weaker signal than it was chosen for, and the network starts late: measured on
Fashion-MNIST (one process, batch 100, lr 0.01, momentum 0.9, weight decay 5e-4, 2,000 test
images), test accuracy after 200 / 400 / 600 steps was 10.0 / 66.4 / 73.7% at scale 1 against
79.8 / 85.9 / 86.4% at scale 90. Remaining difference: the mean subtracted is the channel's,
not the mean image, and a 3-channel set gets one scale (the root mean square of its channels'
standard deviations: 63.0 / 62.1 / 66.7 on CIFAR-10, so within 5% per channel).

**Per-parameter multipliers** (``--param-mults prototxt``; :func:`prototxt_multipliers`): the
plain prototxt gives conv1's and conv2's biases ``lr_mult: 2``, ip1's weights ``decay_mult: 250``
and ip1's bias ``lr_mult: 2, decay_mult: 0``; conv3 has no ``param`` block (1, 1). The BN / GN /
BRN prototxts give ip1's bias ``decay_mult: 0`` and everything else (1, 1) (their norm layers
have no parameters). With the solvers' weight_decay 5e-4, ip1's weights decay at 0.125. The
solvers' batch (100/K per worker: 50 at K = 2, 20 at K = 5) is the studies' (geodml.study.paper).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from geodml.config import MODEL_NORMS
from geodml.models.compiled import LocalResponseNorm, MaxPool2d
from geodml.models.norms import BatchReNorm2d, BatchReNormSchedule, CaffeBatchNorm2d, group_count

CONV_CHANNELS = (32, 32, 64)
KERNEL_SIZE = 5
CONV_PADDING = 2  # 'same' 5x5 convolutions: only the pools shrink the map
POOL_KERNEL = 3
POOL_STRIDE = 2
LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K = 3, 5e-5, 0.75, 1.0
INIT_STD = {"conv1": 1e-4, "conv2": 0.01, "conv3": 0.01, "ip1": 0.01}
"""The prototxts' Gaussian weight-filler standard deviations (biases: constant 0)."""
BN_MOVING_AVERAGE_FRACTION = 0.999  # Caffe's BatchNormParameter default; the bnlenet prototxt sets none


def caffe_pool_side(side: int) -> int:
    """Output side of Caffe's 3/2 pooling without padding: ``ceil((side - 3) / 2) + 1`` (may be < 1)."""
    return math.ceil((side - POOL_KERNEL) / POOL_STRIDE) + 1


def lenet_geometry(height: int, width: int) -> tuple[int, int]:
    """``(h, w)`` of the map fed to ip1 after the three conv + pool stages.

    Raises ``ValueError`` when a stage would have nothing left (inputs under 8x8).
    """
    h, w = height, width
    for _ in range(3):
        h, w = caffe_pool_side(h), caffe_pool_side(w)
        if min(h, w) < 1:
            raise ValueError(f"lenet needs inputs of at least 8x8, got {height}x{width}")
    return h, w


def lenet_norm(norm: str, channels: int, *, group_size: int | None, groups: int | None,
               brn: BatchReNormSchedule | None) -> nn.Module:
    """The released prototxts' normalization layer for ``channels`` channels (no scale or shift)."""
    if norm == "batch":
        return CaffeBatchNorm2d(channels, moving_average_fraction=BN_MOVING_AVERAGE_FRACTION)
    if norm == "group":
        return nn.GroupNorm(group_count(channels, group_size=group_size, groups=groups), channels, eps=1e-5,
                            affine=False)
    if norm == "batchrenorm":
        return BatchReNorm2d(channels, brn)
    raise ValueError(f"lenet: unknown norm {norm!r}; choose one of {', '.join(MODEL_NORMS['lenet'])}")


class LeNet(nn.Module):
    """The authors' Caffe LeNet (``norm="none"``) or its BN / GN / BRN variant (module docstring).

    Args:
        in_channels, height, width: input image shape (C, H, W); at least 8x8.
        num_classes: number of output logits.
        norm: ``"none"``, ``"batch"``, ``"group"`` or ``"batchrenorm"``.
        group_size, groups: GroupNorm's grouping, at most one given (norms.group_count; default:
            group size 2, the paper's text).
        brn: BatchReNorm's schedule (default: the 2-partition brnlenet prototxt's).
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int, norm: str = "none", *,
                 group_size: int | None = None, groups: int | None = None,
                 brn: BatchReNormSchedule | None = None, input_scale: float = 1.0) -> None:
        super().__init__()
        self.input_scale = float(input_scale)  # a constant, not state: no buffer to carry per partition
        if norm not in MODEL_NORMS["lenet"]:
            raise ValueError(f"lenet: unknown norm {norm!r}; choose one of {', '.join(MODEL_NORMS['lenet'])}")
        h, w = lenet_geometry(height, width)
        self.norm = norm
        plain = norm == "none"
        c1, c2, c3 = CONV_CHANNELS
        self.conv1 = nn.Conv2d(in_channels, c1, KERNEL_SIZE, padding=CONV_PADDING, bias=plain)
        self.conv2 = nn.Conv2d(c1, c2, KERNEL_SIZE, padding=CONV_PADDING, bias=plain)
        self.conv3 = nn.Conv2d(c2, c3, KERNEL_SIZE, padding=CONV_PADDING, bias=plain)
        self.pool1 = MaxPool2d(POOL_KERNEL, POOL_STRIDE, ceil_mode=True)
        self.pool2 = nn.AvgPool2d(POOL_KERNEL, POOL_STRIDE, ceil_mode=True)
        self.pool3 = nn.AvgPool2d(POOL_KERNEL, POOL_STRIDE, ceil_mode=True)
        self.relu = nn.ReLU()
        if plain:
            self.norm1: nn.Module = LocalResponseNorm(LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA, k=LRN_K)
            self.norm2: nn.Module = LocalResponseNorm(LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA, k=LRN_K)
            self.norm3: nn.Module = nn.Identity()
        else:
            kw = {"group_size": group_size, "groups": groups, "brn": brn}
            self.norm1, self.norm2, self.norm3 = (lenet_norm(norm, c, **kw) for c in CONV_CHANNELS)
        self.flatten_features = c3 * h * w
        self.ip1 = nn.Linear(self.flatten_features, num_classes)
        with torch.no_grad():
            for name, std in INIT_STD.items():
                layer = getattr(self, name)
                nn.init.normal_(layer.weight, 0.0, std)
                if layer.bias is not None:
                    layer.bias.zero_()

    def prototxt_multipliers(self) -> dict[str, tuple[float, float]]:
        """``{parameter name: (lr_mult, decay_mult)}`` of the released prototxt, for the
        parameters whose multipliers are not (1, 1) (module docstring)."""
        if self.norm == "none":
            return {"conv1.bias": (2.0, 1.0), "conv2.bias": (2.0, 1.0), "ip1.weight": (1.0, 250.0),
                    "ip1.bias": (2.0, 0.0)}
        return {"ip1.bias": (1.0, 0.0)}

    def forward(self, x: Tensor) -> Tensor:
        if self.input_scale != 1.0:  # Caffe's pixel scale (module docstring, "Input")
            x = x * self.input_scale
        if self.norm == "none":  # the plain prototxt: pool, ReLU, LRN / ReLU, pool, LRN / ReLU, pool
            x = self.norm1(self.relu(self.pool1(self.conv1(x))))
            x = self.norm2(self.pool2(self.relu(self.conv2(x))))
            x = self.pool3(self.relu(self.conv3(x)))
        else:  # the BN/GN/BRN prototxts: pool, norm, ReLU / norm, ReLU, pool / norm, ReLU, pool
            x = self.relu(self.norm1(self.pool1(self.conv1(x))))
            x = self.pool2(self.relu(self.norm2(self.conv2(x))))
            x = self.pool3(self.relu(self.norm3(self.conv3(x))))
        return self.ip1(x.flatten(1))
