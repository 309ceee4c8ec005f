"""TopKFedAvg: FedAvg whose uploads keep only the top-k entries of the update, with error feedback.

    PYTHONPATH=examples python -m geodml --algo topk_fedavg:TopKFedAvg --partitions 4 --dataset digits --epochs 1

Each round a participant adds its update p_k (w_t - w^k) to what it did not send before (error
feedback, Stich et al. 2018; Lin et al.'s DGC keeps the same residual), keeps the fraction
``--topk-fraction`` of its entries largest in magnitude and zeroes them in its residual. The round's
first participant sums the others' sparse uploads, sent as int32 indices and float32 values (BatchNorm
buffers dense), into its own in rank order and sends the dense sum back. At --topk-fraction 1 that
is FedAvg's star exactly (tests/test_plugins.py). docs/plugins.md walks through this file.
"""

from dataclasses import dataclass

import torch

from geodml.algorithm import FedAvg, KnobSpec, add_array, add_sparse_array, copy_array_into, fedavg_arguments, opt, require


class TopKFedAvg(FedAvg):
    name = "topk_fedavg"

    @dataclass(kw_only=True)
    class Config:
        topk_fraction: float = opt(0.1, help="fraction of the update's entries each upload keeps (1: FedAvg)")

        def __post_init__(self) -> None:
            require(0 < self.topk_fraction <= 1, f"--topk-fraction must be in (0, 1], got {self.topk_fraction!r}")

    KNOB = KnobSpec("topk_fraction", (1.0, 0.3, 0.1, 0.03, 0.01))  # SkewScout's grid, most bytes first

    @classmethod
    def from_config(cls, cfg, *, flat, comm, ctx):
        return cls(topk_fraction=cfg.plugin.topk_fraction, **fedavg_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    def __init__(self, *, topk_fraction: float, **fedavg) -> None:
        self.topk_fraction = topk_fraction
        super().__init__(**fedavg)
        self.residual = torch.zeros_like(self.flat.data)   # this partition's unsent update
        self.knob = self.KNOB.bind(get=lambda: self.topk_fraction, set=self.set_fraction)

    def set_fraction(self, value: float) -> None:
        require(0 < value <= 1, f"topk_fraction must be in (0, 1], got {value!r}")
        self.topk_fraction = float(value)

    def sum_contributions(self, buf, sel, p):
        leader, tag, n = sel[0], 2 * self.round, self.flat.numel
        if self.ctx.rank == leader:   # receive first: buf is scratch, other partitions use it during a wait
            got = self.comm.recv_from(sel[1:], "model", step=tag)
        self.write_contribution(buf, p)                    # buf = [p_k (w_t - w^k) | BN buffers]
        e = self.residual.add_(buf[:n])                    # error feedback
        idx = torch.topk(e.abs(), max(1, round(self.topk_fraction * n)), sorted=False).indices
        vals = e[idx]
        e.index_fill_(0, idx, 0.0)
        buf[:n].zero_().index_copy_(0, idx, vals)          # what this participant contributes
        if self.ctx.rank != leader:
            self.comm.send(leader, "model", [idx.to(torch.int32), vals, buf[n:]], step=tag)
            copy_array_into(buf, self.comm.recv(leader, "model", step=tag)[0])
            return
        for r in sel[1:]:                                  # rank order: the same sum every run
            idx_r, vals_r, tail = got[r]
            add_sparse_array(buf[:n], idx_r, vals_r)
            add_array(buf[n:], tail)
        for r in sel[1:]:
            self.comm.send(r, "model", [buf], step=tag)

    def state_dict(self):
        return {**super().state_dict(), "residual": self.residual.clone(), "topk_fraction": self.topk_fraction}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.residual.copy_(state["residual"])
        self.topk_fraction = float(state["topk_fraction"])
