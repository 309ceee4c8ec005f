"""SCAFFOLD: Stochastic Controlled Averaging (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh,
"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1 with
option II), written on geodml's public algorithm API as a FedAvg subclass: ``--algo scaffold``.

Server state x (the global model) and c (the server control variate), client control variates
c_i (all zero at the start). Round t over the sampled participants S (FedAvg's seeded draw)::

    y_i <- x
    K times:  y_i <- y_i - eta_l (g_i(y_i) - c_i + c)                          (corrected local steps)
    c_i^+  = c_i - c + (x - y_i) / (K eta_l)                                   (option II)
    (Delta y_i, Delta c_i) = (y_i - x, c_i^+ - c_i);  c_i <- c_i^+             (upload both)
    x <- x + eta_g (1/|S|) sum_i Delta y_i;   c <- c + (|S|/N) (1/|S|) sum_i Delta c_i

K is FedAvg's Iter_Local (``--iter-local``; ``--local-epochs`` gives participant i its own K_i),
eta_g is ``--global-lr`` (the paper's experiments: 1), N the number of partitions.

Where geodml's setting is wider than the paper's:

* **The local solver** is FedAvg's (Quagmire Appendix A's momentum SGD) on the corrected gradient
  g_i - c_i + c. The paper's is plain SGD: give ``--momentum 0`` (geodml's default 0.9 is warned
  about). K eta_l in option II is the sum of the learning rates of the participant's local steps
  in the round (K eta_l at a constant rate; a schedule's changes within a round are counted
  exactly); with momentum it is that sum still, so c_i^+ is then the round's mean step per unit
  learning rate, not the paper's mean gradient.
* **Weight decay** (``--weight-decay``) is part of g_i, as L2 in the gradient.
* **Averages** are uniform, 1/|S|, as the paper writes them (FedAvg's are size-weighted; equal
  partitions agree). Float BatchNorm buffers are averaged with the same weights.

Bytes: every participant uploads Delta y_i and Delta c_i in the round's one message (FedAvg's
all-reduce, or its star when C < 1), so a round costs twice FedAvg's (plus the buffers once); the
paper's "twice the communication of FedAvg". c is server state as w_t: a participant that sat out
downloads x and c (and the buffers), kind ``model``. The upload's control half is kind ``model``
too (one message; the ledger has no separate kind for it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from geodml.algorithm import AlgoContext, Comm, FedAvg, FlatParams, RunConfig, fedavg_arguments, opt, require


class Scaffold(FedAvg):
    """SCAFFOLD option II on partition i (module docstring)."""

    name = "scaffold"

    @dataclass(kw_only=True)
    class Config:
        global_lr: float = opt(1.0, help="the server step size eta_g (Karimireddy et al.'s experiments: 1)")

        def __post_init__(self) -> None:
            require(self.global_lr == self.global_lr and 0 < self.global_lr < float("inf"),
                    f"--global-lr must be > 0, got {self.global_lr!r}")

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Scaffold:
        if cfg.optim.momentum != 0:
            warnings.warn(f"--momentum {cfg.optim.momentum:g}: SCAFFOLD's local solver is plain SGD "
                          "(Karimireddy et al.); give --momentum 0 to run the paper's", stacklevel=2)
        return cls(global_lr=cfg.plugin.global_lr, **fedavg_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    def __init__(self, *, global_lr: float = 1.0, **fedavg: Any) -> None:
        """``fedavg``: FedAvg's constructor arguments (geodml.algorithm.fedavg_arguments)."""
        flat, ctx = fedavg["flat"], fedavg["ctx"]
        self.global_lr = float(global_lr)
        self.wire_extra = flat.numel          # the message: [Delta y (n) | buffers | Delta c (n)]
        self.c_i = torch.zeros_like(flat.data)            # this partition's control variate
        self.c = ctx.shared.tensor("scaffold.c", flat.data, torch.Tensor.zero_)   # server state, as w_t
        self.lr_sum = 0.0                     # K eta_l: the learning rates of this round's local steps
        super().__init__(**fedavg)

    def averaging_weights(self, selected: tuple[int, ...]) -> np.ndarray:
        """1/|S| each, as Algorithm 1 averages."""
        return np.full(len(selected), 1.0 / len(selected))

    def on_round_start(self) -> None:
        super().on_round_start()
        self.lr_sum = 0.0

    def local_update(self, step: int, lr: float) -> None:
        """The corrected step: the local solver on g_i - c_i + c."""
        if self.computes(step):
            self.flat.grad.sub_(self.c_i).add_(self.c)
            self.lr_sum += lr
        super().local_update(step, lr)

    def contribute(self, delta: torch.Tensor, p: float) -> None:
        """``delta`` = x - y_i: write Delta c_i = (x - y_i) / (K eta_l) - c into the control half, take
        c_i <- c_i + Delta c_i, and weigh both halves by p = 1/|S|."""
        dc = self.wire[-self.flat.numel:]
        torch.div(delta, self.lr_sum, out=dc).sub_(self.c)
        self.c_i.add_(dc)
        dc.mul_(p)
        super().contribute(delta, p)

    def server_update(self, delta: torch.Tensor) -> None:
        """x <- x - eta_g mean(x - y_i);  c <- c + (|S|/N) mean(Delta c_i) (the sum is still in the wire)."""
        self.global_w.sub_(delta, alpha=self.global_lr)
        self.c.add_(self.wire[-self.flat.numel:], alpha=len(self.selected) / self.ctx.world_size)

    def server_state(self) -> list[torch.Tensor]:
        return super().server_state() + [self.c]

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "scaffold_c_norm": float(torch.linalg.vector_norm(self.c)),
                "scaffold_ci_norm": float(torch.linalg.vector_norm(self.c_i))}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "scaffold": {"c_i": self.c_i.clone(), "c": self.c.clone(),
                                                      "lr_sum": self.lr_sum}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)             # calls on_round_start, which zeroes lr_sum
        own = state["scaffold"]
        self.c_i.copy_(own["c_i"])
        if self.ctx.rank in self.holders:          # as w_t: a holder's copy is the current one
            self.c.copy_(own["c"])
        self.lr_sum = float(own["lr_sum"])


__all__ = ["Scaffold"]
