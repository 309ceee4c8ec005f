"""Normalization layers of the study's networks, and how GroupNorm's groups are counted.

* ``make_norm2d``: PyTorch's BatchNorm2d / GroupNorm with their learnable scale and shift, used
  by ``cnn`` and ``resnet20`` (whose sources are not Caffe prototxts).
* ``CaffeBatchNorm2d``: Caffe's ``BatchNorm`` layer as the authors' BN-LeNet uses it
  (github.com/kevinhsieh/non_iid_dml, ``apps/caffe/src/caffe/layers/batch_norm_layer.cpp`` and
  ``examples/cifar10/*/bnlenet_train_val.prototxt.template``): no scale or shift (the prototxt
  has no ``Scale`` layer after it), eps 1e-5, and Caffe's moving averages (below).
* ``BatchReNorm2d``: Batch Renormalization (Ioffe, NIPS 2017) as the authors' Caffe
  ``BatchReNorm`` layer computes it (``batch_renorm_layer.cpp``/``.cu``), with the schedule of r_max
  and d_max of ``BatchReNormSchedule``; the defaults are those of
  ``examples/cifar10/2parts/brnlenet_train_val.prototxt.template`` (Quagmire Table 9, K=2).

**Caffe's moving averages.** Caffe keeps unnormalized sums S (per channel) and a weight W and
estimates S / W: each training batch does ``W = f W + 1``, ``S_mean = f S_mean + mean_B``,
``S_var = f S_var + m/(m-1) var_B`` (m = N*H*W values per channel; var_B the biased batch
variance), f the ``moving_average_fraction``. This module stores the estimates themselves
(``running_mean = S_mean / W``, ``running_var = S_var / W``, updated as ``est += (x - est) / W``,
the same numbers) and W as ``average_weight``; before any training batch all three are 0, and
evaluation then divides by sqrt(0 + eps), as Caffe does. Evaluation normalizes with the
estimates; training with the batch's own statistics.

**What differs from the released system.** Its GPU layers write the moving-average change as a
"gradient" that the parameter server applies with a fixed rate of 1 (``FIX_LEARNING_RATE`` in
``solver.cpp``), so the statistics travel like weights and the BRN step counter advances only
on worker 0. Here the statistics are buffers of each partition's model: never sent by the
algorithms, averaged over partitions only where geodml evaluates or averages a global model
(geodml.trainer, FedAvg), and the step counter is each partition's own (``step``, an integer
buffer, so it is never averaged). Under BSP every partition steps together, so the counters agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

GROUP_SIZE = 2
"""GroupNorm group size G_size of Quagmire §5.2 ("We carefully select G_size = 2"): channels per group."""


def group_count(channels: int, *, group_size: int | None = None, groups: int | None = None) -> int:
    """Number of GroupNorm groups for ``channels`` channels.

    Exactly one reading applies: ``groups`` (a fixed count per layer, the released gnlenet
    prototxt's ``group_num: 2``) when given, else ``group_size`` channels per group (the paper's
    text, §5.2: G_size = 2; ``GROUP_SIZE`` when None). Raises ``ValueError`` when both are given
    or the channels do not divide evenly.
    """
    if groups is not None and group_size is not None:
        raise ValueError("give a GroupNorm group size or a group count, not both")
    if groups is not None:
        if groups < 1 or channels % groups:
            raise ValueError(f"GroupNorm with {groups} groups needs a channel count divisible by it, got {channels}")
        return groups
    size = GROUP_SIZE if group_size is None else group_size
    if size < 1 or channels % size:
        raise ValueError(f"GroupNorm with group size {size} needs a channel count divisible by it, got {channels}")
    return channels // size


def make_norm2d(norm: str, channels: int, *, group_size: int | None = None, groups: int | None = None) -> nn.Module:
    """PyTorch's normalization for a conv output with ``channels`` channels (learnable scale and shift).

    ``"none"`` -> identity, ``"batch"`` -> BatchNorm2d, ``"group"`` -> GroupNorm with
    ``group_count(channels, group_size=..., groups=...)`` groups of adjacent channels. Shared by
    the CNN and ResNet-20 so their GN variants group channels the same way.
    """
    if norm == "none":
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(group_count(channels, group_size=group_size, groups=groups), channels)
    raise ValueError(f"unknown norm {norm!r}; choose one of none, batch, group")


class CaffeBatchNorm2d(nn.Module):
    """Caffe's BatchNorm layer: per-channel, no scale or shift, bias-corrected moving averages.

    Training mode: ``y = (x - mean_B) / sqrt(var_B + eps)`` with the batch's mean and biased
    variance over (N, H, W), then the moving averages take the batch in (module docstring).
    Evaluation mode: ``y = (x - running_mean) / sqrt(running_var + eps)``.
    """

    def __init__(self, channels: int, *, moving_average_fraction: float = 0.999, eps: float = 1e-5) -> None:
        super().__init__()
        assert channels >= 1 and 0 <= moving_average_fraction <= 1 and eps > 0
        self.channels, self.moving_average_fraction, self.eps = channels, float(moving_average_fraction), float(eps)
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.zeros(channels))
        self.register_buffer("average_weight", torch.zeros(()))

    def extra_repr(self) -> str:
        return f"{self.channels}, moving_average_fraction={self.moving_average_fraction}, eps={self.eps}"

    def _batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        assert x.dim() == 4 and x.shape[1] == self.channels, f"expected [N, {self.channels}, H, W], got {list(x.shape)}"
        mean = x.mean(dim=(0, 2, 3))
        var = (x - mean[None, :, None, None]).square().mean(dim=(0, 2, 3))
        return mean, var

    @torch.no_grad()
    def _update_moving_averages(self, mean: Tensor, var: Tensor, m: int) -> None:
        self.average_weight.mul_(self.moving_average_fraction).add_(1.0)
        w = self.average_weight
        self.running_mean.add_((mean - self.running_mean) / w)
        unbiased = var * (m / (m - 1) if m > 1 else 1.0)
        self.running_var.add_((unbiased - self.running_var) / w)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return (x - self.running_mean[None, :, None, None]) / torch.sqrt(self.running_var + self.eps)[None, :, None, None]
        mean, var = self._batch_stats(x)
        self._update_moving_averages(mean.detach(), var.detach(), x.numel() // self.channels)
        return (x - mean[None, :, None, None]) / torch.sqrt(var + self.eps)[None, :, None, None]


@dataclass(frozen=True)
class BatchReNormSchedule:
    """Hyper-parameters of the authors' Caffe BatchReNorm layer (``BatchReNormParameter``).

    Before ``step_to_init`` training steps the layer is plain BatchNorm (r = 1, d = 0). From then
    on, at (0-based) step t, with j = t - step_to_init + 1:
    ``r_max(t) = max(1, min(1 + j (r_max - 1) / (step_to_r_max - step_to_init), r_max))`` and
    ``d_max(t) = max(0, min(j d_max / (step_to_d_max - step_to_init), d_max))``.
    Defaults: the 2-partition brnlenet prototxt of Quagmire Table 9 (its run: 64,000 iterations
    of batch 50; scale the three steps with a shorter budget). The 5-partition prototxt uses
    20,000 / 40,000 / 30,000 steps with the same r_max, d_max and fraction.
    """

    step_to_init: int = 5000
    step_to_r_max: int = 20000
    step_to_d_max: int = 20000
    r_max: float = 4.0
    d_max: float = 6.0
    moving_average_fraction: float = 0.99
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if not (0 <= self.step_to_init < self.step_to_r_max and self.step_to_init < self.step_to_d_max):
            raise ValueError(f"BatchReNorm steps need 0 <= step_to_init < step_to_r_max, step_to_d_max, got "
                             f"{self.step_to_init}, {self.step_to_r_max}, {self.step_to_d_max}")
        if not (math.isfinite(self.r_max) and self.r_max >= 1 and math.isfinite(self.d_max) and self.d_max >= 0):
            raise ValueError(f"BatchReNorm needs r_max >= 1 and d_max >= 0, got {self.r_max}, {self.d_max}")
        if not 0 <= self.moving_average_fraction <= 1:
            raise ValueError(f"BatchReNorm moving_average_fraction must be in [0, 1], got {self.moving_average_fraction}")

    def limits(self, step: int) -> tuple[float, float] | None:
        """``(r_max(step), d_max(step))``, or None before ``step_to_init`` (plain BatchNorm)."""
        if step < self.step_to_init:
            return None
        j = step - self.step_to_init + 1
        r = max(1.0, min(1.0 + j * (self.r_max - 1.0) / (self.step_to_r_max - self.step_to_init), self.r_max))
        d = max(0.0, min(j * self.d_max / (self.step_to_d_max - self.step_to_init), self.d_max))
        return r, d


class BatchReNorm2d(CaffeBatchNorm2d):
    """Batch Renormalization (Ioffe 2017) as the authors' Caffe layer: no scale or shift.

    Training step t (``step``, counted by this layer; one forward in training mode = one step):
    the batch's ``mean_B``, ``sigma_B = sqrt(var_B + eps)``; from ``step_to_init`` on, with the
    moving estimates *before* this batch enters them, ``sigma = sqrt(running_var + eps)``,
    ``r = clip(sigma_B / sigma, 1/r_max(t), r_max(t))``, ``d = clip((mean_B - running_mean) / sigma,
    -d_max(t), d_max(t))``, both constants for the gradient; ``y = (x - mean_B) / sigma_B * r + d``.
    Then the moving averages take the batch in, as in ``CaffeBatchNorm2d``. Evaluation mode
    normalizes with the moving estimates (no r, d).
    """

    def __init__(self, channels: int, schedule: BatchReNormSchedule | None = None) -> None:
        schedule = schedule or BatchReNormSchedule()
        super().__init__(channels, moving_average_fraction=schedule.moving_average_fraction, eps=schedule.eps)
        self.schedule = schedule
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, schedule={self.schedule}"

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        mean, var = self._batch_stats(x)
        sigma_b = torch.sqrt(var + self.eps)
        y = (x - mean[None, :, None, None]) / sigma_b[None, :, None, None]
        limits = self.schedule.limits(int(self.step))
        if limits is not None:
            r_max, d_max = limits
            with torch.no_grad():
                sigma = torch.sqrt(self.running_var + self.eps)
                r = (sigma_b / sigma).clamp_(1.0 / r_max, r_max)
                d = ((mean - self.running_mean) / sigma).clamp_(-d_max, d_max)
            y = y * r[None, :, None, None] + d[None, :, None, None]
        self._update_moving_averages(mean.detach(), var.detach(), x.numel() // self.channels)
        self.step.add_(1)
        return y
