"""The Algorithm interface every decentralized learning algorithm implements.

Quagmire (Hsieh et al., ICML 2020) Appendix A writes every algorithm on top of *vanilla
momentum SGD* on node k::

    u <- m * u - eta * grad f(w, b)        # grad includes the L2 weight-decay term
    w <- w + u

The trainer calls, every minibatch, after ``loss.backward()`` has filled ``flat.grad``
(weight decay already added):

    algo.step(step, lr)  ==  before_step(step, lr); local_update(step, lr); after_step(step, lr)

* ``before_step``  -- gradient exchange (BSP all-reduces ``flat.grad``).
* ``local_update`` -- the local momentum-SGD update above, on flat buffers; DGC overrides it.
* ``after_step``   -- parameter/update exchange (Gaia significant updates, FedAvg averaging).

Before that, the trainer asks ``algo.work`` (:class:`LocalWork`) what to compute: whether this
partition computes at all this step, which examples, and how they weigh in the loss. Only the
FedAvg family (client sampling, FedVC, FedIR, IWDS) differs from :class:`PlainWork`.

SkewScout turns ``algo.knob`` (geodml.algorithms.knob.Knob; None: no knob).

An algorithm talks only through ``self.comm`` (geodml.comm.api.Comm); it never opens a socket or
calls torch.distributed itself. Its state is one checkpointable object: hyper-parameters,
internal state (tensors) and statistics (docs/design.md style rule 5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from geodml.algorithms.knob import Knob
from geodml.algorithms.shared import ProcessShared

if TYPE_CHECKING:
    from geodml.comm.api import Comm


@dataclass(frozen=True)
class AlgoContext:
    """What an algorithm may know about the run besides its hyper-parameters."""

    rank: int
    world_size: int
    seed: int
    steps_per_epoch: int
    total_steps: int
    batch_size: int
    label_counts: np.ndarray
    """[K, C] training-label counts of every partition (identical on every rank)."""
    shared: ProcessShared = field(default_factory=ProcessShared, compare=False, repr=False)
    """What the partitions this process hosts share: scratch buffers and once-per-process values
    (geodml.algorithms.shared; a context of its own, nothing shared, unless the engine passes one)."""


def add_sparse_array(dst: torch.Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
    """``dst[idx] += vals`` for a received sparse update (integer indices, distinct; float values of
    ``dst``'s dtype; possibly read-only arrays): one ``index_add_``, the same sum as adding the dense
    vector element by element."""
    i = torch.from_numpy(np.asarray(idx, dtype=np.int64).reshape(-1))   # a new array unless already int64
    v = torch.from_numpy(np.require(vals, requirements="W").reshape(-1))  # a copy only of a read-only array
    dst.view(-1).index_add_(0, i.to(dst.device), v.to(dst.device))


def copy_array_into(dst: torch.Tensor, src: np.ndarray) -> None:
    """Copy a received (possibly read-only) numpy array into a preallocated tensor of the same
    number of elements, without a temporary on the CPU path."""
    if dst.device.type == "cpu":
        np.copyto(dst.numpy().reshape(-1), np.asarray(src).reshape(-1), casting="no")
    else:  # one host->device copy; the pinned staging buffer is torch's business
        dst.view(-1).copy_(torch.from_numpy(np.array(src, copy=True).reshape(-1)), non_blocking=False)


class FlatParams:
    """All trainable parameters of a model as views into one contiguous buffer.

    ``data`` holds the weights and ``grad`` the gradients; every ``p.data`` / ``p.grad`` of
    the model is a view into them, so an algorithm works on one flat tensor with no per-step
    allocation (docs/design.md style rule 12) and autograd accumulates straight into ``grad``.
    Buffers (BatchNorm running statistics) stay in the model; ``float_buffers`` lists them.
    ``layers`` lists each layer's ``(offset, numel)`` in ``data``: the parameters a module owns
    directly (a conv's weight and bias), contiguous, in order, covering ``data`` exactly.

    ``multipliers`` (``{parameter name: (lr_mult, decay_mult)}``, geodml.models.param_multipliers)
    become the flat ``lr_mult`` / ``decay_mult`` vectors that :func:`regularize` applies; each is
    None when all its entries are 1 (the default), so a plain run does no extra arithmetic.
    """

    def __init__(self, model: nn.Module, multipliers: Mapping[str, tuple[float, float]] | None = None) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        ref = params[0]
        self.numel = sum(p.numel() for p in params)
        self.data = torch.zeros(self.numel, dtype=ref.dtype, device=ref.device)
        self.grad = torch.zeros_like(self.data)
        offset = 0
        start = {}
        for p in params:
            n = p.numel()
            start[id(p)] = offset
            self.data[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.data[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self.params = params
        self.layers: list[tuple[int, int]] = []
        seen: set[int] = set()
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in start and id(p) not in seen]
            if own:
                seen.update(id(p) for p in own)
                n = sum(p.numel() for p in own)
                first = start[id(own[0])]
                assert all(start[id(q)] == start[id(p)] + p.numel() for p, q in zip(own, own[1:])), \
                    "a module's parameters are contiguous in model.parameters() order"
                self.layers.append((first, n))
        assert sum(n for _, n in self.layers) == self.numel and \
            all(a + n == b for (a, n), (b, _) in zip(self.layers, self.layers[1:])), "layers tile the flat buffer"
        self.buffers: list[torch.Tensor] = list(model.buffers())
        """Every buffer of the model (floating or not: BatchReNorm's step counter), in ``model.buffers()`` order."""
        self.float_buffers = [b for b in self.buffers if b.is_floating_point()]
        self.views: list[torch.Tensor] = [p.data for p in params]
        """Each parameter's view into ``data``, in ``params`` order."""
        self.lr_mult: torch.Tensor | None = None
        self.decay_mult: torch.Tensor | None = None
        if multipliers:
            named = dict(model.named_parameters())
            unknown = sorted(set(multipliers) - {n for n, p in named.items() if id(p) in start})
            if unknown:
                raise ValueError(f"multipliers name no trainable parameter of the model: {', '.join(unknown)}")
            lr, decay = torch.ones_like(self.data), torch.ones_like(self.data)
            for name, (lr_m, decay_m) in multipliers.items():
                first = start[id(named[name])]
                span = slice(first, first + named[name].numel())
                lr[span], decay[span] = float(lr_m), float(decay_m)
            self.lr_mult = None if bool((lr == 1).all()) else lr
            self.decay_mult = None if bool((decay == 1).all()) else decay

    def zero_grad(self) -> None:
        self.grad.zero_()

    def own_copy(self) -> FlatParams:
        """A partition's own weights and buffers: copies of this one's ``data`` and ``buffers``, sharing
        its gradient, parameters, layers and multipliers (geodml.engine.worker binds the model to it).
        ``views`` and ``float_buffers`` are the copy's own."""
        other = FlatParams.__new__(FlatParams)
        other.numel, other.grad, other.params, other.layers = self.numel, self.grad, self.params, self.layers
        other.lr_mult, other.decay_mult = self.lr_mult, self.decay_mult
        other.data = self.data.clone()
        offsets = [0]
        for v in self.views:
            offsets.append(offsets[-1] + v.numel())
        other.views = [other.data[a:b].view_as(v) for v, a, b in zip(self.views, offsets, offsets[1:])]
        other.buffers = [b.clone() for b in self.buffers]
        other.float_buffers = [b for b in other.buffers if b.is_floating_point()]
        return other


def regularize(flat: FlatParams, weight_decay: float) -> None:
    """Caffe's ``Regularize`` and local learning rate on the fresh gradient, in place:
    ``grad += weight_decay * decay_mult * data``, then ``grad *= lr_mult`` (per element; both
    multipliers 1 unless the run trains with ``--param-mults prototxt``).

    Caffe's SGD applies ``v = momentum * v + lr * lr_mult * (grad + weight_decay * decay_mult * w)``;
    every geodml algorithm applies ``lr`` and momentum to the gradient this leaves linearly, so
    scaling the gradient here is the same update (BSP's average of scaled gradients is the scaled
    average; Gaia's significance and DGC's selection and clipping see the multiplied values, as
    the released code's do, which filter Caffe's updates). Terms an algorithm adds later
    (FedProx's proximal pull) are not multiplied.
    """
    if weight_decay:
        if flat.decay_mult is None:
            flat.grad.add_(flat.data, alpha=weight_decay)
        else:
            flat.grad.addcmul_(flat.decay_mult, flat.data, value=weight_decay)
    if flat.lr_mult is not None:
        flat.grad.mul_(flat.lr_mult)


class BatchSource(Protocol):
    """A partition's minibatch order (geodml.trainer.BatchSampler)."""

    indices: np.ndarray
    """All training-set indices of the partition."""

    labels: np.ndarray | None
    """The labels of ``indices`` (same order), or None when the source does not know them (IWDS's
    resampling needs them)."""

    def next(self) -> np.ndarray:
        """The next minibatch's training-set indices (a buffer reused by the next call)."""
        ...


class LocalWork(Protocol):
    """What a partition computes at a step, asked by the trainer before forward/backward."""

    def computes(self, step: int) -> bool:
        """False: no local work at ``step`` (e.g. not selected this round); the trainer skips
        forward/backward, zeroes the gradient and still calls ``algo.step``."""
        ...

    def batch_indices(self, step: int, sampler: BatchSource) -> np.ndarray:
        """Training-set indices of this step's minibatch (``batch_size`` of them)."""
        ...

    def sample_weights(self, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        """Per-sample loss weights w_i, loss = mean(w_i * l_i) over the minibatch; None: the plain
        mean. The tensor may be a buffer reused by the next call."""
        ...


class PlainWork:
    """Every step, the sampler's next minibatch, a plain mean loss (every algorithm but FedAvg's family)."""

    def computes(self, step: int) -> bool:
        return True

    def batch_indices(self, step: int, sampler: BatchSource) -> np.ndarray:
        return sampler.next()

    def sample_weights(self, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        return None


PLAIN_WORK = PlainWork()


class Algorithm:
    """Base class: vanilla momentum SGD with no communication (one isolated partition).

    Subclasses override one or more hooks. Building one from a RunConfig is the registry's
    business (geodml.algorithms.AlgorithmFactory).
    """

    name: ClassVar[str] = "base"
    idle_steps_read_grad: ClassVar[bool] = True
    """Whether the hooks may read ``flat.grad`` at a step this partition does not compute (its
    ``work.computes`` is False), which the trainer then zeroes first. FedAvg's idle participants touch
    nothing (False): at P = 1,000 zeroing the shared gradient for 99,000 idle steps cost 12% of a run."""
    knob: Knob | None = None
    """SkewScout's communication knob (geodml.algorithms.knob.Knob: name, grid, get, set); None: the
    algorithm has none (BSP, local)."""

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext,
                 momentum_buffer: torch.Tensor | None = None) -> None:
        """``momentum_buffer``: the tensor to use as u^k instead of a zeroed one of its own (FedAvg with
        --reset-momentum passes a shared zero buffer that it swaps for a leased one in its rounds)."""
        self.flat = flat
        self.comm = comm
        self.momentum = float(momentum)
        self.ctx = ctx
        self.u = torch.zeros_like(flat.data) if momentum_buffer is None else momentum_buffer  # u^k (scaled by -eta)

    @property
    def work(self) -> LocalWork:
        """What this partition computes each step (default: :class:`PlainWork`)."""
        return PLAIN_WORK

    # ---- hooks -----------------------------------------------------------------------
    def step(self, step: int, lr: float) -> None:
        """One training step after backward: the three hooks in order."""
        self.before_step(step, lr)
        self.local_update(step, lr)
        self.after_step(step, lr)

    def before_step(self, step: int, lr: float) -> None:
        """Gradient exchange on ``flat.grad`` (default: none)."""

    def local_update(self, step: int, lr: float) -> None:
        """u <- m*u - lr*grad; w <- w + u (Appendix A, vanilla momentum SGD)."""
        self.u.mul_(self.momentum).add_(self.flat.grad, alpha=-lr)
        self.flat.data.add_(self.u)

    def after_step(self, step: int, lr: float) -> None:
        """Parameter/update exchange (default: none)."""

    def end_after(self, step: int) -> None:
        """The run ends after ``step``, before its planned length (``--divergence-loss``): called
        before that step's hooks, so that this step is the last one as in a run of ``step + 1``
        steps (FedAvg then begins no further round)."""
        self.ctx = dataclasses.replace(self.ctx, total_steps=step + 1)

    def finish(self) -> None:
        """Called once after the last step (e.g. FedAvg's final averaging)."""

    # ---- what the trainer reads --------------------------------------------------------
    @property
    def l2_in_gradient(self) -> bool:
        """Whether the trainer adds ``--weight-decay`` to the gradient as L2 before the hooks (Caffe's
        Regularize: every algorithm of Quagmire Appendix A). False: the algorithm decays the weights
        itself (DiLoCo's inner AdamW: decoupled, Loshchilov & Hutter 2019)."""
        return True

    @property
    def models_agree(self) -> bool:
        """True when every partition holds the same weights (the local model IS the global one)."""
        return True

    @property
    def partitions_hold_global_models(self) -> bool:
        """True when at the end of a run every partition holds a copy of the global model of some round
        (so scoring each partition's own model adds nothing the global model's score does not say:
        ``--partition-scores auto`` skips it). Default: ``models_agree`` on a model without float
        buffers (BatchNorm's running statistics are each partition's own under BSP and DGC)."""
        return self.models_agree and not self.flat.float_buffers

    @property
    def global_model_rank(self) -> int | None:
        """When ``models_agree`` is False: a rank whose weights ARE the global model (FedAvg with
        client sampling, at a round boundary), or None to average all partitions' weights."""
        return None

    def stats(self) -> dict[str, float]:
        """Per-step statistics for metrics.jsonl (numbers only)."""
        return {}

    # ---- checkpoint --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u.copy_(state["u"])
