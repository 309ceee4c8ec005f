"""DeepGradientCompression (Lin et al., ICLR 2018) as written in Quagmire Appendix A, Algorithm 3.

Hsieh et al., "The Non-IID Data Quagmire of Decentralized Machine Learning" (ICML 2020),
Algorithm 3 on node k, one minibatch step t (line numbers of the paper's pseudocode):

* 4  ``g = -lr * grad``                     (grad includes the L2 weight-decay term)
* 5  ``g = gradient_clipping(g)``           (local clipping, see ``clip_norm`` below)
* 6  ``u = m * u + g``                      (momentum correction: momentum is accumulated locally)
* 7  ``v = v + u``                          (accumulate weight updates)
* 8  ``T = the top-s% magnitude of v``      (see "threshold selection" below)
* 9-13 ``S = |v| >= T``; ``v~ = v * S``; ``v = v * !S``; ``u = u * !S``
  (send the top entries, clear them from the accumulator, and clear their momentum history:
  momentum factor masking)
* 14-15 every partition applies ``w = w + sum_k v~_k`` (the SUM, not the mean).

**The sum and the learning rate.** ``lr`` is the trainer's current learning rate and ``grad``
the mean gradient of this partition's minibatch of B samples, so ``lr`` is a *per-partition*
learning rate: each partition's selected update is applied in full, as if that partition had
trained alone, the same convention as Gaia's Algorithm 1 (each partition applies every other
partition's significant update unscaled). In the dense limit (s = 0: everything is sent and u is
cleared every step) one step is ``w -= lr * sum_k grad_k = K * lr * mean_grad``, i.e. K times a
BSP step at the same ``--lr`` (BSP averages the gradients). The DGC paper instead folds 1/K into
every node's gradient so that its sum is the mean; a user who wants DGC's global step size at a
BSP learning rate ``lr_bsp`` runs DGC with ``--lr lr_bsp/K``. We follow the Quagmire pseudocode.
It matters: digits, the CNN (--model cnn), K=5, 30 epochs, ``--e-warm 1``: at ``--lr 0.02`` IID reaches 96.9%
(BSP 97.5%) but 100% non-IID diverges to 10% once s reaches 99.9%; at ``--lr 0.004`` (0.02/K)
non-IID reaches 96.9%.

**Sparsity warm-up** (Quagmire §3, from Lin et al.'s "warm-up training"): s = 75%, 93.75%,
98.4375%, 99.6% (the exponential schedule 1 - 4^-i; the fourth stage is 1 - 4^-4 = 99.609375%),
each stage lasting ``e_warm`` epochs, then the final sparsity (``--sparsity``, default 99.9%)
for the rest of the run. A stage above the final sparsity is capped at it (``--sparsity 0`` is
dense throughout); ``e_warm = 0`` starts at the final sparsity. Epochs are
``step / steps_per_epoch``: stage i covers steps ``[i * e_warm * spe, (i+1) * e_warm * spe)``.
SkewScout's knob is ``e_warm`` (``knob``); changing it mid-run re-evaluates the stage from the
current step, so a longer warm-up can move a run back to a denser stage.

**Local gradient clipping** (Lin et al.'s "local gradient clipping"): each partition clips its
own gradient before it enters the accumulation, with the threshold scaled by K^-1/2 (a
partition's share of the summed gradient's norm if all partitions' gradients were alike): the
local gradient is rescaled so that ``||grad||_2 <= clip_norm / sqrt(K)``, where ``clip_norm``
(``--clip-norm``) is the threshold one would use for the global gradient. Clipping ``grad`` or
``g = -lr * grad`` (line 5) is the same thing at threshold ``lr * clip_norm / sqrt(K)``.
Default ``None``: no clipping. A norm threshold is model-specific and neither paper states one
for the CNNs studied here, so clipping is opt-in; when on, it behaves as DGC describes.

**Selection scope** (``--dgc-scope``). ``global`` (the default, as the Quagmire pseudocode's
line 8 reads): one top-s% over the whole flattened model. ``layer``: Lin et al. select per
layer (their §3 and released compressor): every layer -- the parameters one module owns, a
conv's weight with its bias (``FlatParams.layers``) -- sends its own top
k_l = ceil((1 - s) * N_l) entries, at least one, so small layers always send something and a
layer with large updates cannot crowd out the others. The Quagmire authors' parameter server
(kevinhsieh/non_iid_dml, ``src/server/tablet-server.cpp``, ``send_dgc_mirror_updates``) selects
per table instead: a table holds up to ``layers_per_table=5`` layers with parameters (all four of
LeNet's in one), and each tablet server selects over its share of the table, with
k = max(1, floor((1 - s) N)). On one layer both scopes are the same selection (tested).

**Where clipping happens** (``--dgc-clip-at``). ``gradient`` (default): the local gradient is
clipped before momentum at ``clip_norm / sqrt(K)`` (Lin et al., below). ``update``: as the
released parameter server does, the momentum-corrected update u (line 6) is clipped at
``clip_norm`` itself and the clipped u is kept as the momentum buffer (its
``gradient_clip_threshold``, applied to ``update_history`` before the accumulation; the
released LeNet configurations leave it at 0, i.e. off).

**Threshold selection** (Lin et al.'s sampled top-k, geodml.algorithms.topk.TopSelector): the
threshold is estimated on a 0.1-1% sample of |v| and computed exactly among the candidates when
far too many pass, so every partition sends between k = ceil((1 - s) * N) and 1.3 k entries every
step (exactly k when refined or exact); ``dgc_threshold_*`` counters in ``stats()`` say how often
each path ran.

**Exchange.** Each partition sends its selected v~_k to every other partition over the ZeroMQ
peer transport (``comm.send_to_all`` / ``comm.recv_from_all``), charged as kind ``gradient`` on
each of its K-1 links: as (int32 index, float32 value) pairs, 8 B per selected entry, or, when
more than half of the entries are selected (s < 50%: only ``--sparsity`` below 0.5), as the dense
float32 vector, 4 B per parameter; plus the transport's small envelope. The ledger charges
exactly that. Every partition adds the K blocks in rank order 0..K-1 (its own from the very
buffers it sent), so all partitions do bit-identical float operations: one global model.

Chosen over a torch.distributed all_gather of fixed-size blocks by measurement
(``python -m geodml.bench dgc --exchange 5``, 5 ranks on this 2-core machine, per exchange:
1.5 KiB blocks 1.3 ms vs 4.8 ms, 92 KiB 2.4 vs 3.5 ms, 369 KiB 3.3 vs 7.0 ms) and because
all_gather needs equal-size blocks: padding to the 1.3 k bound would charge bytes that carry
nothing. Either way each block leaves its partition K-1 times, so the bytes tie. Not chosen: a
ring all-reduce of the dense v~, fewer bytes in total once k >= N/K (K=5: the 75% stage, where
the sparse exchange costs K/4 = 1.25 times BSP's bytes), but every link then carries
2(K-1)/K * 4N bytes in 2(K-1) sequential latency-bound steps instead of 8k bytes in parallel,
i.e. more WAN time, and "entries sent" would no longer be what the ledger charges.

**Appendix G diagnostic.** ``stats()`` reports the average residual update delta
``mean_j |v_j / w_j|`` (over entries with w_j != 0; Quagmire's ``||Delta w_i / w_i||``, 27% IID vs
283% non-IID for ResNet-20) and the robust companion ``||v||_2 / ||w||_2``, both measured on
this partition after a step (v: what is still unsent) and averaged over the measured steps of
the current epoch (and of the last completed epoch). To keep it off the hot path (it reads v
and w in full, ~1.2 ms at 0.9M parameters), it is measured every ``stride = ceil(N / 65,536)``
steps and on the first step of every epoch: every step for N <= 65,536, every 3rd for digits
CNN, every 14th for the CIFAR CNN (~35 samples per epoch of 500 steps), ~0.1 ms per step
amortized.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams, copy_array_into
from geodml.algorithms.knob import KnobSpec
from geodml.algorithms.topk import TopSelector
from geodml.config import DGC_CLIP_AT, DGC_SCOPES

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig

WARMUP_SPARSITIES: tuple[float, ...] = (0.75, 0.9375, 0.984375, 0.99609375)
"""Lin et al.'s exponential warm-up 1 - 4^-i, i = 1..4 (75%, 93.75%, 98.4375%, 99.6%)."""


