"""FedProx (Li et al., "Federated optimization in heterogeneous networks", MLSys 2020, Section 3):
each participant minimizes its local loss plus the proximal term ``mu/2 * ||w - w_t||^2``,
where w_t is the global model the round started from. Its gradient ``mu * (w - w_t)`` is added
to the minibatch gradient (weight decay already included) before the local momentum-SGD update.
mu = 0 leaves every gradient unchanged, i.e. exactly FedAvg.
"""

from __future__ import annotations

from typing import Any

import torch

from geodml.algorithms.fedavg import FedAvg


class FedProx(FedAvg):
    name = "fedprox"

    def __init__(self, *, prox_mu: float, **kw: Any) -> None:
        """mu >= 0, as RunConfig validated it."""
        self.prox_mu = float(prox_mu)
        flat = kw["flat"]   # w - w_t: scratch shared by the process's partitions (used within one turn)
        self._prox = kw["ctx"].shared.scratch("fedprox.prox", flat.numel, flat.data.dtype, flat.data.device)
        super().__init__(**kw)

    def before_step(self, step: int, lr: float) -> None:
        super().before_step(step, lr)
        if self.is_selected:
            torch.sub(self.flat.data, self.global_w, out=self._prox)
            self.flat.grad.add_(self._prox, alpha=self.prox_mu)
