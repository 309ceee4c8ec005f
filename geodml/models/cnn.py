"""The CNN of McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS 2017) §3 (also the "simple CNN" of the IWDS paper), with an
optional normalization after each conv layer: ``--model cnn``.

Until issue 21 this network was called ``lenet`` and attributed to the Quagmire
paper's Table 2, which gives no architecture; the authors' LeNet is geodml.models.lenet. Runs
and studies before that change used this network.

* CNN: conv 5x5x32 -> ReLU -> maxpool 2 -> conv 5x5x64 -> ReLU -> maxpool 2 -> fc 512 -> ReLU
  -> fc classes (McMahan et al.'s layer recipe); 878,538 parameters on 3x32x32 with 10 classes.
  McMahan et al. pad their convolutions ("same"; 1,663,370 parameters on 28x28 MNIST); this
  one does not on inputs of 16 pixels or more (582,026 on 28x28), see the shape rule.
* BN-CNN: BatchNorm2d (with scale and shift) between each conv and its ReLU.
* GN-CNN: GroupNorm in the same place, ``group_size`` channels per group (default 2, the
  Quagmire text's G_size) or ``groups`` groups per layer.

Shape rule (how the network adapts to 1x8x8 digits, 1x28x28 MNIST, 3x32x32 CIFAR-10):
each stage is conv 5x5 (stride 1, padding p) followed by maxpool 2 (floor). When
``min(H, W) >= 16`` both stages fit without padding (p = 0:
32 -> 28 -> 14 -> 10 -> 5, and 28 -> 24 -> 12 -> 8 -> 4). Smaller inputs would shrink to
nothing, so they use p = 2 ("same" convolutions) and each stage only halves
(8 -> 8 -> 4 -> 4 -> 2). Inputs smaller than 4x4 are rejected. The fc1 input size is
64 * h * w with (h, w) computed from this rule, never hard-coded.
"""

from __future__ import annotations

from torch import Tensor, nn

from geodml.config import MODEL_NORMS
from geodml.models.compiled import MaxPool2d
from geodml.models.norms import make_norm2d

CONV1_CHANNELS = 32
CONV2_CHANNELS = 64
FC1_FEATURES = 512
KERNEL_SIZE = 5
POOL = 2
# Below this input side length the unpadded network has no spatial extent left after
# the second stage: (((16 - 4) // 2) - 4) // 2 == 1, (((15 - 4) // 2) - 4) // 2 == 0.
MIN_UNPADDED_SIDE = 16
# With 'same' convolutions each stage only halves, so two stages need at least 4 pixels.
MIN_PADDED_SIDE = POOL * POOL


def cnn_geometry(height: int, width: int) -> tuple[int, int, int]:
    """Return ``(padding, h, w)``: the conv padding and the spatial size fed to fc1.

    Raises ``ValueError`` when the input is too small for two conv+pool stages.
    """
    if min(height, width) >= MIN_UNPADDED_SIDE:
        padding = 0
    elif min(height, width) >= MIN_PADDED_SIDE:
        padding = KERNEL_SIZE // 2
    else:
        raise ValueError(
            f"cnn needs inputs of at least {MIN_PADDED_SIDE}x{MIN_PADDED_SIDE}, got {height}x{width}")
    h, w = height, width
    for _ in range(2):
        h = (h + 2 * padding - KERNEL_SIZE + 1) // POOL
        w = (w + 2 * padding - KERNEL_SIZE + 1) // POOL
    return padding, h, w


class CNN(nn.Module):
    """McMahan et al.'s CNN with an optional normalization after each conv layer.

    Args:
        in_channels, height, width: input image shape (C, H, W).
        num_classes: number of output logits.
        norm: ``"none"`` (CNN), ``"batch"`` (BN-CNN) or ``"group"`` (GN-CNN).
        group_size, groups: GroupNorm's grouping (geodml.models.norms.group_count).
        norm_fc1: also normalize fc1's output (BatchNorm1d over the 512 features) before its
            ReLU. Off by default because the Quagmire paper's BN-LeNet normalizes after the conv
            layers only (§5.1). Only ``norm="batch"`` supports it: GroupNorm with two
            features per group on a vector normalizes each pair of scalars to +-1, which
            throws away their magnitude, so ``norm="group"`` raises ``ValueError``.

    A layer followed by a normalization has no bias: the normalization's own shift (beta)
    takes its place (for BatchNorm the bias would be cancelled exactly by the mean
    subtraction), and a redundant parameter would still be sent over the WAN by every
    algorithm. It also keeps BN-CNN and GN-CNN the same size, so their bytes compare.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int,
                 norm: str = "none", *, norm_fc1: bool = False, group_size: int | None = None,
                 groups: int | None = None) -> None:
        super().__init__()
        if norm not in MODEL_NORMS["cnn"]:
            raise ValueError(f"cnn: unknown norm {norm!r}; choose one of {', '.join(MODEL_NORMS['cnn'])}")
        if norm_fc1 and norm != "batch":
            raise ValueError(
                "cnn: norm_fc1 needs norm='batch'; GroupNorm with small groups "
                "on fc features collapses each group to +-1, and norm='none' has no norm")
        padding, h, w = cnn_geometry(height, width)
        self.padding = padding
        self.flatten_features = CONV2_CHANNELS * h * w
        with_norm = norm != "none"

        self.conv1 = nn.Conv2d(in_channels, CONV1_CHANNELS, KERNEL_SIZE, padding=padding, bias=not with_norm)
        self.norm1 = make_norm2d(norm, CONV1_CHANNELS, group_size=group_size, groups=groups)
        self.conv2 = nn.Conv2d(CONV1_CHANNELS, CONV2_CHANNELS, KERNEL_SIZE, padding=padding, bias=not with_norm)
        self.norm2 = make_norm2d(norm, CONV2_CHANNELS, group_size=group_size, groups=groups)
        self.pool = MaxPool2d(POOL)
        self.relu = nn.ReLU()
        self.fc1 = nn.Linear(self.flatten_features, FC1_FEATURES, bias=not norm_fc1)
        self.norm_fc1 = nn.BatchNorm1d(FC1_FEATURES) if norm_fc1 else nn.Identity()
        self.fc2 = nn.Linear(FC1_FEATURES, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu(self.norm1(self.conv1(x))))
        x = self.pool(self.relu(self.norm2(self.conv2(x))))
        x = x.flatten(1)
        x = self.relu(self.norm_fc1(self.fc1(x)))
        return self.fc2(x)
