"""ResNet-20 for CIFAR-10 (He et al., CVPR 2016, §4.2), as used in Hsieh et al., "The Non-IID
Data Quagmire" (ICML 2020) §4 and Appendix C Table 2, with BatchNorm or GroupNorm (§5.2).

Architecture (He et al. §4.2, n = 3): conv 3x3x16 -> norm -> ReLU, then three stages of n
basic blocks with 16, 32, 64 channels (the first block of stages 2 and 3 has stride 2),
global average pooling, fc classes. A basic block is conv3x3 -> norm -> ReLU -> conv3x3 ->
norm, plus the shortcut, then ReLU.

Shortcut: option A of He et al. -- identity, and where the shape changes, stride-2
subsampling plus zero-padding of the new channels. It adds no parameters, which is what
He et al. used for CIFAR and what gives the reference count of 269,722 parameters with
BatchNorm on 3x32x32 and 10 classes (option B's 1x1 projections would add 2,752).

Convolutions have no bias because every one is followed by a normalization whose shift
replaces it. With GroupNorm, groups hold 2 adjacent channels by default (G_size = 2 as in §5.2),
so the stages have 8, 16 and 32 groups; ``group_size`` / ``groups`` choose another grouping.
Norm ``"none"`` is refused: ResNet-20 without
normalization does not train at the paper's settings, and the paper never runs it.

Global average pooling makes the network shape-agnostic: 32x32 ends at 8x8, 28x28 at 7x7,
8x8 at 2x2. Any channel count works (conv1 has ``in_channels`` inputs).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from geodml.config import MODEL_NORMS
from geodml.models.norms import make_norm2d

STAGE_CHANNELS = (16, 32, 64)
BLOCKS_PER_STAGE = 3  # n = 3 -> depth 6n + 2 = 20


class BasicBlock(nn.Module):
    """He et al.'s basic block with an option-A (parameter-free) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str, *,
                 group_size: int | None = None, groups: int | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm2d(norm, out_channels, group_size=group_size, groups=groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = make_norm2d(norm, out_channels, group_size=group_size, groups=groups)
        self.stride = stride
        self.extra_channels = out_channels - in_channels
        if self.extra_channels < 0:
            raise ValueError("option-A shortcut cannot reduce channels")

    def shortcut(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            # x[..., ::2, ::2] has ceil(H/2) rows, the same as the stride-2, padding-1 3x3
            # conv on the residual path, so odd sizes (7x7 after MNIST's 28 -> 14) line up.
            x = x[:, :, ::self.stride, ::self.stride]
        if self.extra_channels:
            # Zero channels split evenly before and after, as in the reference CIFAR code.
            before = self.extra_channels // 2
            x = F.pad(x, (0, 0, 0, 0, before, self.extra_channels - before))
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet-20 with ``norm`` in ``("batch", "group")``.

    Initialization follows He et al. (Kaiming-normal, fan_out, for convolutions);
    normalization layers start at weight 1, bias 0.
    """

    def __init__(self, in_channels: int, num_classes: int, norm: str = "batch", *, group_size: int | None = None,
                 groups: int | None = None) -> None:
        super().__init__()
        if norm not in MODEL_NORMS["resnet20"]:
            raise ValueError(f"resnet20: norm must be 'batch' or 'group', got {norm!r} "
                             "(ResNet-20 without normalization is not supported)")
        self.conv1 = nn.Conv2d(in_channels, STAGE_CHANNELS[0], 3, stride=1, padding=1, bias=False)
        self.norm1 = make_norm2d(norm, STAGE_CHANNELS[0], group_size=group_size, groups=groups)
        blocks = []
        channels = STAGE_CHANNELS[0]
        for stage, out_channels in enumerate(STAGE_CHANNELS):
            for i in range(BLOCKS_PER_STAGE):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(channels, out_channels, stride, norm, group_size=group_size, groups=groups))
                channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def prototxt_multipliers(self) -> dict[str, tuple[float, float]]:
        """``{parameter name: (lr_mult, decay_mult)}`` of the authors' ``resnet20`` /
        ``resnetgn20_train_val.prototxt`` for the parameters whose multipliers are not (1, 1):
        every convolution's and the classifier's weights ``decay_mult: 2``, the classifier's bias
        ``decay_mult: 0``; the Scale layers after the norms (here the norms' affine weight and bias)
        have none. The prototxts' convolutions also carry a bias (``decay_mult: 0``), which this
        network does not have: before BatchNorm its gradient is zero; before GroupNorm it is not,
        a documented difference (so is Caffe's Xavier filler against He et al.'s initialization)."""
        mults = {name: (1.0, 2.0) for name, p in self.named_parameters() if p.dim() > 1}
        mults["fc.bias"] = (1.0, 0.0)
        return mults

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.norm1(self.conv1(x)))
        x = self.blocks(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)
