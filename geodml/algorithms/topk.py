"""Top-k selection for DeepGradientCompression (geodml.algorithms.dgc; Lin et al., ICLR 2018).

Lin et al.'s sampled top-k (estimate the threshold on a 0.1-1% sample, compute it precisely
among the selected when far too many pass), per step on |v| of N entries at sparsity s, target
k = ceil((1 - s) * N):

1. Draw ``n_s = max(ratio * N, 64 / (1 - s))`` sample indices uniformly (with replacement) from
   a ``torch.Generator`` seeded from (seed, rank); take the sample's order statistic a margin of
   two standard deviations *below* the top-(1-s) quantile, so that the candidates
   ``C = {j : |v_j| >= T}`` contain the exact top-k with high probability.
2. If k <= |C| <= 1.3 k: send C (it is a superset of the exact top-k, as in DGC).
3. If |C| > 1.3 k: refine: the exact top-k among the candidates only (cheap: |C| << N).
4. If |C| < k (the sample missed badly): fall back to the exact top-k of all N entries.
5. If the sample would be at least N / 4 (small models, very high sparsity), sampling does not
   pay and the exact top-k is taken directly.

So DGC sends between k and 1.3 k entries every step (exactly k when refined or exact); ``path``
says which branch ran (DGC counts them as ``dgc_threshold_*`` in its ``stats()``). On CPU the
kernels run on NumPy views of the preallocated torch buffers (in-place ``ndarray.partition`` and
``np.flatnonzero`` are 3-10x faster than ``torch.topk`` / ``torch.nonzero`` on this machine's one
thread; ``python -m geodml.bench dgc``); other devices use the same algorithm in torch ops.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from geodml import kernels
from geodml.algorithms.shared import ProcessShared


def target_count(sparsity: float, numel: int) -> int:
    """k = ceil((1 - s) * N), at least 1 (the 1e-6 keeps (1-0.999)*1000 from rounding up to 2)."""
    return max(1, min(numel, math.ceil((1.0 - sparsity) * numel - 1e-6)))


class TopSelector:
    """Selects (a superset of) the k largest-magnitude entries of a flat tensor; preallocated.

    ``select(values, sparsity)`` returns an int64 index tensor of between k = ceil((1-s) N) and
    ``UPPER * k`` distinct entries that contains the exact top-k of |values| (module docstring);
    it may be a view of an internal buffer, valid until the next call.
    ``path`` says which branch ran: "dense", "exact", "sampled", "refined" or "fallback".
    """

    MIN_SAMPLE_TOP = 64
    """The sample holds at least this many entries above the quantile (relative error ~ 1/8)."""
    MARGIN_SD = 2.0
    """Take the threshold this many binomial standard deviations below the sample quantile."""
    UPPER = 1.3
    """More candidates than UPPER * k are refined to the exact top-k (Lin et al.'s code uses 1.3)."""
    EXACT_BELOW = 0.25
    """Use the exact top-k when the sample would be at least this fraction of N."""

    def __init__(self, numel: int, *, sample_ratio: float, sparsities: tuple[float, ...], generator: torch.Generator,
                 device: torch.device | str = "cpu", backend: str = "auto", shared: ProcessShared | None = None) -> None:
        """``shared``: the process's shared buffers (geodml.algorithms.shared): the selector's working
        buffers are scratch, used within one ``select`` and what reads its result before a wait."""
        if backend == "auto":
            cpu = torch.device(device).type == "cpu"
            backend = ("fused" if kernels.compiled is not None else "numpy") if cpu else "torch"
        if backend not in ("fused", "numpy", "torch"):
            raise ValueError(f"unknown selection backend {backend!r}")
        if backend == "fused" and kernels.compiled is None:
            raise ValueError(f"selection backend 'fused' needs geodml._kernels: {kernels.UNAVAILABLE_REASON}")
        self.numel, self.sample_ratio, self.backend, self.gen = numel, float(sample_ratio), backend, generator
        sc = (shared or ProcessShared()).scratch
        self.absv = sc("topk.absv", numel, torch.float32, device)
        self.mask = sc("topk.mask", numel, torch.bool, device)
        self.all_idx = (shared or ProcessShared()).tensor(f"topk.all_idx.{numel}.{device}", torch.empty(
            numel, dtype=torch.int64, device=device), lambda t: torch.arange(numel, out=t))  # read only
        cap = max([self.sample_size(s) for s in sparsities] + [1])
        self.sample_idx = sc("topk.sample_idx", cap, torch.int64, device)
        self.sample_val = sc("topk.sample_val", cap, torch.float32, device)
        if backend in ("numpy", "fused"):
            self._absv_np, self._mask_np = self.absv.numpy(), self.mask.numpy()
            self._part_np = sc("topk.part", numel, torch.float32, device).numpy()  # scratch of the exact selection
        if backend == "fused":  # candidates go into a preallocated index buffer (no N-sized temporaries)
            self.cand = sc("topk.cand", numel, torch.int64, device)
            self._cand_np = self.cand.numpy()
        self._values_np = np.empty(0, dtype=np.float32)  # the fused path's view of select()'s values
        self.path = "none"

    def sample_size(self, sparsity: float) -> int:
        """Sample size at ``sparsity``; 0 means "take the exact top-k directly"."""
        n = self.numel
        if target_count(sparsity, n) >= n:
            return 0
        ns = max(math.ceil(self.sample_ratio * n), math.ceil(self.MIN_SAMPLE_TOP / (1.0 - sparsity)))
        return 0 if ns >= self.EXACT_BELOW * n else ns

    def select(self, values: torch.Tensor, sparsity: float) -> torch.Tensor:
        n, k = self.numel, target_count(sparsity, self.numel)
        if k >= n:
            self.path = "dense"
            return self.all_idx
        fused = self.backend == "fused"
        if fused:  # |v| is formed only where it is read: the sample, the candidates' scan, a refinement
            self._values_np = values.numpy()
        else:
            torch.abs(values, out=self.absv)
        ns = self.sample_size(sparsity)
        if ns == 0:
            self.path = "exact"
            return self._exact(k)
        if ns > self.sample_idx.numel():
            raise ValueError(f"sparsity {sparsity} was not among those this selector was built for")
        sidx, sval = self.sample_idx[:ns], self.sample_val[:ns]
        torch.randint(0, n, (ns,), generator=self.gen, out=sidx)
        if fused:
            torch.index_select(values, 0, sidx, out=sval).abs_()
        else:
            torch.index_select(self.absv, 0, sidx, out=sval)
        # The sample's r-th largest value estimates the magnitude above which a fraction r/ns of
        # all entries lie; r/ns sits MARGIN_SD binomial standard deviations above (1-s), so the
        # candidates include the top-k unless the sample was unlucky.
        top = ns * (1.0 - sparsity)
        r = min(ns, max(1, math.ceil(top + self.MARGIN_SD * math.sqrt(top))))
        cand = self._candidates(sval, ns - r)
        c = int(cand.numel())
        if c < k:
            self.path = "fallback"
            return self._exact(k)
        if c > self.UPPER * k:
            self.path = "refined"
            return self._refine(cand, k)
        self.path = "sampled"
        return cand

    # ---- kernels (NumPy views on CPU, torch elsewhere) -------------------------------------
    def _candidates(self, sval: torch.Tensor, kth: int) -> torch.Tensor:
        """Indices j with |v_j| >= the kth-smallest sample value."""
        if self.backend == "fused":
            s = sval.numpy()
            s.partition(kth)
            c = kernels.compiled.abs_ge_indices(self._values_np, float(s[kth]), self._cand_np)
            return self.cand[:c]
        if self.backend == "numpy":
            s = sval.numpy()
            s.partition(kth)
            np.greater_equal(self._absv_np, s[kth], out=self._mask_np)
            return torch.from_numpy(np.flatnonzero(self._mask_np))
        thr = torch.kthvalue(sval, kth + 1).values
        torch.ge(self.absv, thr, out=self.mask)
        return torch.nonzero(self.mask).view(-1)

    def _exact(self, k: int) -> torch.Tensor:
        """The exact top-k: the k-th largest |v| by in-place introselect on a preallocated copy
        (no N-sized allocation, unlike argpartition), then the entries at or above it; ties at
        the k-th value are cut down to exactly k."""
        n = self.numel
        if self.backend == "fused":  # the rare exact path forms |v| in full, then runs the NumPy code
            np.abs(self._values_np, out=self._absv_np)
        if self.backend in ("numpy", "fused"):
            np.copyto(self._part_np, self._absv_np)
            self._part_np.partition(n - k)
            np.greater_equal(self._absv_np, self._part_np[n - k], out=self._mask_np)
            cand = torch.from_numpy(np.flatnonzero(self._mask_np))
            return cand if cand.numel() == k else self._refine(cand, k)
        return torch.topk(self.absv, k, sorted=False).indices

    def _refine(self, cand: torch.Tensor, k: int) -> torch.Tensor:
        if self.backend == "fused":
            c = cand.numpy()
            sub = np.abs(np.take(self._values_np, c))  # |v| at the candidates only (= absv there)
            return torch.from_numpy(c[np.argpartition(sub, len(c) - k)[len(c) - k:]])
        if self.backend in ("numpy", "fused"):
            c = cand.numpy()
            sub = np.take(self._absv_np, c)
            return torch.from_numpy(c[np.argpartition(sub, len(c) - k)[len(c) - k:]])
        mags = torch.index_select(self.absv, 0, cand)
        return cand[torch.topk(mags, k, sorted=False).indices]
