"""FedAvgM: FederatedAveraging with server momentum (Hsu, Qi & Brown 2019, "Measuring the
effects of non-identical data distribution for federated visual classification", Section 4.2).

The server step on the averaged update ``delta = sum_k p_k (w_t - w^k)`` becomes

    v <- beta * v + delta
    w_{t+1} <- w_t - server_lr * v                                  (plain)
    w_{t+1} <- w_t - server_lr * (delta + beta * v)                 (Nesterov, as the paper runs it)

With beta = 0 and server_lr = 1 this is exactly FedAvg's ``w_{t+1} = w_t - delta`` (bit for
bit: v = 0*v + delta = delta). There is no server in the emulation: every participant applies
the same step to the same all-reduced delta, so all hold identical w and v; a participant that
missed rounds downloads v together with w (geodml.algorithms.fedavg).
"""

from __future__ import annotations

from typing import Any

import torch

from geodml.algorithms.fedavg import FedAvg


class FedAvgM(FedAvg):
    name = "fedavgm"

    def __init__(self, *, server_momentum: float, server_lr: float = 1.0, nesterov: bool = False, **kw: Any) -> None:
        """beta in [0, 1) and server_lr > 0, as RunConfig validated them."""
        self.server_momentum = float(server_momentum)
        self.server_lr = float(server_lr)
        self.nesterov = bool(nesterov)
        # the server momentum buffer: one per process, as w_t (geodml.algorithms.fedavg)
        self.v = kw["ctx"].shared.tensor("fedavgm.v", kw["flat"].data, torch.Tensor.zero_)
        self._v_norm = 0.0          # ||v|| as this partition last held it (its round's average or a download)
        super().__init__(**kw)

    def server_update(self, delta: torch.Tensor) -> None:
        beta, lr = self.server_momentum, self.server_lr
        self.v.mul_(beta).add_(delta)
        if self.nesterov:
            self.global_w.add_(delta, alpha=-lr).add_(self.v, alpha=-lr * beta)
        else:
            self.global_w.add_(self.v, alpha=-lr)

    def server_state(self) -> list[torch.Tensor]:
        return super().server_state() + [self.v]

    def on_server_state(self) -> None:
        super().on_server_state()
        self._v_norm = float(torch.linalg.vector_norm(self.v))

    def stats(self) -> dict[str, float]:
        """The norm of v as this partition last held it (it has not changed since for this partition: a
        partition that sits rounds out holds the v of the round it last took part in)."""
        return {**super().stats(), "fedavgm_server_momentum_norm": self._v_norm}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "v": self.v.clone(), "v_norm": self._v_norm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.ctx.rank in self.holders:  # as w_t: a holder's copy is the current one
            self.v.copy_(state["v"])
        self._v_norm = float(state["v_norm"]) if "v_norm" in state else float(torch.linalg.vector_norm(state["v"]))
