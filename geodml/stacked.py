"""Many models' minibatch gradients in one vectorized call (``--vmap on``; geodml.pool).

The pool engine keeps a step's participants as rows of one ``[m, n]`` weight matrix (each row a
model's :class:`~geodml.algorithms.base.FlatParams` layout). :class:`StackedGradient` computes
every row's gradient of the mean cross-entropy on its own minibatch with one
``torch.func.vmap(grad_and_value(...))`` over ``functional_call`` of the process's one model
(its parameters swapped for views into the row), in chunks of at most ``images_per_call``
images so the activations stay bounded.

Contract: for row i, ``out[i]`` is the gradient ``(1/B) sum_b d CE(model(x[i, b]; w_i), y[i, b]) /
d w_i`` that ``loss.backward()`` leaves in ``FlatParams.grad`` (geodml.trainer.local_gradient,
no weight decay); the returned losses and correct counts are per row. The arithmetic is the same
but not in the same order: vmap turns a batch of convolutions with different weights into one
grouped convolution, whose kernels sum in another order, so rows agree with the one-at-a-time
gradient to float32 rounding (~1e-7 relative), not bit for bit (tests/test_stacked.py).

Applies to models whose state is parameters only (no float buffers: BatchNorm running
statistics would need a per-row buffer update that ``functional_call`` does not give back);
:func:`vmap_refusal` says why not otherwise. Measured on this project's 2-core CPU host, vmap is
no faster than the per-partition loop (LeNet on 8x8 digits: equal; on 28x28 images, and the
McMahan CNN, 1.7 to 4x slower: grouped convolutions are slow on the CPU), so ``--vmap auto``
keeps the loop on the CPU (docs/performance.md).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

IMAGES_PER_CALL = 1024
"""Images per vectorized call (chunks of participants): bounds the activations' memory."""


def vmap_refusal(model: nn.Module) -> str | None:
    """Why the stacked path cannot train ``model`` (None: it can)."""
    if any(b.is_floating_point() for b in model.buffers()):
        return "the model has float buffers (BatchNorm running statistics)"
    return None


class StackedGradient:
    """Per-row minibatch gradients of one model architecture (module docstring)."""

    def __init__(self, model: nn.Module, images_per_call: int = IMAGES_PER_CALL) -> None:
        why = vmap_refusal(model)
        assert why is None, why
        self.model = model
        params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.layout: list[tuple[str, int, int, torch.Size]] = []
        offset = 0
        for name, p in params:  # FlatParams' order: model.parameters()
            self.layout.append((name, offset, p.numel(), p.shape))
            offset += p.numel()
        self.numel = offset
        self.images_per_call = int(images_per_call)
        self._fn = grad_and_value(self._loss, has_aux=True)

    def _loss(self, row: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = {name: row[o:o + k].view(shape) for name, o, k, shape in self.layout}
        logits = functional_call(self.model, params, (x,))
        return F.cross_entropy(logits, y), (logits.argmax(1) == y).sum()

    def __call__(self, weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                 out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Gradients of the rows of ``weights`` ([m, n]) on minibatches ``x`` ([m, B, ...]) and
        ``y`` ([m, B]) into ``out`` ([m, n]); returns (losses [m], correct [m], compute seconds)."""
        m, b = y.shape
        assert weights.shape == out.shape == (m, self.numel) and x.shape[:2] == (m, b)
        chunk = max(1, self.images_per_call // max(b, 1))
        t0 = time.perf_counter()
        grads, (losses, correct) = vmap(self._fn, chunk_size=chunk if chunk < m else None)(weights, x, y)
        out.copy_(grads)
        return losses.detach(), correct, time.perf_counter() - t0
