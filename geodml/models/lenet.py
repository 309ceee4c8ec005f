"""LeNet, BN-LeNet and GN-LeNet of Hsieh et al., "The Non-IID Data Quagmire" (ICML 2020).

* LeNet (§3, Appendix C Table 2): conv 5x5x32 -> ReLU -> maxpool 2 -> conv 5x5x64 -> ReLU ->
  maxpool 2 -> fc 512 -> ReLU -> fc classes; 878,538 parameters on 3x32x32 with 10 classes.
* BN-LeNet (§5.1): "constructed by inserting BatchNorm to LeNet after each convolutional
  layer" -- the normalization sits between each conv and its ReLU.
* GN-LeNet (§5.2, §6): BN-LeNet with GroupNorm replacing BatchNorm, group size
  G_size = 2 (two adjacent channels per group, so num_groups = channels / 2).

Shape rule (how the network adapts to 1x8x8 digits, 1x28x28 MNIST, 3x32x32 CIFAR-10):
each stage is conv 5x5 (stride 1, padding p) followed by maxpool 2 (floor). When
``min(H, W) >= 16`` both stages fit without padding (p = 0, the paper's network:
32 -> 28 -> 14 -> 10 -> 5, and 28 -> 24 -> 12 -> 8 -> 4). Smaller inputs would shrink to
nothing, so they use p = 2 ("same" convolutions) and each stage only halves
(8 -> 8 -> 4 -> 4 -> 2). Inputs smaller than 4x4 are rejected. The fc1 input size is
64 * h * w with (h, w) computed from this rule, never hard-coded.
"""

from __future__ import annotations

from torch import Tensor, nn

from geodml.config import MODEL_NORMS

# GroupNorm group size G_size of §5.2 ("We carefully select G_size = 2"): channels per group.
GROUP_SIZE = 2


def make_norm2d(norm: str, channels: int) -> nn.Module:
    """The normalization layer for a conv output with ``channels`` channels.

    ``"none"`` -> identity, ``"batch"`` -> BatchNorm2d, ``"group"`` -> GroupNorm with
    ``GROUP_SIZE`` adjacent channels per group (num_groups = channels / GROUP_SIZE). Shared by
    LeNet and ResNet-20 so GN-LeNet and GN-ResNet-20 group channels the same way.
    """
    if norm == "none":
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        if channels % GROUP_SIZE:
            raise ValueError(f"GroupNorm with group size {GROUP_SIZE} needs an even channel count, got {channels}")
        return nn.GroupNorm(channels // GROUP_SIZE, channels)
    raise ValueError(f"unknown norm {norm!r}; choose one of none, batch, group")


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


def lenet_geometry(height: int, width: int) -> tuple[int, int, int]:
    """Return ``(padding, h, w)``: the conv padding and the spatial size fed to fc1.

    Raises ``ValueError`` when the input is too small for two conv+pool stages.
    """
    if min(height, width) >= MIN_UNPADDED_SIDE:
        padding = 0
    elif min(height, width) >= MIN_PADDED_SIDE:
        padding = KERNEL_SIZE // 2
    else:
        raise ValueError(
            f"lenet needs inputs of at least {MIN_PADDED_SIDE}x{MIN_PADDED_SIDE}, got {height}x{width}")
    h, w = height, width
    for _ in range(2):
        h = (h + 2 * padding - KERNEL_SIZE + 1) // POOL
        w = (w + 2 * padding - KERNEL_SIZE + 1) // POOL
    return padding, h, w


class LeNet(nn.Module):
    """The paper's CIFAR LeNet with an optional normalization after each conv layer.

    Args:
        in_channels, height, width: input image shape (C, H, W).
        num_classes: number of output logits.
        norm: ``"none"`` (LeNet), ``"batch"`` (BN-LeNet) or ``"group"`` (GN-LeNet).
        norm_fc1: also normalize fc1's output (BatchNorm1d over the 512 features) before its
            ReLU. Off by default because the paper's BN-LeNet normalizes after the conv
            layers only (§5.1). Only ``norm="batch"`` supports it: GroupNorm with two
            features per group on a vector normalizes each pair of scalars to +-1, which
            throws away their magnitude, so ``norm="group"`` raises ``ValueError``.

    A layer followed by a normalization has no bias: the normalization's own shift (beta)
    takes its place (for BatchNorm the bias would be cancelled exactly by the mean
    subtraction), and a redundant parameter would still be sent over the WAN by every
    algorithm. It also keeps BN-LeNet and GN-LeNet the same size, so their bytes compare.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int,
                 norm: str = "none", *, norm_fc1: bool = False) -> None:
        super().__init__()
        if norm not in MODEL_NORMS["lenet"]:
            raise ValueError(f"lenet: unknown norm {norm!r}; choose one of {', '.join(MODEL_NORMS['lenet'])}")
        if norm_fc1 and norm != "batch":
            raise ValueError(
                "lenet: norm_fc1 needs norm='batch'; GroupNorm with group size "
                f"{GROUP_SIZE} on fc features collapses each group to +-1, and norm='none' has no norm")
        padding, h, w = lenet_geometry(height, width)
        self.padding = padding
        self.flatten_features = CONV2_CHANNELS * h * w
        with_norm = norm != "none"

        self.conv1 = nn.Conv2d(in_channels, CONV1_CHANNELS, KERNEL_SIZE, padding=padding, bias=not with_norm)
        self.norm1 = make_norm2d(norm, CONV1_CHANNELS)
        self.conv2 = nn.Conv2d(CONV1_CHANNELS, CONV2_CHANNELS, KERNEL_SIZE, padding=padding, bias=not with_norm)
        self.norm2 = make_norm2d(norm, CONV2_CHANNELS)
        self.pool = nn.MaxPool2d(POOL)
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
