"""FedOpt's adaptive server optimizers: FedAdagrad, FedAdam and FedYogi (Reddi, Charles, Zaheer,
Garrett, Rush, Konecny, Kumar & McMahan, "Adaptive Federated Optimization", ICLR 2021, Algorithm 2),
selected with ``--algo fedavg --server-optimizer adagrad|adam|yogi``.

FedAvg's round is unchanged (Algorithm 2's ClientUpdate is FedAvg's local momentum SGD); only the
server step on the averaged update changes. With the paper's pseudo-gradient Delta_t =
sum_k p_k (w^k - w_t) (the negative of FedAvg's ``delta``)::

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                             (FedAdagrad)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)        (FedYogi)
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                           (FedAdam)
    w_{t+1} = w_t + eta m_t / (sqrt(v_t) + tau)

element-wise, with no bias correction (Algorithm 2 has none), ``eta`` = ``--server-lr``, ``beta1,
beta2`` = ``--server-betas`` (the paper's 0.9, 0.99), ``tau`` = ``--server-tau`` (the adaptivity;
the paper's 1e-3) and v_{-1} = tau^2 (Algorithm 2 asks v_{-1} >= tau^2; we take the bound), m_{-1} = 0.
FedAdagrad's m uses beta1 as well: Algorithm 2 writes the same first line for all three (give
``--server-betas 0,0.99`` for Adagrad without momentum). Where the paper is silent: the averaging
weights are FedAvg's (n_k / n over the participants; the paper's Algorithm 2 averages uniformly over
its equal-weight clients, and with equal partition sizes the two agree).

``--server-optimizer sgd`` is the paper's FedAvg family member SERVEROPT = SGD: FedAvg itself at
``--server-lr 1`` (Reddi et al. Section 2: "FedAvg ... with SERVEROPT = SGD with server learning
rate 1"), FedAvgM with ``--server-momentum`` (geodml.algorithms.fedavgm).

As FedAvgM's v, m and v are server state: one copy per process (its hosted partitions share it),
updated once per process and round, and downloaded with w_t by a participant that missed rounds
(charged as kind ``model``, 3x the model then). The adaptive steps add no bytes to a round.
"""

from __future__ import annotations

from typing import Any

import torch

from geodml.algorithms.fedavg import FedAvg
from geodml.config import SERVER_OPTIMIZERS

ADAPTIVE = SERVER_OPTIMIZERS[1:]
"""The adaptive server optimizers FedOpt implements (``sgd`` is FedAvg / FedAvgM)."""


class FedOpt(FedAvg):
    """FedAvg with an adaptive server step (module docstring)."""

    name = "fedopt"

    def __init__(self, *, server_optimizer: str, server_lr: float, server_betas: tuple[float, ...],
                 server_tau: float, **kw: Any) -> None:
        """``server_optimizer`` one of :data:`ADAPTIVE`; values as RunConfig validated them."""
        if server_optimizer not in ADAPTIVE:
            raise ValueError(f"FedOpt: server_optimizer must be one of {', '.join(ADAPTIVE)}, got {server_optimizer!r}")
        self.server_optimizer = server_optimizer
        self.server_lr = float(server_lr)
        self.beta1, self.beta2 = (float(b) for b in server_betas)
        self.tau = float(server_tau)
        flat, shared = kw["flat"], kw["ctx"].shared
        # the server state: one copy per process, as w_t (geodml.algorithms.fedavg)
        self.m = shared.tensor("fedopt.m", flat.data, torch.Tensor.zero_)
        self.v = shared.tensor("fedopt.v", flat.data, lambda t: t.fill_(self.tau ** 2))
        self._work = shared.scratch("fedopt.work", flat.numel, flat.data.dtype, flat.data.device)
        super().__init__(**kw)

    def server_update(self, delta: torch.Tensor) -> None:
        """Algorithm 2's server step on FedAvg's ``delta`` = -Delta_t (so m holds -m_t: the squares and
        the sign test are unchanged); ``delta`` is the round's scratch and is overwritten."""
        m, v, work = self.m, self.v, self._work
        m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)
        sq = delta.mul_(delta)                                        # Delta_t^2
        if self.server_optimizer == "adagrad":
            v.add_(sq)
        elif self.server_optimizer == "adam":
            v.mul_(self.beta2).add_(sq, alpha=1.0 - self.beta2)
        else:                                                         # yogi
            sign = torch.sub(v, sq, out=work).sign_()
            v.addcmul_(sign, sq, value=-(1.0 - self.beta2))
        denom = torch.sqrt(v, out=work).add_(self.tau)
        self.global_w.addcdiv_(m, denom, value=-self.server_lr)      # w + eta m_t / (sqrt(v_t) + tau)

    def server_state(self) -> list[torch.Tensor]:
        return super().server_state() + [self.m, self.v]

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "fedopt_v_mean": float(self.v.mean())}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fedopt": {"m": self.m.clone(), "v": self.v.clone()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.ctx.rank in self.holders:  # as w_t: a holder's copy is the current one
            self.m.copy_(state["fedopt"]["m"])
            self.v.copy_(state["fedopt"]["v"])


__all__ = ["ADAPTIVE", "SERVER_OPTIMIZERS", "FedOpt"]
