"""Max-pooling with torch's results, faster on the CPU (the models' ``nn.MaxPool2d``).

torch's CPU max-pool over a contiguous NCHW float32 tensor takes a data-dependent branch per
pixel; on ReLU outputs (about half zeros) it mispredicts often and was 20-24% of a training step
of ``cnn`` and ``lenet`` on one core (docs/performance.md, "Max-pooling"). :class:`MaxPool2d`
computes the forward pass with the branch-free loop of ``geodml._kernels.max_pool2d``, which
follows torch's own rule (scan each window row by row, take a pixel when it is greater than the
running maximum or NaN), so its values and its argmax indices are torch's bit for bit; the
backward pass is torch's own ``max_pool2d_with_indices_backward`` on those indices. So a run is
bit-identical with and without it (tests/test_pooling.py); only the time changes.

It falls back to ``nn.MaxPool2d`` whenever the fast path's contract does not hold: no compiled
kernels (``GEODML_NO_KERNELS``, or no C compiler at install time), a tensor not on the CPU, not
float32 or not contiguous NCHW (``--channels-last``, whose NHWC pool is fast already), padding
or dilation, or inside a torch.func transform (``--vmap``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from geodml import kernels


def _pool_size(size: int, kernel: int, stride: int, ceil_mode: bool) -> int:
    """torch's output size along one side without padding or dilation (pooling_output_shape):
    in ceil mode the last window must still start inside the input."""
    span = size - kernel
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size:
        out -= 1
    return out


class _FastMaxPool2d(torch.autograd.Function):
    """Forward: the compiled kernel (values and, when a gradient is needed, indices). Backward:
    torch's own kernel from the same indices."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel: tuple[int, int], stride: tuple[int, int],  # type: ignore[override]
                ceil_mode: bool) -> Tensor:
        n, c, h, w = x.shape
        oh = _pool_size(h, kernel[0], stride[0], ceil_mode)
        ow = _pool_size(w, kernel[1], stride[1], ceil_mode)
        out = x.new_empty((n, c, oh, ow))
        indices = torch.empty((n, c, oh, ow), dtype=torch.int64) if ctx.needs_input_grad[0] else None
        planes = (n * c, h, w)
        assert kernels.compiled is not None
        kernels.compiled.max_pool2d(x.detach().view(planes).numpy(), out.view(n * c, oh, ow).numpy(),
                                    None if indices is None else indices.view(n * c, oh, ow).numpy(),
                                    kernel[0], kernel[1], stride[0], stride[1])
        if indices is not None:
            ctx.save_for_backward(x, indices)
            ctx.mark_non_differentiable(indices)
        ctx.kernel, ctx.stride, ctx.ceil_mode = kernel, stride, ceil_mode
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        x, indices = ctx.saved_tensors
        dx = torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, list(ctx.kernel), list(ctx.stride), [0, 0], [1, 1], ctx.ceil_mode, indices)
        return dx, None, None, None


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` (same arguments, same results bit for bit) with the compiled CPU forward
    where it applies (module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        if (kernels.compiled is None or self.return_indices or x.device.type != "cpu" or x.dtype != torch.float32
                or x.dim() != 4 or not x.is_contiguous() or _pair(self.padding) != (0, 0)
                or _pair(self.dilation) != (1, 1) or torch._C._are_functorch_transforms_active()):
            return super().forward(x)
        kernel = _pair(self.kernel_size)
        stride = _pair(self.stride if self.stride is not None else self.kernel_size)
        return _FastMaxPool2d.apply(x, kernel, stride, bool(self.ceil_mode))
