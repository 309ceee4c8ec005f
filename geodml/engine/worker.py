"""The worker: the one model a process trains its hosted partitions on, and what they share.

Hosted partitions take turns on the process's thread (geodml.engine.hub), so one ``nn.Module``
serves them all. What is a partition's own -- its weights and every buffer of the model (BatchNorm's
running statistics and BatchReNorm's step counter) -- lives in the partition's own
:class:`~geodml.algorithms.base.FlatParams` (:meth:`Worker.new_partition`); before a partition runs,
:meth:`Worker.bind` points the module's parameters and buffers at that partition's tensors (a
pointer change per tensor, no copy). What no partition keeps between its turns is the worker's,
shared: the gradient (every partition's ``FlatParams.grad`` is the worker's), the minibatch
buffers, the channels-last copy of the convolutions (``--channels-last``) and SkewScout's visitor
model. A partition's turn never spans a switch in the middle of a forward or backward pass, and
the gradient is consumed before the partition waits (a collective on it copies it as it arrives:
geodml.comm.inprocess), so sharing changes no value.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from geodml.algorithms.base import FlatParams
from geodml.algorithms.shared import ProcessShared
from geodml.channels_last import ChannelsLastTwin
from geodml.config import OptimConfig

POISON_ENV = "GEODML_POISON_SCRATCH"
"""``GEODML_POISON_SCRATCH=1``: :attr:`Worker.poison` (a test switch; results must not change)."""


class Worker:
    """One process's model and shared buffers (module docstring). ``model`` holds the initial
    weights every partition starts from."""

    def __init__(self, model: nn.Module, flat: FlatParams, *, train_x: torch.Tensor, train_y: torch.Tensor,
                 optim: OptimConfig, channels_last: bool = False) -> None:
        self.model, self.flat = model, flat
        self.train_x, self.train_y, self.optim = train_x, train_y, optim
        device = flat.data.device
        # Preallocated minibatch buffers (no per-step tensor churn), shared by every partition.
        self.xb = torch.empty((optim.batch_size, *train_x.shape[1:]), dtype=train_x.dtype, device=device)
        self.yb = torch.empty(optim.batch_size, dtype=train_y.dtype, device=device)
        self.idx = torch.empty(optim.batch_size, dtype=torch.int64, device=device)
        self.twin = ChannelsLastTwin(model, flat, self.xb) if channels_last else None
        models = [model] + ([self.twin.model] if self.twin is not None else [])
        # every (module, buffer name) slot that holds one of the model's buffers, in model.buffers() order
        self._slots: list[list[tuple[nn.Module, str]]] = []
        for buf in flat.buffers:
            self._slots.append([(m, name) for net in models for m in net.modules()
                                for name, b in m._buffers.items() if b is buf])
        self._visitor: tuple[nn.Module, FlatParams] | None = None
        self._partitions: dict[int, FlatParams] = {}
        self._entered: int | None = None
        self._global: tuple[FlatParams, torch.Tensor] | None = None
        self.bound: FlatParams | None = None
        self.shared = ProcessShared()
        """The algorithms' scratch and once-per-process values (geodml.algorithms.shared), for every partition."""
        self.poison = os.environ.get(POISON_ENV) == "1"
        """Fill the shared buffers with garbage (NaN, -1) whenever another partition is bound: a value
        read across a switch then shows (the golden tests run so; POISON_ENV)."""

    @classmethod
    def of(cls, model: nn.Module, flat: FlatParams, *, train_x: torch.Tensor, train_y: torch.Tensor,
           optim: OptimConfig, channels_last: bool = False) -> Worker:
        """A worker of one partition whose weights are ``flat`` itself (a Trainer built without one)."""
        worker = cls(model, flat, train_x=train_x, train_y=train_y, optim=optim, channels_last=channels_last)
        worker.bound = flat
        return worker

    def new_partition(self, rank: int) -> FlatParams:
        """Partition ``rank``'s own weights and buffers, a copy of the initial model's (bound at once)."""
        own = self._partitions[rank] = self.flat.own_copy()
        self.bind(own)
        return own

    def enter(self, rank: int) -> None:
        """Bind partition ``rank`` (the hub calls it before the partition's task runs; nothing before
        the partition has its own weights). In the poison test mode a switch from another partition
        fills the shared buffers with garbage first."""
        if self.poison and self._entered is not None and self._entered != rank:
            for t in (self.flat.grad, self.xb):
                if t.is_floating_point():
                    t.fill_(float("nan"))
            self.yb.fill_(-1)
            self.idx.fill_(-1)
            self.shared.poison()
        self._entered = rank
        own = self._partitions.get(rank)
        if own is not None:
            self.bind(own)

    def global_view(self) -> tuple[FlatParams, torch.Tensor]:
        """Weights and buffers of the process's one scratch model (geodml.algorithms.shared: filled and
        used within a turn), into which a partition computes the global model to evaluate it, and the
        one vector that holds its weights then its float buffers."""
        if self._global is None:
            g = self.flat.own_copy()
            sc = self.shared.scratch
            n = g.numel
            nfloat = sum(b.numel() for b in g.float_buffers)
            # the weights, then the float buffers, in one vector: one collective computes the global model
            packed = sc("worker.global_model", n + nfloat, g.data.dtype, g.data.device)
            g.data = packed[:n]
            offsets = [0]
            for v in g.views:
                offsets.append(offsets[-1] + v.numel())
            g.views = [g.data[a:b].view_as(v) for v, a, b in zip(g.views, offsets, offsets[1:])]
            buffers, off = [], n
            for i, b in enumerate(g.buffers):
                if b.is_floating_point():
                    buffers.append(packed[off:off + b.numel()].view_as(b))
                    off += b.numel()
                else:
                    buffers.append(sc(f"worker.global_buffer.{i}", b.shape, b.dtype, b.device))
            g.buffers = buffers
            g.float_buffers = [b for b in g.buffers if b.is_floating_point()]
            self._global = (g, packed)
        return self._global

    def bind(self, part: FlatParams) -> None:
        """Point the model's parameters and buffers at ``part``'s tensors (a no-op when they are)."""
        if self.bound is part:
            return
        for p, view in zip(self.flat.params, part.views):
            p.data = view
        for slots, buf in zip(self._slots, part.buffers):
            for module, name in slots:
                module._buffers[name] = buf
        self.bound = part

    def visitor(self) -> tuple[nn.Module, FlatParams]:
        """SkewScout's visitor: a model of this process's own into which a travelling model is loaded
        and evaluated, shared by the partitions (built on first use)."""
        if self._visitor is None:
            model = copy.deepcopy(self.model)
            self._visitor = (model, FlatParams(model))
        return self._visitor
