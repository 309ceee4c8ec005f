"""Gaia: significance-filtered update exchange (Hsieh et al., NSDI 2017), exactly as
Algorithm 1 of Quagmire (Hsieh et al., ICML 2020) Appendix A, on node k:

    u <- m*u - lr_t * grad f(w^k, b)          (lines 5-6: local vanilla momentum SGD)
    w^k <- w^k + u
    v^k <- v^k + u                            (line 7: accumulate weight updates)
    S = |v^k| > T_t * |w^k|                   (line 9; written without division, so w = 0 is fine)
    send v~^k = v^k * S to every other partition; v^k <- v^k * not S    (lines 10-11)
    w^k <- w^k + sum_{i != k} v~^i            (lines 13-15: apply significant updates of all others)

The significance check uses w^k after its own update and before the others' updates arrive.
``update_threshold`` (line 16, "decrease the threshold whenever the learning rate decreases")
is ``T_t = T0 * lr_t / lr_0``: the threshold follows the learning-rate schedule exactly
(step schedule: T0 / 10 after each milestone; poly: continuously).

Wire format per step and peer, through the ZeroMQ transport as kind ``update``: sparse
(int32 indices + float32 values, 8 B per significant entry) or, when more than half of the
entries are significant, dense (float32 values, 4 B per parameter), whichever is smaller; the
ledger charges exactly what is sent. Each partition sends the same message to all K-1 others.
Partitions keep different models: the global model is the average of their weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml import kernels
from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams, copy_array_into
from geodml.algorithms.knob import KnobSpec

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig


class Gaia(Algorithm):
    name = "gaia"
    KNOB = KnobSpec("t0", (0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50))
    """SkewScout's grid for Gaia (Quagmire §7 / Appendix H), most communication (smallest T0) first."""

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext, t0: float,
                 lr0: float) -> None:
        super().__init__(flat=flat, comm=comm, momentum=momentum, ctx=ctx)
        self.t0 = float(t0)
        self.knob = self.KNOB.bind(get=lambda: self.t0, set=self._set_t0)
        self.lr0 = float(lr0)
        self.threshold = self.t0
        n = flat.numel
        dev = flat.data.device
        self.v = torch.zeros_like(flat.data)              # accumulated, not yet significant updates (own state)
        # Preallocated hot-path buffers (docs/design.md rule 12), on the model's device: scratch that the
        # partitions of a process share (geodml.algorithms.shared): each is used within one turn
        # (select -> send, which copies; receive -> add), never across a wait.
        sc = ctx.shared.scratch
        self.abs_v = sc("gaia.abs_v", n, flat.data.dtype, dev)
        self.bound = sc("gaia.bound", n, flat.data.dtype, dev)          # T_t * |w|
        self.mask = sc("gaia.mask", n, torch.bool, dev)
        self.idx64 = sc("gaia.idx64", n, torch.int64, dev)    # storage kept across resize_ (no realloc)
        self.idx32 = sc("gaia.idx32", n, torch.int32, dev)
        self.vals = sc("gaia.vals", n, torch.float32, dev)
        self.recv_idx = sc("gaia.recv_idx", n, torch.int64, dev)
        self.recv_vals = sc("gaia.recv_vals", n, torch.float32, dev)
        self.recv_idx32 = sc("gaia.recv_idx32", n, torch.int32, dev)
        # On CPU the selection runs on NumPy views of these buffers: np.flatnonzero is 3-60x
        # faster than torch.nonzero on one thread (60x at 50% significant; docs/performance.md).
        self._np: tuple[np.ndarray, ...] | None = None
        self.fused = kernels.compiled is not None and dev.type == "cpu"
        """Select with the fused C loop (geodml/_kernels.c); False: NumPy (same bits; benchmarks toggle it)."""
        if dev.type == "cpu":
            self._np = tuple(t.numpy() for t in (self.v, self.flat.data, self.abs_v, self.bound, self.mask,
                                                 self.vals, self.idx32))
        # statistics
        self.sent_entries = 0
        self.sent_dense = False
        self.sent_entries_total = 0
        self.steps_done = 0

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Gaia:
        if flat.data.dtype != torch.float32:
            raise ValueError("gaia exchanges float32 updates; the model must be float32")
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx, t0=cfg.gaia.t0, lr0=cfg.optim.lr)

    # ---- knob ----------------------------------------------------------------------------
    def _set_t0(self, value: float) -> None:
        """The knob's set: T0 from the next step's threshold on."""
        if value is None or not (value >= 0):
            raise ValueError(f"gaia: T0 must be >= 0, got {value!r}")
        self.t0 = float(value)

    @property
    def models_agree(self) -> bool:
        return self.ctx.world_size == 1

    # ---- Algorithm 1 -----------------------------------------------------------------------
    def local_update(self, step: int, lr: float) -> None:
        super().local_update(step, lr)      # u = m*u - lr*grad; w = w + u
        self.v.add_(self.u)                 # line 7

    def select(self, threshold: float) -> tuple[int, bool]:
        """Lines 9-11: mark |v| > T*|w|, move the significant entries into the send buffers
        and clear them from v. Returns (number of significant entries, dense?)."""
        if self._np is not None:
            if self.fused:
                return self._select_fused(threshold)
            return self._select_numpy(threshold)
        torch.abs(self.v, out=self.abs_v)
        torch.abs(self.flat.data, out=self.bound)
        self.bound.mul_(threshold)
        torch.gt(self.abs_v, self.bound, out=self.mask)
        # nonzero into a preallocated buffer (resize_ within capacity never reallocates);
        # clearing by index costs O(significant) instead of another full pass.
        torch.nonzero(self.mask, out=self.idx64.resize_(0, 1))
        idx = self.idx64.view(-1)
        n = idx.numel()
        dense = 2 * n > self.flat.numel  # 8 B per sparse entry vs 4 B per dense parameter
        if dense:  # vals back to full length within its capacity (no reallocation, no resize warning)
            torch.mul(self.v, self.mask, out=self.vals.resize_(self.flat.numel))
        elif n:
            torch.index_select(self.v, 0, idx, out=self.vals.resize_(n))
            self.idx32.resize_(n).copy_(idx)
        if n:
            self.v.index_fill_(0, idx, 0.0)
        return n, dense

    CHUNK = 65536
    """Elements per block of the NumPy selection: 256 KiB per float32 scratch, so the passes over
    one block stay in L2 and v and w stream from memory once (2.6 -> 0.8 ms at 1M, 77 -> 15 ms
    at 10M on this machine; docs/performance.md)."""

    def _select_fused(self, threshold: float) -> tuple[int, bool]:
        """``select`` in one C loop over v and w (geodml/_kernels.c): the NumPy path's float32
        operations and results, bit for bit, without its six passes and its branchy flatnonzero."""
        assert self._np is not None, "the fused selection runs on CPU buffers only"
        v, w, _, _, _, vals, idx32 = self._np
        n, dense = kernels.compiled.gaia_select(v, w, threshold, vals, idx32)
        if not dense and n:
            self.vals.resize_(n)                   # within capacity: same storage, no allocation
            self.idx32.resize_(n)
        return n, dense

    def _select_numpy(self, threshold: float) -> tuple[int, bool]:
        """``select`` on NumPy views (CPU), block by block: the same float32 operations, so the
        same result. Counting first lets the dense case skip the index list entirely."""
        assert self._np is not None, "the NumPy selection runs on CPU buffers only"
        v, w, abs_v, bound, mask, vals, idx32 = self._np
        numel, c = self.flat.numel, self.CHUNK
        n = 0
        for s in range(0, numel, c):
            e = min(numel, s + c)
            a, b, m = abs_v[:e - s], bound[:e - s], mask[s:e]   # abs_v/bound: block scratch
            np.abs(w[s:e], out=b)
            np.multiply(b, threshold, out=b)       # float32 T*|w|, as torch computes it
            np.abs(v[s:e], out=a)
            np.greater(a, b, out=m)
            n += int(np.count_nonzero(m))
        dense = 2 * n > numel  # 8 B per sparse entry vs 4 B per dense parameter
        if dense:
            for s in range(0, numel, c):
                e = min(numel, s + c)
                np.multiply(v[s:e], mask[s:e], out=vals[s:e])
                np.subtract(v[s:e], vals[s:e], out=v[s:e])  # v - v = +0 exactly; 5x faster than where=mask
        elif n:
            pos = 0
            for s in range(0, numel, c):
                e = min(numel, s + c)
                idx = np.flatnonzero(mask[s:e])    # allocates O(significant in the block)
                q = pos + len(idx)
                if q > pos:
                    vb = v[s:e]
                    np.take(vb, idx, out=vals[pos:q])
                    np.add(idx, s, out=idx32[pos:q], casting="unsafe")  # < numel < 2**31
                    vb[idx] = 0.0
                    pos = q
            assert pos == n
            self.vals.resize_(n)                   # within capacity: same storage, no allocation
            self.idx32.resize_(n)
        return n, dense

    def after_step(self, step: int, lr: float) -> None:
        self.send_significant(step, lr)
        if self.ctx.world_size > 1:
            self.apply_received(self.flat.data, self.comm.recv_from_all("update", step=step))
        self.restore_buffers()

    def send_significant(self, step: int, lr: float) -> None:
        """Lines 9-11 and the send of line 10: the threshold of this step, the selection, and the
        significant updates to every other partition (nothing to send with one partition). The
        send buffers hold the message until ``restore_buffers``."""
        self.threshold = self.t0 * lr / self.lr0   # update_threshold: follows the lr schedule
        n, dense = self.select(self.threshold)
        self.sent_entries, self.sent_dense = n, dense
        self.sent_entries_total += n
        self.steps_done += 1
        if self.ctx.world_size == 1:
            return
        payload: list[torch.Tensor] | list[np.ndarray]
        if not (dense or n):
            payload = []  # nothing significant: an empty message (envelope only) keeps peers in step
        elif self._np is not None:  # on the CPU, NumPy views of the same buffers: no tensor conversions per send
            *_, vals_np, idx_np = self._np
            payload = [vals_np] if dense else [idx_np[:n], vals_np[:n]]
        else:
            payload = [self.vals] if dense else [self.idx32, self.vals]
        self.comm.send_to_all("update", payload, step=step)

    def apply_received(self, w: torch.Tensor, received: dict[int, list[np.ndarray]]) -> None:
        """Lines 13-15: add every other partition's significant updates to ``w``, in rank order
        (the same sum order on every run), dense or sparse as each was sent."""
        for src in sorted(received):
            self.add_update(w, received[src])

    def add_update(self, w: torch.Tensor, arrays: list[np.ndarray]) -> None:
        """Add one received update (as sent: dense float32 values, int32 indices and float32
        values, or nothing) to the model ``w`` ``[n]``."""
        n = w.shape[-1]
        if len(arrays) == 1:                      # dense
            copy_array_into(self.recv_vals.resize_(n), arrays[0])
            w.add_(self.recv_vals)
        elif len(arrays) == 2:                    # sparse
            m = len(arrays[0])
            copy_array_into(self.recv_idx32.resize_(m), arrays[0])
            self.recv_idx.resize_(m).copy_(self.recv_idx32)
            copy_array_into(self.recv_vals.resize_(m), arrays[1])
            w.index_add_(0, self.recv_idx, self.recv_vals)

    def restore_buffers(self) -> None:
        """The send and receive buffers back to full length after a step (``resize_`` within their
        capacity keeps the same storage: no allocation)."""
        n = self.flat.numel
        self.vals.resize_(n)
        self.recv_vals.resize_(n)

    def stats(self) -> dict[str, float]:
        return {"gaia_threshold": self.threshold, "gaia_t0": self.t0,
                "gaia_significant_fraction": self.sent_entries / self.flat.numel,
                "gaia_sent_entries_total": float(self.sent_entries_total)}

    # ---- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.clone(), "v": self.v.clone(), "t0": self.t0, "threshold": self.threshold,
                "sent_entries_total": self.sent_entries_total, "steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u.copy_(state["u"])
        self.v.copy_(state["v"])
        self.t0 = float(state["t0"])
        self.threshold = float(state["threshold"])
        self.sent_entries_total = int(state["sent_entries_total"])
        self.steps_done = int(state["steps_done"])
