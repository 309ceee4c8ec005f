"""FedNova: normalized averaging (Wang, Liu, Liang, Joshi & Poor, "Tackling the objective
inconsistency problem in heterogeneous federated optimization", NeurIPS 2020, Section 4, eq. 7,
with the momentum-SGD local solver of its Section 4 / Appendix).

Participant i takes tau_i local steps in a round. Its local change is a linear combination of
its minibatch gradients, ``w_t - w_i = lr * sum_j a_ij g_ij``; the vector a_i depends only on
the local solver. FedAvg weights the changes themselves, so a participant that takes more steps
pulls harder (objective inconsistency); FedNova averages the *normalized* changes and rescales:

    d_i = (w_t - w_i) / ||a_i||_1                   (normalized cumulative update)
    tau_eff = sum_i p_i ||a_i||_1                   (the paper's default effective steps)
    w_{t+1} = w_t - tau_eff * sum_i p_i d_i          (eq. 7 with the server step of FedAvg)

For the local solver here (geodml.algorithms.base: ``u <- m u - lr g; w <- w + u``, the momentum
buffer zeroed at the start of every round), a gradient taken at local step j (0-based) of tau
contributes ``(1 - m**(tau - j)) / (1 - m)``, so ``||a_i||_1 = sum_{k=1..tau} (1 - m**k) / (1 - m)``
(plain SGD: tau). The momentum buffer must start every round at zero for that to hold, so
FedNova always resets it (the authors' code, JYWa/FedNova ``distoptim/FedNova.py``, zeroes it
after every average too), whatever ``--reset-momentum`` says.

How ||a_i||_1 is computed: as the exact linear response of the local solver to a unit gradient
at every step, by running the solver on one scalar beside the model -- ``v <- m v + lr (1 - mu s);
s <- s + v`` (s: the displacement, mu: FedProx's proximal weight, whose gradient pulls back) --
one multiply-add per step, on the steps the participant actually computes. So it is correct for
any number of local steps per participant (a participant counts its own; nothing assumes equal
rounds), for FedProx's proximal term (momentum 0 gives the paper's Section 4 FedProx vector
``[(1 - lr mu)**(tau-1), ..., 1]``; the authors' code sums the two recurrences in a way that adds
one extra unit per step when both are on, which this does not copy), and for a learning rate that
changes within a round (each gradient weighs with its own lr). The scalar carries the learning
rate: ``A_i = lr * ||a_i||_1`` at a constant lr. Since tau_eff * d_i is unchanged when every A_i
is scaled by the same factor, using A_i in place of ||a_i||_1 is exactly the update above; the
statistics report ``A / lr`` (steps). With FedProx the authors' code sets tau_eff = sum p_i tau_i
instead of the paper's default; here it is the paper's sum p_i ||a_i||_1 in every case.

Weight decay enters as it does in the authors' code: it is part of the gradient (the trainer adds
it before the step), so it changes the g_ij, not a_i.

Communication: tau_eff needs every participant's ||a_i||_1. Each participant appends
``p_i A_i`` after its weighted normalized update ``p_i d_i`` in the round's one message, so the
same all-reduce (or star) that sums the updates sums tau_eff: one element more per message than
FedAvg (the authors all-reduce the scalar separately), charged as kind ``model``.

Equal local steps reduce FedNova to FedAvg with a reset momentum buffer: every ||a_i||_1 is the same
A, tau_eff = A sum_i p_i = A, and A * sum_i p_i (w_t - w_i) / A = sum_i p_i (w_t - w_i) -- equal up
to the rounding of the division, the multiplication and the sum of p_i (a few ulp of each element;
tests/test_fedavg.py). In geodml today every participant takes the same number of steps in a
round (``--iter-local``, FedVC's ceil(N_VC / B), a partial last round alike), so FedNova differs
from FedAvg only through the per-round momentum reset; the local step counts differ once a round
gives participants different work (``--local-epochs``: ceil(E n_k / B) steps each, the source of
heterogeneity in the FedNova paper's experiments).
"""

from __future__ import annotations

from typing import Any

import torch

from geodml.algorithms.fedavg import FedAvg


class FedNova(FedAvg):
    name = "fednova"
    wire_extra = 1                                   # p_i * A_i, summed into tau_eff with the update

    def __init__(self, **kw: Any) -> None:
        """No hyper-parameters of its own; the local momentum buffer is reset every round (module docstring)."""
        kw["reset_momentum"] = True
        # internal state: the scalar shadow of the local solver (this round)
        self.shadow_s = 0.0             # displacement under unit gradients: A_i = lr * ||a_i||_1
        self.shadow_v = 0.0
        self.local_steps = 0            # tau_i of the current round
        self.last_lr = 0.0
        # statistics of the last average
        self.last_tau = 0
        self.last_norm_a = float("nan")     # ||a_i||_1 (steps) of this participant
        self.last_tau_eff = float("nan")    # tau_eff (steps)
        super().__init__(**kw)

    def on_round_start(self) -> None:
        super().on_round_start()
        self.shadow_s = self.shadow_v = 0.0
        self.local_steps = 0

    def local_update(self, step: int, lr: float) -> None:
        super().local_update(step, lr)
        if self.computes(step):
            mu = float(getattr(self, "prox_mu", 0.0))      # FedProx's proximal weight when composed with it
            self.shadow_v = self.momentum * self.shadow_v + lr * (1.0 - mu * self.shadow_s)
            self.shadow_s += self.shadow_v
            self.local_steps += 1
            self.last_lr = lr

    def contribute(self, delta: torch.Tensor, p: float) -> None:
        """p_i d_i = p_i (w_t - w_i) / A_i, and p_i A_i in the extra slot (0 and 0 without local steps)."""
        a = self.shadow_s
        delta.mul_(p / a if a > 0 else 0.0)
        self.wire[-1] = p * a
        self.last_tau = self.local_steps
        self.last_norm_a = a / self.last_lr if self.last_lr > 0 else 0.0

    def aggregate(self, summed: torch.Tensor) -> torch.Tensor:
        """tau_eff * sum_i p_i d_i, tau_eff = sum_i p_i A_i from the extra slot."""
        tau_eff = float(self.wire[-1])
        self.last_tau_eff = tau_eff / self.last_lr if self.last_lr > 0 else float("nan")
        return summed.mul_(tau_eff)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        if self.syncs:
            out.update(fednova_tau_eff=self.last_tau_eff, fednova_norm_a=self.last_norm_a,
                       fednova_local_steps=float(self.last_tau))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fednova": [self.shadow_s, self.shadow_v, self.local_steps, self.last_lr]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)       # calls on_round_start, which zeroes the shadow
        s, v, n, lr = state["fednova"]
        self.shadow_s, self.shadow_v, self.local_steps, self.last_lr = float(s), float(v), int(n), float(lr)
