"""IWDS: Imbalanced Weight Decay Sampling (iwds-imbalanced-weight-decay-sampling, "Approach").

Example i of partition k with label y and N_{k,y} examples of that label has sampling weight
``w = (1 - b_t) / (1 - b_t ** N_{k,y})``, where ``b_t = b_m + (b_0 - b_m) * rho ** t`` decays
over communication rounds t (eq. 1): early rounds rebalance labels strongly (b near 1 makes w
about 1/N_{k,y}), late rounds approach uniform sampling (b = 0 gives w = 1).

Two mechanisms (``--iwds-mode``):

* ``resample`` -- the paper's: every example of a minibatch is drawn independently, with
  replacement, with probability ``p(k, i) = w_{k,i,t} / sum_j w_{k,j,t}`` over the partition's
  examples (i.i.d. draws: the paper's "sampling probability of i-th sample"). The draw of round t,
  local step j comes from its own generator ``default_rng([seed, rank, t, j, 0x1DD5])``: a pure
  function of (partition, round, step), so a resumed run draws the same examples with no sampler
  state to checkpoint. Inverse-CDF: one cumulative sum of the w over the partition per round, one
  binary search per example. The loss is the plain minibatch mean.
* ``reweight`` (the default, geodml's form before issue 23, kept so earlier runs keep their
  meaning) -- the partition keeps its ordinary uniform minibatches and weights each example's
  loss by ``n_k * w_i / sum_j w_j`` (mean 1 over the partition): in expectation the same
  objective as the resampling (the importance weight of the IWDS distribution relative to
  uniform), with a different gradient variance; it composes with FedVC, which resampling does not
  (RunConfig rejects that pair: both would draw the minibatches).

Resampling needs the labels of the partition's examples: the trainer's minibatch source carries
them (``BatchSource.labels``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geodml.algorithms.base import BatchSource
from geodml.algorithms.fedavg import FedAvg

_RESAMPLE_TAG = 0x1DD5


def iwds_beta(t: int, beta0: float, beta_m: float, rho: float) -> float:
    """b_t = b_m + (b_0 - b_m) * rho**t."""
    return beta_m + (beta0 - beta_m) * rho ** t


def iwds_raw_weights(counts: np.ndarray, beta: float) -> np.ndarray:
    """The paper's w per class: (1-b)/(1-b**N_c) (1 at b = 0); 0 for N_c = 0."""
    counts = np.asarray(counts, dtype=np.float64)
    raw = np.zeros_like(counts)
    present = counts > 0
    raw[present] = (1.0 - beta) / (1.0 - beta ** counts[present])
    return raw


def iwds_class_weights(counts: np.ndarray, beta: float) -> np.ndarray:
    """Per-class loss weights: (1-b)/(1-b**N_c), scaled so that sum_c N_c w_c = sum_c N_c; 0 for N_c = 0."""
    counts = np.asarray(counts, dtype=np.float64)
    raw = iwds_raw_weights(counts, beta)
    return raw * (counts.sum() / (counts * raw).sum())


def iwds_class_probabilities(counts: np.ndarray, beta: float) -> np.ndarray:
    """q(k, c): the probability that a resampled example has label c, N_c w_c / sum_c' N_c' w_c'."""
    mass = np.asarray(counts, dtype=np.float64) * iwds_raw_weights(counts, beta)
    return mass / mass.sum()


def iwds_resample(indices: np.ndarray, cdf: np.ndarray, rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
    """Fill ``out`` with i.i.d. draws from ``indices``, example i with probability proportional to
    ``cdf[i] - cdf[i-1]`` (``cdf``: cumulative sum of the per-example weights): inverse CDF."""
    u = rng.random(len(out)) * cdf[-1]
    pos = np.searchsorted(cdf, u, side="right")
    np.minimum(pos, len(cdf) - 1, out=pos)      # u < cdf[-1] always; guards the rounding of the product
    np.take(indices, pos, out=out)
    return out


class IWDS(FedAvg):
    name = "iwds"

    def __init__(self, *, iwds: tuple[float, float, float], iwds_mode: str = "reweight", **kw: Any) -> None:
        """(beta0, beta_m, rho) with 0 <= beta0, beta_m < 1 and 0 < rho <= 1, and the mode (reweight or
        resample), as RunConfig validated them."""
        b0, bm, rho = (float(x) for x in iwds)
        self.beta0, self.beta_m, self.rho = b0, bm, rho
        if iwds_mode not in ("reweight", "resample"):
            raise ValueError(f"iwds_mode must be reweight or resample, got {iwds_mode!r}")
        self.resample = iwds_mode == "resample"
        self._cdf: np.ndarray | None = None          # resample: this round's cumulative example weights
        self._cdf_round = -1
        self._drawn = np.empty(kw["ctx"].batch_size, dtype=np.int64)
        ctx, flat = kw["ctx"], kw["flat"]
        self.local_counts = np.asarray(ctx.label_counts[ctx.rank], dtype=np.float64)
        self.beta = b0
        self.class_weights = torch.zeros(len(self.local_counts), dtype=flat.data.dtype, device=flat.data.device)
        super().__init__(**kw)

    def on_round_start(self) -> None:
        super().on_round_start()
        self.beta = iwds_beta(self.round, self.beta0, self.beta_m, self.rho)
        self.class_weights.copy_(torch.from_numpy(iwds_class_weights(self.local_counts, self.beta)))

    def label_weights(self) -> torch.Tensor | None:
        return None if self.resample else self.class_weights

    def batch_indices(self, step: int, sampler: BatchSource) -> np.ndarray:
        """resample: the round's w-proportional draw (module docstring); reweight: the sampler's."""
        if not self.resample:
            return super().batch_indices(step, sampler)
        labels = getattr(sampler, "labels", None)
        if labels is None:
            raise ValueError("--iwds-mode resample needs the labels of the partition's examples; "
                             "this minibatch source has none")
        if self._cdf is None or self._cdf_round != self.round:
            raw = iwds_raw_weights(self.local_counts, self.beta)
            self._cdf = np.cumsum(raw[np.asarray(labels)])
            self._cdf_round = self.round
        rng = np.random.default_rng([self.ctx.seed, self.ctx.rank, self.round, self.steps_in_round, _RESAMPLE_TAG])
        return iwds_resample(sampler.indices, self._cdf, rng, self._drawn)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "iwds_beta": self.beta, "iwds_resample": float(self.resample)}
