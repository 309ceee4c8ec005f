"""``--channels-last``: the forward and backward pass on a channels-last copy of the model.

geodml's parameters are views into one flat NCHW buffer (geodml.algorithms.base.FlatParams), and
that flat order is what the algorithms, the sparse wire encodings and the checkpoints see. On the
CPU, convolutions run faster when the weights and activations are channels-last (NHWC strides):
1.2-1.35x per step for cnn, LeNet and BN-ResNet-20 (docs/performance.md). :class:`ChannelsLastTwin`
gets that without touching the flat order: a second copy of the model, converted with
``Module.to(memory_format=torch.channels_last)``, that every step

1. receives the flat convolution weights (``pull``: one ``copy_`` per conv weight into
   preallocated channels-last tensors),
2. runs the forward and backward pass,
3. writes the convolution weights' gradients back into ``FlatParams.grad`` (``push_grads``),
   where the algorithm, weight decay and the ledger find them exactly as without the flag.

Only the 4-D weights are copies. Every other parameter (biases, fully connected layers, norm
scales) is the model's own tensor, a view into the flat buffer, so the large fully connected
layers are never copied and their gradients land in ``FlatParams.grad`` directly. The twin also
shares the model's buffers (BatchNorm running statistics, BatchReNorm's step count: the same
tensor objects), so the running statistics are updated once, in the tensors the evaluation and
the engine's partition state read, and it follows the model's train/eval mode.

Contract: ``local_gradient`` with a twin leaves in ``flat.grad`` the gradient of the same loss at
the same weights, computed with other kernels: equal to float32 rounding (~1e-6 relative; the
summation order differs), not bit for bit (tests/test_channels_last.py). Bytes on the wire depend
on the flat vector only and are unchanged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from geodml.algorithms.base import FlatParams


class ChannelsLastTwin:
    """A channels-last copy of ``model``'s convolutions, trained in its place and synced with ``flat``
    every step. Only the 4-D (convolution) weights are copies; every other parameter and buffer is
    the model's own tensor (a view into the flat buffer), so its gradient lands in ``flat.grad``
    directly and nothing but the convolution weights and their gradients is copied per step."""

    def __init__(self, model: nn.Module, flat: FlatParams, xb: torch.Tensor) -> None:
        twin = copy.deepcopy(model)
        for mine, theirs in zip(twin.modules(), model.modules(), strict=True):
            for name, buf in theirs._buffers.items():  # the same tensors: updated once, read by everyone
                mine._buffers[name] = buf
            for name, param in theirs._parameters.items():
                if param is not None and param.dim() != 4:
                    mine._parameters[name] = param  # shared: a view into flat.data, its grad into flat.grad
        twin.to(memory_format=torch.channels_last)  # converts the (copied) 4-D weights only
        params = [p for p in twin.parameters() if p.requires_grad]
        assert [p.shape for p in params] == [p.shape for p in flat.params], "twin and model disagree on parameters"
        self.model = twin
        # the copied convolution weights and their gradients, and the model's (views into the flat buffers)
        self.convs: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.sources: list[torch.Tensor] = []  # the model's parameters (their .data: the bound partition's weights)
        self.flat_grads: list[torch.Tensor] = []
        for p, src in zip(params, flat.params):
            if p is not src:
                assert src.grad is not None  # FlatParams points every parameter's grad into flat.grad
                p.grad = torch.zeros_like(p)  # preserve_format: channels-last
                self.convs.append(p)
                self.grads.append(p.grad)
                self.sources.append(src)
                self.flat_grads.append(src.grad)
        self.xb = torch.empty_like(xb, memory_format=torch.channels_last) if xb.dim() == 4 else torch.empty_like(xb)

    def pull(self, model: nn.Module) -> None:
        """The flat convolution weights into the twin, their gradients zeroed, its mode the model's."""
        if self.model.training != model.training:
            self.model.train(model.training)
        with torch.no_grad():
            for p, src, g in zip(self.convs, self.sources, self.grads):
                p.copy_(src.data)
                g.zero_()

    def forward(self, model: nn.Module, xb: torch.Tensor) -> torch.Tensor:
        """``model(xb)`` computed by the twin (``pull`` first)."""
        self.pull(model)
        self.xb.copy_(xb)
        return self.model(self.xb)

    def push_grads(self) -> None:
        """The convolution weights' gradients into ``FlatParams.grad`` (the other parameters' are there already)."""
        with torch.no_grad():
            for g, dest in zip(self.grads, self.flat_grads):
                dest.copy_(g)
