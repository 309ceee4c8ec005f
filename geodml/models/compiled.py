"""Layers with torch's results bit for bit and a compiled CPU path (``geodml._kernels``):
:class:`MaxPool2d` and :class:`LocalResponseNorm`, drop-in for their ``nn`` namesakes in cnn,
lenet and cifar-cnn.

**Max-pool.** torch's CPU max-pool over a contiguous NCHW float32 tensor takes a data-dependent
branch per pixel; on ReLU outputs (about half zeros) it mispredicts often and was 14-24% of a
training step of these models on one core (docs/performance.md, "Max-pooling"). The compiled
forward follows torch's own rule (scan each window row by row, take a pixel when it is greater
than the running maximum or NaN) without branches, so its values and argmax indices are torch's;
the backward pass is torch's own ``max_pool2d_with_indices_backward`` on those indices.

**LRN.** torch's ``local_response_norm`` averages the squared input over a window of channels
with ``avg_pool3d``, whose CPU kernel was 15% of lenet's step and 29% of cifar-cnn's. Only that
window mean, forward and backward, is compiled (``lrn_mean``), in avg_pool3d's own order of
additions; the squaring, scaling, power and division stay torch's operations.

So a run is bit-identical with and without the compiled path (tests/test_compiled_layers.py);
only the time changes. Each layer falls back to its ``nn`` parent whenever the contract does not
hold: no compiled kernels (``GEODML_NO_KERNELS``, or no C compiler at install time), a tensor
not on the CPU, not float32 or not contiguous NCHW (``--channels-last``, whose NHWC kernels are
fast already), max-pool padding or dilation, or inside a torch.func transform (``--vmap``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from geodml import kernels


def _compiled_applies(x: Tensor) -> bool:
    """The compiled path's contract on the input (module docstring); layer options are checked by the layer."""
    return (kernels.compiled is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 4
            and x.is_contiguous() and not torch._C._are_functorch_transforms_active())


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
        if (not _compiled_applies(x) or self.return_indices or _pair(self.padding) != (0, 0)
                or _pair(self.dilation) != (1, 1)):
            return super().forward(x)
        kernel = _pair(self.kernel_size)
        stride = _pair(self.stride if self.stride is not None else self.kernel_size)
        return _FastMaxPool2d.apply(x, kernel, stride, bool(self.ceil_mode))


class _ChannelWindowMean(torch.autograd.Function):
    """``avg_pool3d(pad(s, channels size // 2 before, (size - 1) // 2 after), (size, 1, 1), stride 1)``
    of ``s`` [N, C, H, W] viewed as [N, 1, C, H, W], as local_response_norm computes it: the same
    bits forward and backward (geodml/_kernels.c, lrn_mean)."""

    @staticmethod
    def forward(ctx, s: Tensor, size: int) -> Tensor:  # type: ignore[override]
        n, c, h, w = s.shape
        out = torch.empty_like(s)
        assert kernels.compiled is not None
        kernels.compiled.lrn_mean(s.detach().view(n, c, h * w).numpy(), out.view(n, c, h * w).numpy(), size)
        ctx.size = size
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous()
        n, c, h, w = grad.shape
        gin = torch.empty_like(grad)
        assert kernels.compiled is not None
        kernels.compiled.lrn_mean_backward(grad.view(n, c, h * w).numpy(), gin.view(n, c, h * w).numpy(), ctx.size)
        return gin, None


class LocalResponseNorm(nn.LocalResponseNorm):
    """``nn.LocalResponseNorm`` (same arguments, same results bit for bit) with the channel-window
    mean compiled on the CPU (module docstring); the rest is ``F.local_response_norm``'s operations."""

    def forward(self, x: Tensor) -> Tensor:
        if not _compiled_applies(x):
            return super().forward(x)
        div = _ChannelWindowMean.apply(x.mul(x), self.size)
        div = div.mul(self.alpha).add(self.k).pow(self.beta)
        return x / div
