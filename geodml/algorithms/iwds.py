"""IWDS: Imbalanced Weight Decay Sampling (iwds-imbalanced-weight-decay-sampling, "Approach").

Example i of partition k with label y and N_{k,y} examples of that label has sampling weight
``w = (1 - b_t) / (1 - b_t ** N_{k,y})``, where ``b_t = b_m + (b_0 - b_m) * rho ** t`` decays
over communication rounds t (eq. 1): early rounds rebalance labels strongly (b near 1 makes w
about 1/N_{k,y}), late rounds approach uniform sampling (b = 0 gives w = 1).

The paper samples example i with probability ``w_i / sum_j w_j``. Here the partition keeps its
ordinary uniform minibatches and weights each example's loss by ``n_k * w_i / sum_j w_j``
(mean 1 over the partition): in expectation the same objective as that resampling (the
importance weight of the IWDS distribution relative to uniform), and it composes with FedVC
and every other variant without a second sampler.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geodml.algorithms.fedavg import FedAvg


def iwds_beta(t: int, beta0: float, beta_m: float, rho: float) -> float:
    """b_t = b_m + (b_0 - b_m) * rho**t."""
    return beta_m + (beta0 - beta_m) * rho ** t


def iwds_class_weights(counts: np.ndarray, beta: float) -> np.ndarray:
    """Per-class loss weights: (1-b)/(1-b**N_c), scaled so that sum_c N_c w_c = sum_c N_c; 0 for N_c = 0."""
    counts = np.asarray(counts, dtype=np.float64)
    raw = np.zeros_like(counts)
    present = counts > 0
    raw[present] = (1.0 - beta) / (1.0 - beta ** counts[present])
    return raw * (counts.sum() / (counts * raw).sum())


class IWDS(FedAvg):
    name = "iwds"

    def __init__(self, *, iwds: tuple[float, float, float], **kw: Any) -> None:
        """(beta0, beta_m, rho) with 0 <= beta0, beta_m < 1 and 0 < rho <= 1, as RunConfig validated them."""
        b0, bm, rho = (float(x) for x in iwds)
        self.beta0, self.beta_m, self.rho = b0, bm, rho
        ctx, flat = kw["ctx"], kw["flat"]
        self.local_counts = np.asarray(ctx.label_counts[ctx.rank], dtype=np.float64)
        self.beta = b0
        self.class_weights = torch.zeros(len(self.local_counts), dtype=flat.data.dtype, device=flat.data.device)
        super().__init__(**kw)

    def on_round_start(self) -> None:
        super().on_round_start()
        self.beta = iwds_beta(self.round, self.beta0, self.beta_m, self.rho)
        self.class_weights.copy_(torch.from_numpy(iwds_class_weights(self.local_counts, self.beta)))

    def label_weights(self) -> torch.Tensor:
        return self.class_weights

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "iwds_beta": self.beta}
