"""FedIR: importance-reweighted client objectives (Hsu, Qi & Brown 2020, "Federated visual
classification with real-world data distribution", Section 5.2).

Partition k weights each example's loss by ``p(y) / q_k(y)``, with p the global label
distribution and q_k its own (eq. 3), self-normalized within each minibatch (eq. 4):
``loss = sum_i r_i l_i / sum_i r_i``. q_k never leaves the partition; p costs K*C scalars:
here every partition all-gathers its C label counts once at construction (kind ``control``),
and each computes p from the gathered [K, C] table. Classes absent from the partition get
weight 0 (they never occur in its minibatches).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geodml.algorithms.fedavg import FedAvg


def importance_ratios(counts: np.ndarray, rank: int) -> np.ndarray:
    """p(y) / q_rank(y) from the [K, C] label counts of all partitions (0 where q = 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    p = counts.sum(axis=0) / counts.sum()
    q = counts[rank] / counts[rank].sum()
    out = np.zeros_like(p)
    np.divide(p, q, out=out, where=q > 0)
    return out


class FedIR(FedAvg):
    name = "fedir"
    self_normalized_weights = True

    def __init__(self, **kw: Any) -> None:
        ctx, comm, flat = kw["ctx"], kw["comm"], kw["flat"]
        local = torch.as_tensor(np.asarray(ctx.label_counts[ctx.rank], dtype=np.int64))
        gathered = comm.all_gather(local, "control")            # K*C scalars, once
        table = torch.stack(list(gathered)) if isinstance(gathered, (list, tuple)) else gathered
        self.global_label_counts = table.reshape(ctx.world_size, -1).cpu().numpy()
        assert np.array_equal(self.global_label_counts, np.asarray(ctx.label_counts)), \
            "gathered label counts disagree with the partitioner's"
        ratios = importance_ratios(self.global_label_counts, ctx.rank)
        self.importance = torch.as_tensor(ratios, dtype=flat.data.dtype, device=flat.data.device)
        super().__init__(**kw)

    def label_weights(self) -> torch.Tensor:
        return self.importance