def warmup_sparsity(step: int, steps_per_epoch: int, e_warm: float, final: float) -> float:
    """Sparsity s at ``step``: stage floor(step / (e_warm * spe)) of WARMUP_SPARSITIES, then ``final``.

    A stage is capped at ``final``; ``e_warm == 0`` means no warm-up (``final`` from step 0).
    """
    if e_warm <= 0:
        return final
    stage = math.floor(step / (e_warm * steps_per_epoch) + 1e-9)  # 1e-9: float-exact stage edges
    if stage < len(WARMUP_SPARSITIES):
        return min(WARMUP_SPARSITIES[stage], final)
    return final


class DGC(Algorithm):
    """DeepGradientCompression, Quagmire Algorithm 3 (module docstring has the details)."""

    name = "dgc"
    KNOB = KnobSpec("e_warm", (8.0, 4.0, 3.0, 2.0, 1.0))
    """Quagmire Table 8's E_warm grid, most communication (longest warm-up) first."""
    KIND = "gradient"
    DIAG_ELEMENTS = 65536
    """The Appendix G diagnostic costs about a pass over this many entries per step, amortized."""

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext, sparsity: float = 0.999,
                 e_warm: float = 4.0, clip_norm: float | None = None, sample_ratio: float = 0.01,
                 selection_backend: str = "auto", scope: str = "global", clip_at: str = "gradient") -> None:
        super().__init__(flat=flat, comm=comm, momentum=momentum, ctx=ctx)
        # sparsity, clip_norm and sample_ratio are validated by geodml.config.DGCConfig (the one validator)
        if flat.data.dtype != torch.float32:
            raise ValueError(f"DGC sends float32 values; the model's parameters are {flat.data.dtype}")
        # hyper-parameters
        self.final_sparsity = float(sparsity)
        self.e_warm = float(e_warm)
        self.knob = self.KNOB.bind(get=lambda: self.e_warm, set=self._set_e_warm)
        assert scope in DGC_SCOPES and clip_at in DGC_CLIP_AT, "validated by geodml.config.DGCConfig"
        self.scope, self.clip_at = scope, clip_at
        self.clip_norm = clip_norm
        self.local_clip = None if clip_norm is None or clip_at != "gradient" else clip_norm / math.sqrt(ctx.world_size)
        self.update_clip = clip_norm if clip_at == "update" else None
        self.sample_ratio = float(sample_ratio)
        # internal state (self.u, the momentum buffer, comes from the base class)
        n = flat.numel
        self.v = torch.zeros_like(flat.data)
        self.gen = self.generator(ctx.seed, ctx.rank, flat.data.device)
        stages = tuple(min(s, self.final_sparsity) for s in WARMUP_SPARSITIES) + (self.final_sparsity,)
        self.selector = TopSelector(n, sample_ratio=sample_ratio, sparsities=stages, generator=self.gen,
                                    device=flat.data.device, backend=selection_backend, shared=ctx.shared)
        # per-layer scope: one selector per layer, their indices gathered into one preallocated buffer
        self.layers = list(flat.layers) if scope == "layer" else []
        self.layer_selectors = [TopSelector(m, sample_ratio=sample_ratio, sparsities=stages, generator=self.gen,
                                            device=flat.data.device, backend=selection_backend, shared=ctx.shared)
                                for _, m in self.layers]
        # the block this partition sent, kept until lines 14-15 add it in rank order after the others'
        # arrive (own state across that wait); the rest is scratch shared by a process's partitions
        # (geodml.algorithms.shared), each used within one turn
        dev, sc = flat.data.device, ctx.shared.scratch
        self.send_idx = torch.empty(n, dtype=torch.int32, device=dev)
        self.send_val = torch.empty(n, dtype=torch.float32, device=dev)
        self._layer_idx = sc("dgc.layer_idx", n if self.layers else 0, torch.int64, dev)
        self.recv_idx = sc("dgc.recv_idx", n, torch.int32, dev)
        self.recv_val = sc("dgc.recv_val", n, torch.float32, dev)
        self._diag_stride = max(1, math.ceil(n / self.DIAG_ELEMENTS))
        self._scratch = sc("dgc.residual", n, flat.data.dtype, dev)
        self._sent = 0
        self._dense = False
        self._sent_idx: torch.Tensor | None = None
        # statistics
        self.sparsity = self.final_sparsity
        self.last_sent = 0
        self.total_sent = 0
        self.paths: dict[str, int] = {"dense": 0, "exact": 0, "sampled": 0, "refined": 0, "fallback": 0}
        self._epoch = 0
        self._acc = [0.0, 0.0, 0]  # this epoch's sums of residual delta, norm ratio, steps
        self._last_epoch: tuple[float, float] | None = None

    @staticmethod
    def generator(seed: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
        """Partition ``rank``'s generator of the sampled threshold (seeded from the run's seed and the rank)."""
        gen = torch.Generator(device=device)
        gen.manual_seed(int(np.random.SeedSequence([seed, rank, 0xD6C]).generate_state(1)[0]))
        return gen

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> DGC:
        a = cfg.dgc
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx, sparsity=a.sparsity,
                   e_warm=a.e_warm, clip_norm=a.clip_norm, sample_ratio=a.dgc_sample_ratio, scope=a.dgc_scope,
                   clip_at=a.dgc_clip_at)

    # ---- SkewScout's knob -----------------------------------------------------------------
    def _set_e_warm(self, value: float) -> None:
        """The knob's set: E_warm from now on (the stage is re-evaluated from the current step)."""
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        if not ok:
            raise ValueError(f"--e-warm must be >= 0 epochs, got {value!r}")
        self.e_warm = float(value)

    def sparsity_at(self, step: int) -> float:
        return warmup_sparsity(step, self.ctx.steps_per_epoch, self.e_warm, self.final_sparsity)

    # ---- Algorithm 3 -------------------------------------------------------------------------
    def before_step(self, step: int, lr: float) -> None:
        """Lines 4-13: clip, momentum correction, accumulate, select, send, clear."""
        grad, u, v = self.flat.grad, self.u, self.v
        scale = -lr
        if self.local_clip is not None:
            norm = float(torch.linalg.vector_norm(grad))
            if norm > self.local_clip:
                scale *= self.local_clip / norm
        u.mul_(self.momentum).add_(grad, alpha=scale)  # lines 4-6
        if self.update_clip is not None:  # the released server: clip u itself, after momentum
            norm = float(torch.linalg.vector_norm(u))
            if norm > self.update_clip:
                u.mul_(self.update_clip / norm)
        v.add_(u)  # line 7
        self.sparsity = self.sparsity_at(step)
        idx = self._select(v, self.sparsity)  # lines 8-10
        c, n = int(idx.numel()), self.flat.numel
        self._dense = 2 * c > n  # 4 B per parameter beats 8 B per selected entry
        if self._dense:  # v~ = v * S in full, zeros where not selected
            if c == n:
                self.send_val.copy_(v)
            else:
                self.send_val.zero_()
                torch.index_select(v, 0, idx, out=self.recv_val[:c])
                self.send_val.index_copy_(0, idx, self.recv_val[:c])
            message = [self.send_val]
        else:  # line 11: (int32 index, float32 value) pairs
            torch.index_select(v, 0, idx, out=self.send_val[:c])
            self.send_idx[:c].copy_(idx)
            message = [self.send_idx[:c], self.send_val[:c]]
        if self.ctx.world_size > 1:
            self.comm.send_to_all(self.KIND, message, step=step)  # returns once the buffers are free
        if c == n:  # lines 12-13
            v.zero_()
            u.zero_()
        else:
            v.index_fill_(0, idx, 0.0)
            u.index_fill_(0, idx, 0.0)
        # the own block's indices for lines 14-15 (the selection's buffer is scratch: geodml.algorithms.shared)
        self._sent_idx, self._sent = (None if self._dense else self.send_idx[:c]), c
        self.last_sent = c
        self.total_sent += c

    def _select(self, v: torch.Tensor, sparsity: float) -> torch.Tensor:
        """Indices to send: the top entries of all of v (global scope) or of each layer (layer scope)."""
        if not self.layers:
            idx = self.selector.select(v, sparsity)
            self.paths[self.selector.path] += 1
            return idx
        c = 0
        for (offset, m), selector in zip(self.layers, self.layer_selectors):
            sel = selector.select(v[offset:offset + m], sparsity)
            self.paths[selector.path] += 1
            torch.add(sel, offset, out=self._layer_idx[c:c + sel.numel()])
            c += sel.numel()
        return self._layer_idx[:c]

    def local_update(self, step: int, lr: float) -> None:
        """Lines 14-15: w += sum over partitions k = 0..K-1, in rank order, of their selected v~_k.

        The same additions in the same order on every partition (this rank's own block from the
        very buffers it sent), so all partitions compute bit-identical weights.
        """
        received = self.comm.recv_from_all(self.KIND, step=step) if self.ctx.world_size > 1 else {}
        self.apply_blocks(step, received, own=self.ctx.rank)
        self.record_residual(step)

    def apply_blocks(self, step: int, received: dict[int, list[np.ndarray]], *, own: int | None) -> None:
        """``w += v~_r`` for r = 0..K-1 in rank order: rank ``own``'s block from this object's send
        buffers (its last ``before_step``), every other rank's from ``received`` (as sent: dense
        float32, or int32 indices and float32 values). The sent indices are spent afterwards, so
        a sparse own block cannot be added twice (each ``before_step`` is followed by one apply)."""
        w, c = self.flat.data, self._sent
        for r in range(self.ctx.world_size):
            if r == own:
                if self._dense:
                    w.add_(self.send_val)
                else:
                    assert self._sent_idx is not None, "local_update runs after before_step selected"
                    w.index_add_(0, self._sent_idx, self.send_val[:c])  # int32 indices: the same additions
                continue
            arrays = received[r]
            if len(arrays) == 1 and np.asarray(arrays[0]).size == w.numel():  # dense
                copy_array_into(self.recv_val, arrays[0])
                w.add_(self.recv_val)
                continue
            m = int(np.asarray(arrays[0]).size)
            if len(arrays) != 2 or m != np.asarray(arrays[1]).size or m > w.numel():
                raise RuntimeError(f"dgc: malformed block from rank {r} at step {step}")
            copy_array_into(self.recv_idx[:m], arrays[0])
            copy_array_into(self.recv_val[:m], arrays[1])
            w.index_add_(0, self.recv_idx[:m], self.recv_val[:m])
        self._sent_idx = None

    # ---- Appendix G ------------------------------------------------------------------------------
    def record_residual(self, step: int) -> None:
        epoch = step // self.ctx.steps_per_epoch
        if epoch != self._epoch:
            if self._acc[2]:
                self._last_epoch = (self._acc[0] / self._acc[2], self._acc[1] / self._acc[2])
            self._epoch, self._acc = epoch, [0.0, 0.0, 0]
        if step % self._diag_stride and step % self.ctx.steps_per_epoch:
            return  # measured every `stride` steps and on each epoch's first step
        v, w, s = self.v, self.flat.data, self._scratch
        torch.div(v, w, out=s)
        total = float(s.abs_().sum())
        if math.isfinite(total):  # no w_j == 0
            delta = total / w.numel()
        else:  # exclude w_j == 0 (0/0 -> nan, x/0 -> inf)
            s.nan_to_num_(nan=0.0, posinf=0.0)
            delta = float(s.sum()) / max(int(torch.count_nonzero(w)), 1)
        wn = float(torch.linalg.vector_norm(w))
        ratio = float(torch.linalg.vector_norm(v)) / wn if wn > 0 else 0.0
        self._acc[0] += delta
        self._acc[1] += ratio
        self._acc[2] += 1

    # ---- what the trainer reads ----------------------------------------------------------------
    @property
    def models_agree(self) -> bool:
        return True

    def stats(self) -> dict[str, float]:
        n_steps = self._acc[2]
        out = {
            "dgc_sparsity": self.sparsity,
            "dgc_e_warm": self.e_warm,
            "dgc_sent_entries": float(self.last_sent),
            "dgc_sent_fraction": self.last_sent / self.flat.numel,
            "dgc_dense_wire": 1.0 if self._dense else 0.0,
            "dgc_residual_delta": self._acc[0] / n_steps if n_steps else 0.0,
            "dgc_residual_norm_ratio": self._acc[1] / n_steps if n_steps else 0.0,
            "dgc_threshold_fallbacks": float(self.paths["fallback"]),
            "dgc_threshold_refines": float(self.paths["refined"]),
        }
        if self._last_epoch is not None:
            out["dgc_residual_delta_last_epoch"], out["dgc_residual_norm_ratio_last_epoch"] = self._last_epoch
        return out

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.clone(), "v": self.v.clone(), "e_warm": self.e_warm, "rng": self.gen.get_state(),
                "total_sent": self.total_sent, "paths": dict(self.paths), "epoch": self._epoch,
                "acc": list(self._acc), "last_epoch": self._last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u.copy_(state["u"])
        self.v.copy_(state["v"])
        self.e_warm = float(state["e_warm"])
        self.gen.set_state(state["rng"])
        self.total_sent = int(state["total_sent"])
        self.paths.update(state["paths"])
        self._epoch, self._acc, self._last_epoch = state["epoch"], list(state["acc"]), state["last_epoch"]

