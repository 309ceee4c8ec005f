"""DiLoCo: Distributed Low-Communication training (Douillard et al. 2023, arXiv 2311.08105, Algorithm 1),
written on geodml's public algorithm API (geodml.algorithm) as a user's plugin would be.

On every partition k, from the global model theta^(t-1) of outer step t::

    theta_k <- theta^(t-1)
    H times:  theta_k <- InnerOpt(theta_k, grad L(theta_k, x ~ D_k))         (inner steps, no traffic)
    Delta_k  = theta^(t-1) - theta_k                                        (the outer gradient)
    Delta    = (1 / |S_t|) sum_k Delta_k                                    (one all-reduce, kind ``model``)
    theta^(t) <- OuterOpt(theta^(t-1), Delta)

with the paper's choices: InnerOpt = AdamW, OuterOpt = SGD with Nesterov momentum, H = 500, outer
lr 0.7, outer momentum 0.9 (Section 3; "inner AdamW, outer Nesterov"). It is FederatedAveraging with
a different local solver and server step, which is how geodml builds it: a subclass of FedAvgM
(geodml.algorithms.fedavgm), whose Nesterov server step is the outer optimizer, on FedAvg's round
machinery (client sampling, stale-partition downloads, hosting P > R, checkpoints).

Where the paper is silent, torchft's ``DiLoCo`` (torchft/local_sgd.py: the pseudogradient is
``original - local``, all-reduced as an average over the participating replicas, then
``outer_optimizer.step()``; its example uses ``torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True)``)
settles it:

* **The average is uniform**, 1 / |S_t| over the participants, as the paper and torchft average,
  not FedAvg's size weights n_k / n (the paper's non-i.i.d. shards come from k-means and differ in
  size). Partitions of equal size make the two the same.
* **The outer step** is ``torch.optim.SGD``'s Nesterov form, v <- mu v + Delta; theta <- theta -
  lr (Delta + mu v) (FedAvgM's, Hsu et al. 2019), the momentum buffer starting at zero, in torch's
  order of operations (bit for bit: tests/test_diloco.py).
* **The inner AdamW** is ``torch.optim.AdamW`` (Loshchilov & Hutter 2019, no amsgrad), each
  partition's moments and step count kept across outer steps (the paper never resets the inner
  optimizer; nor does torchft). Its learning rate is the trainer's (``--lr`` and its schedule;
  the paper: 4e-4 with warm-up and cosine decay), its decoupled weight decay is ``--weight-decay``
  (the paper: 0.1), applied as AdamW applies it, theta <- theta (1 - lr wd): the trainer then adds
  no L2 term to the gradient (``l2_in_gradient``). Its betas and eps are ``--adam-betas`` and
  ``--adam-eps`` (torch's defaults; the paper's text does not give them). tests/test_diloco.py
  checks the step against torch.optim.AdamW bit for bit.
* ``--inner-optimizer sgd`` is FedAvg's local step, vanilla momentum SGD with ``--momentum``
  (Quagmire Appendix A) and ``--weight-decay`` as L2 in the gradient: then DiLoCo with ``--outer-lr
  1 --outer-momentum 0`` on equal partitions is FedAvg with Iter_Local = H, bit for bit
  (tests/test_diloco.py).

With ``--param-mults prototxt`` the AdamW step sees the gradient times the layers' lr multipliers
(to which Adam is invariant but for eps) and its decay ignores the decay multipliers.

Bytes: one outer step is one all-reduce of the model (and float BatchNorm buffers), FedAvg's
message, every H steps: 1/H of BSP's gradient traffic, the paper's "H times less". SkewScout's knob
is H (``--skewscout`` tunes it as it tunes FedAvg's Iter_Local).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from geodml.algorithm import AlgoContext, Comm, FedAvgM, FlatParams, KnobSpec, RunConfig, fedavg_arguments, opt, require

INNER_OPTIMIZERS = ("adamw", "sgd")


class DiLoCo(FedAvgM):
    """DiLoCo on partition k (module docstring)."""

    name = "diloco"

    @dataclass(kw_only=True)
    class Config:
        inner_steps: int = opt(500, metavar="H", help="inner steps between outer steps (the paper's H = 500)")
        inner_optimizer: str = opt("adamw", choices=INNER_OPTIMIZERS, help="adamw: AdamW with --lr and decoupled "
                                   "--weight-decay (the paper); sgd: FedAvg's local momentum SGD (--momentum, L2 "
                                   "--weight-decay)")
        outer_lr: float = opt(0.7, help="outer learning rate (the paper's 0.7)")
        outer_momentum: float = opt(0.9, help="outer Nesterov momentum (the paper's 0.9; 0: plain outer SGD)")
        adam_betas: tuple[float, ...] = opt((0.9, 0.999), metavar="B1,B2",
                                            help="the inner AdamW's betas (torch's defaults)")
        adam_eps: float = opt(1e-8, help="the inner AdamW's eps (torch's default)")

        def __post_init__(self) -> None:
            require(isinstance(self.inner_steps, int) and not isinstance(self.inner_steps, bool)
                    and self.inner_steps >= 1, f"--inner-steps must be an integer >= 1, got {self.inner_steps!r}")
            require(self.inner_optimizer in INNER_OPTIMIZERS,
                    f"--inner-optimizer: choose one of {', '.join(INNER_OPTIMIZERS)}, got {self.inner_optimizer!r}")
            require(math.isfinite(self.outer_lr) and self.outer_lr > 0, f"--outer-lr must be > 0, got {self.outer_lr!r}")
            require(math.isfinite(self.outer_momentum) and 0 <= self.outer_momentum < 1,
                    f"--outer-momentum must be in [0, 1), got {self.outer_momentum!r}")
            self.adam_betas = tuple(float(b) for b in self.adam_betas)
            require(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
                    f"--adam-betas takes two numbers in [0, 1) such as 0.9,0.999, got {self.adam_betas!r}")
            require(math.isfinite(self.adam_eps) and self.adam_eps > 0, f"--adam-eps must be > 0, got {self.adam_eps!r}")

        @property
        def iter_local(self) -> int:
            """FedAvg's Iter_Local of this run (--rounds sums it): H."""
            return self.inner_steps

    KNOB: ClassVar[KnobSpec] = KnobSpec("inner_steps", (5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0))
    """SkewScout's knob: H, most communication first (FedAvg's Iter_Local grid around the paper's 500)."""

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        """What the options cannot say alone (ValueError: one ``geodml: error:`` line before any process starts)."""
        c = cfg.plugin
        require(cfg.fedavg.local_epochs == 0, "--local-epochs: a DiLoCo outer step is H inner steps (--inner-steps); "
                "leave --local-epochs out")
        require(not (c.inner_optimizer == "adamw" and cfg.fedavg.reset_momentum),
                "--reset-momentum resets momentum SGD's buffer; the inner AdamW keeps its moments across outer steps "
                "(the paper); use it with --inner-optimizer sgd")

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> DiLoCo:
        c = cfg.plugin
        if c.inner_optimizer == "adamw" and cfg.optim.momentum != 0.9:
            warnings.warn("--momentum does nothing with --inner-optimizer adamw (its betas are --adam-betas)",
                          stacklevel=2)
        return cls(**cls.diloco_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    @staticmethod
    def diloco_arguments(cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> dict[str, Any]:
        """DiLoCo's constructor arguments from a validated config (a subclass adds its own)."""
        c = cfg.plugin
        return dict(inner_optimizer=c.inner_optimizer, outer_lr=c.outer_lr, outer_momentum=c.outer_momentum,
                    adam_betas=c.adam_betas, adam_eps=c.adam_eps, weight_decay=cfg.optim.weight_decay,
                    **fedavg_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    def __init__(self, *, inner_optimizer: str = "adamw", outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 adam_betas: tuple[float, ...] = (0.9, 0.999), adam_eps: float = 1e-8, weight_decay: float = 0.0,
                 **fedavg: Any) -> None:
        """``fedavg``: FedAvg's constructor arguments (geodml.algorithm.fedavg_arguments; ``iter_local`` is H)."""
        self.inner_optimizer = inner_optimizer
        self.beta1, self.beta2 = (float(b) for b in adam_betas)
        self.adam_eps = float(adam_eps)
        self.decoupled_decay = float(weight_decay) if inner_optimizer == "adamw" else 0.0
        super().__init__(server_momentum=outer_momentum, server_lr=outer_lr, nesterov=True, **fedavg)
        flat = self.flat
        if inner_optimizer == "adamw":
            # this partition's AdamW state: the first moment is the buffer FedAvg keeps as u^k (it is never
            # leased: --reset-momentum is refused), the second moment and the step count its own
            self.exp_avg = self.u
            self.exp_avg_sq = torch.zeros_like(flat.data)
            self.adam_steps = 0
            self._denom = self.ctx.shared.scratch("diloco.denom", flat.numel, flat.data.dtype, flat.data.device)

    @property
    def l2_in_gradient(self) -> bool:
        """The inner AdamW decays the weights itself (decoupled); momentum SGD takes --weight-decay as L2."""
        return self.inner_optimizer != "adamw"

    def knob_spec(self) -> KnobSpec:
        return self.KNOB

    def averaging_weights(self, selected: tuple[int, ...]) -> np.ndarray:
        """1 / |S_t| each: the paper's and torchft's plain average of the outer gradients."""
        return np.full(len(selected), 1.0 / len(selected))

    def server_update(self, delta: torch.Tensor) -> None:
        """The outer step, torch.optim.SGD(nesterov=True)'s order of operations: v <- mu v + Delta;
        theta <- theta - lr (Delta + mu v) (``delta`` is the round's scratch: it is overwritten)."""
        self.v.mul_(self.server_momentum).add_(delta)
        self.global_w.add_(delta.add_(self.v, alpha=self.server_momentum), alpha=-self.server_lr)

    def local_update(self, step: int, lr: float) -> None:
        """One inner step on the steps this partition computes: AdamW, or FedAvg's momentum SGD."""
        if self.inner_optimizer != "adamw":
            super().local_update(step, lr)
        elif self.computes(step):
            self.adamw_step(lr)

    def adamw_step(self, lr: float) -> None:
        """torch.optim.AdamW's single-tensor step (torch/optim/adamw.py, amsgrad off), in the same order
        of operations on preallocated buffers."""
        w, g = self.flat.data, self.flat.grad
        if self.decoupled_decay:
            w.mul_(1.0 - lr * self.decoupled_decay)
        self.adam_steps += 1
        t = self.adam_steps
        self.exp_avg.lerp_(g, 1.0 - self.beta1)
        self.exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
        step_size = lr / (1.0 - self.beta1 ** t)
        denom = torch.sqrt(self.exp_avg_sq, out=self._denom)
        denom.div_(math.sqrt(1.0 - self.beta2 ** t)).add_(self.adam_eps)
        w.addcdiv_(self.exp_avg, denom, value=-step_size)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out["diloco_outer_steps"] = float(self.syncs)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.inner_optimizer == "adamw":
            state["adam"] = {"exp_avg_sq": self.exp_avg_sq.clone(), "steps": self.adam_steps}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)      # u (the first moment) included
        if self.inner_optimizer == "adamw":
            self.exp_avg_sq.copy_(state["adam"]["exp_avg_sq"])
            self.adam_steps = int(state["adam"]["steps"])


__all__ = ["DiLoCo", "INNER_OPTIMIZERS"]
