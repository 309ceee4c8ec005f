"""HierFAVG: hierarchical federated averaging (Liu, Zhang, Song & Letaief, "Client-Edge-Cloud Hierarchical
Federated Learning", IEEE ICC 2020, Algorithm 1), written on geodml's public algorithm API as a FedAvg
subclass: ``--algo hierfavg``.

The topology's regions are the paper's edge servers and its partitions the clients of each edge;
the cloud is the region of rank 0. With kappa_1 = ``--edge-every`` and kappa_2 = ``--cloud-every``::

    every step k:          w_i <- w_i + u_i,  u_i <- m u_i - lr g_i           (FedAvg's local step)
    k | kappa_1:           w^l = sum_{i in C^l} (|D_i| / |D^l|) w_i           (edge aggregation)
                           w_i <- w^l for i in C^l  (unless k | kappa_1 kappa_2)
    k | kappa_1 kappa_2:   w = sum_l (|D^l| / |D|) w^l;  w_i <- w for every i  (cloud aggregation)

A cloud round is FedAvg's round of Iter_Local = kappa_1 kappa_2 steps; in it, every kappa_1 steps
but the last, each region averages its partitions' models. Both averages are taken, as FedAvg's,
on the change from the round's starting global model w_t: w^l = w_t - sum_{i in C^l} p_i^l (w_t - w_i).
At the cloud step the edge average is folded into the cloud's (Algorithm 1 computes w^l there and
averages those at once): each region sums its partitions' contributions (|D_i| / |D|)(w_t - w_i)
at its edge, the lowest rank of the region, over the LAN; each edge sends its region's sum to the
cloud (rank 0) over the WAN; the cloud adds them in region order (its own first, then the others
by their edge's rank) and sends the total back down the same way. Every partition ends with the
same bits. Float BatchNorm buffers are averaged with the weights, at both levels.

Where the paper is silent: the local solver is FedAvg's (Quagmire Appendix A's momentum SGD, its
momentum kept per partition across rounds, as FedAvg's); the paper's is plain SGD (``--momentum 0``).
Client sampling and ``--local-epochs`` are refused (the paper has neither).

Bytes (kind ``model``): an edge aggregation sends 2 (|C^l| - 1) models inside each region (LAN); a
cloud aggregation adds 2 (L - 1) models between the L edges and the cloud (WAN). With one region it
is FedAvg with Iter_Local = kappa_1 on the LAN (tests/test_hierfavg.py); with kappa_2 = 1, FedAvg
with Iter_Local = kappa_1 whose average runs through the regions' edges. SkewScout's knob is
kappa_2, which alone sets the WAN traffic.

Defaults: kappa_1 = 15, kappa_2 = 4, one of the paper's MNIST settings (kappa_1 kappa_2 = 60).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from geodml.algorithm import (
    AlgoContext,
    Comm,
    FedAvg,
    FlatParams,
    KnobSpec,
    RunConfig,
    add_array,
    copy_array_into,
    fedavg_arguments,
    opt,
    require,
    unpack_from,
)


def _positive_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


class HierFAVG(FedAvg):
    """HierFAVG on partition i (module docstring)."""

    name = "hierfavg"

    @dataclass(kw_only=True)
    class Config:
        edge_every: int = opt(15, metavar="K1", help="local steps between the averages inside a region "
                              "(the paper's kappa_1)")
        cloud_every: int = opt(4, metavar="K2", help="regional averages between the averages across regions "
                               "(the paper's kappa_2; the WAN traffic)")

        def __post_init__(self) -> None:
            require(_positive_int(self.edge_every), f"--edge-every must be an integer >= 1, got {self.edge_every!r}")
            require(_positive_int(self.cloud_every), f"--cloud-every must be an integer >= 1, got {self.cloud_every!r}")

        @property
        def iter_local(self) -> int:
            """FedAvg's Iter_Local of this run (a cloud round; --rounds counts them): kappa_1 kappa_2."""
            return self.edge_every * self.cloud_every

    KNOB: ClassVar[KnobSpec] = KnobSpec("cloud_every", (1.0, 2.0, 4.0, 10.0, 20.0, 50.0))
    """SkewScout's knob: kappa_2, most WAN traffic first."""

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        """What the options cannot say alone (one ``geodml: error:`` line before any process starts)."""
        require(cfg.fedavg.client_fraction == 1.0, "--client-fraction: HierFAVG averages every partition of every "
                "region (Liu et al. sample no clients); leave --client-fraction out")
        require(cfg.fedavg.local_epochs == 0, "--local-epochs: HierFAVG's rounds are --edge-every local steps; "
                "leave --local-epochs out")

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> HierFAVG:
        c = cfg.plugin
        return cls(edge_every=c.edge_every, cloud_every=c.cloud_every,
                   **fedavg_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    def __init__(self, *, edge_every: int = 15, cloud_every: int = 4, **fedavg: Any) -> None:
        """``fedavg``: FedAvg's constructor arguments (geodml.algorithm.fedavg_arguments); its ``iter_local``
        is replaced by ``edge_every * cloud_every``."""
        comm, ctx = fedavg["comm"], fedavg["ctx"]
        self.edge_every, self.cloud_every = int(edge_every), int(cloud_every)
        fedavg["iter_local"] = self.edge_every * self.cloud_every

        def edges() -> tuple[tuple[int, ...], ...]:
            by_region: dict[str, list[int]] = {}
            for r, region in enumerate(comm.region_of_rank):
                by_region.setdefault(region, []).append(r)
            return tuple(sorted(tuple(m) for m in by_region.values()))   # by their edge's (lowest) rank

        self.regions: tuple[tuple[int, ...], ...] = ctx.shared.object("hierfavg.regions", edges)
        self.members = next(m for m in self.regions if ctx.rank in m)      # this partition's region, C^l
        self.edges = tuple(m[0] for m in self.regions)                     # the edge of each region
        self.edge_rounds = 0
        super().__init__(**fedavg)
        size_l = float(self.sizes[list(self.members)].sum())
        self.p_edge = float(self.sizes[ctx.rank]) / size_l                 # |D_i| / |D^l|

    # ---- the knob: kappa_2 -----------------------------------------------------------------------
    def knob_spec(self) -> KnobSpec:
        return self.KNOB

    def knob_value(self) -> float:
        return float(self.cloud_every)

    def apply_knob(self, value: float) -> None:
        self.cloud_every = int(value)
        self.iter_local = self.edge_every * self.cloud_every

    # ---- the edge aggregation --------------------------------------------------------------------
    def after_step(self, step: int, lr: float) -> None:
        done = self.steps_in_round + 1
        if done % self.edge_every == 0 and done != self.round_len:
            self.edge_average(step)
        super().after_step(step, lr)

    def edge_average(self, step: int) -> None:
        """w_i <- w^l over this partition's region: a star through the region's edge (its lowest rank),
        which receives first and only then writes its own contribution (the wire is scratch)."""
        members = self.members
        if len(members) == 1:
            self.edge_rounds += 1
            return
        buf, tag, edge = self.wire, -(step + 1), members[0]
        if self.ctx.rank != edge:
            self.write_contribution(buf, self.p_edge)
            self.comm.send(edge, "model", [buf], step=tag)
            copy_array_into(buf, self.comm.recv(edge, "model", step=tag)[0])
        else:
            got = self.comm.recv_from(members[1:], "model", step=tag)
            self.write_contribution(buf, self.p_edge)
            for r in members[1:]:
                add_array(buf, got[r][0])
            for r in members[1:]:
                self.comm.send(r, "model", [buf], step=tag)
        n = self.flat.numel
        torch.sub(self.global_w, buf[:n], out=self.flat.data)             # w^l = w_t - sum p_i^l (w_t - w_i)
        unpack_from(buf[n:n + self.nbuf], self.flat.float_buffers)
        self.edge_rounds += 1

    # ---- the cloud aggregation: FedAvg's exchange hook, through the edges -----------------------------
    def sum_contributions(self, buf: torch.Tensor, sel: tuple[int, ...], p: float) -> None:
        """sum_i p_i (w_t - w_i) over every partition, summed per region at its edge (LAN), then across
        the edges at the cloud, rank 0 (WAN), and sent back down (module docstring)."""
        members, rank, tag = self.members, self.ctx.rank, 2 * self.round
        edge, cloud = members[0], self.edges[0]
        if rank != edge:
            self.write_contribution(buf, p)
            self.comm.send(edge, "model", [buf], step=tag)
            copy_array_into(buf, self.comm.recv(edge, "model", step=tag)[0])
            return
        others = self.edges[1:] if rank == cloud else ()
        got = self.comm.recv_from(members[1:] + others, "model", step=tag)   # one wait: the wire is scratch
        self.write_contribution(buf, p)
        for r in members[1:]:
            add_array(buf, got[r][0])                                        # this region's sum
        if rank == cloud:
            for r in others:
                add_array(buf, got[r][0])                                    # + the other regions', by edge
            for r in others:
                self.comm.send(r, "model", [buf], step=tag)
        else:
            self.comm.send(cloud, "model", [buf], step=tag)
            copy_array_into(buf, self.comm.recv(cloud, "model", step=tag)[0])
        for r in members[1:]:
            self.comm.send(r, "model", [buf], step=tag)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "hierfavg_edge_rounds": float(self.edge_rounds),
                "hierfavg_cloud_every": float(self.cloud_every)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "hierfavg": {"edge_rounds": self.edge_rounds, "cloud_every": self.cloud_every}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cloud_every = int(state["hierfavg"]["cloud_every"])
        super().load_state_dict(state)
        self.edge_rounds = int(state["hierfavg"]["edge_rounds"])


__all__ = ["HierFAVG"]
