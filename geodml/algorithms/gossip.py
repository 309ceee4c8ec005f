"""Gossip: decentralized SGD over a peer graph, D-PSGD (Lian, Zhang, Zhang, Hsieh, Zhang & Liu, "Can
Decentralized Algorithms Outperform Centralized Algorithms? A Case Study for Decentralized Parallel
Stochastic Gradient Descent", NeurIPS 2017, Algorithm 1), with local steps between mixings (Koloskova,
Loizou, Boreiri, Jaggi & Stich, "A Unified Theory of Decentralized SGD with Changing Topology and Local
Updates", ICML 2020, Algorithm 1 with tau local steps): ``--algo gossip``.

No partition holds a global model. Every partition i keeps its own x_i and takes geodml's local
step (Quagmire Appendix A's momentum SGD: u <- m u - lr g; x <- x + u). Every ``--gossip-every p``
steps it mixes its model with its neighbours' in the peer graph ``--graph`` (geodml.algorithms.graphs,
Metropolis-Hastings weights W)::

    x_i <- sum_{j in N(i) + i} W_ij x_j

``--gossip-mix before`` (the default) is Lian et al.'s order: the mixing takes the models the step's
gradients were computed at, x_{k+1,i} = sum_j W_ij x_{k,j} + u_{k+1,i} (with ``--momentum 0``
exactly Algorithm 1's x_{k+1,i} = sum_j W_ij x_{k,j} - lr g_i(x_{k,i})). ``after`` is Koloskova et
al.'s: the local step first, then the mixing of the updated models, x_{k+1} = W (x_k + u_{k+1}); with
period p and the complete graph (W = 1/K) that is FedAvg with Iter_Local = p (tests/test_gossip.py).
Where neither paper says: momentum is local to each partition and never mixed (the decentralized
momentum SGD of Lin et al. 2021's baseline), and float BatchNorm buffers are mixed with the weights.

Every sum runs over N(i) + i in rank order, so partitions that mix the same models with the same
weights (the complete graph) hold the same bits.

Bytes: at every mixing each partition sends its model (weights and float buffers, float32) to each
neighbour, point to point over the link between their regions (kind ``model``), and receives one
from each: 2 |E| model messages per mixing. SkewScout's knob is the period p (1 sends most).

What is validated: the models averaged (the trainer's average of the partitions' weights, uncharged
bookkeeping), as D-PSGD's analysis and experiments report the average x-bar; each partition's own
model is scored at the end too (``--partition-scores``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from geodml.algorithm import (
    AlgoContext,
    Algorithm,
    Comm,
    FlatParams,
    KnobSpec,
    RunConfig,
    copy_array_into,
    opt,
    pack_into,
    require,
    unpack_from,
)
from geodml.algorithms.graphs import GRAPHS, build_graph, is_connected, metropolis_hastings, torus_shape

MIX_ORDERS = ("before", "after")


class Gossip(Algorithm):
    """Gossip / D-PSGD on partition i (module docstring)."""

    name = "gossip"

    @dataclass(kw_only=True)
    class Config:
        graph: str = opt("ring", choices=GRAPHS, help="the peer graph: ring, torus (r x c grid), exponential "
                         "(i +- 2^j), complete, or topology (same region, or regions the topology file links)")
        gossip_every: int = opt(1, metavar="P", help="mix with the neighbours every P steps (1: D-PSGD)")
        gossip_mix: str = opt("before", choices=MIX_ORDERS, help="before: mix the models the step's gradients were "
                              "taken at (Lian et al. 2017); after: take the step, then mix (Koloskova et al. 2020)")

        def __post_init__(self) -> None:
            require(self.graph in GRAPHS, f"--graph: choose one of {', '.join(GRAPHS)}, got {self.graph!r}")
            require(isinstance(self.gossip_every, int) and not isinstance(self.gossip_every, bool)
                    and self.gossip_every >= 1, f"--gossip-every must be an integer >= 1, got {self.gossip_every!r}")
            require(self.gossip_mix in MIX_ORDERS,
                    f"--gossip-mix: choose one of {', '.join(MIX_ORDERS)}, got {self.gossip_mix!r}")

    KNOB: ClassVar[KnobSpec] = KnobSpec("gossip_every", (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0))
    """SkewScout's knob: the mixing period, most communication first."""

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        """A torus needs a grid of the partitions (one error line before any process starts)."""
        if cfg.plugin.graph == "torus" and cfg.partitions:
            torus_shape(cfg.partitions)

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Gossip:
        c = cfg.plugin
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx, graph=c.graph,
                   gossip_every=c.gossip_every, gossip_mix=c.gossip_mix)

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext, graph: str = "ring",
                 gossip_every: int = 1, gossip_mix: str = "before") -> None:
        super().__init__(flat=flat, comm=comm, momentum=momentum, ctx=ctx)
        self.graph_kind, self.gossip_every, self.gossip_mix = graph, int(gossip_every), gossip_mix

        def weights() -> list[dict[int, float]]:
            topo = comm.topology
            g = build_graph(graph, ctx.world_size, regions=comm.region_of_rank,
                            links=None if topo is None else topo.links)
            if ctx.world_size > 1 and not is_connected(g):
                raise ValueError(f"--graph {graph}: the peer graph of the {ctx.world_size} partitions is not "
                                 "connected, so their models never meet; choose another --graph or --topology")
            return metropolis_hastings(g)

        self.row: dict[int, float] = ctx.shared.object(f"gossip.weights.{graph}", weights)[ctx.rank]
        self.neighbours = tuple(sorted(j for j in self.row if j != ctx.rank))
        self.order = tuple(sorted(self.row))                 # N(i) + i, in rank order: the sum's order
        self.tensors = [flat.data, *flat.float_buffers]
        numel = sum(t.numel() for t in self.tensors)
        self._wire = ctx.shared.scratch("gossip.wire", numel, flat.data.dtype, flat.data.device)
        self._mixed = ctx.shared.scratch("gossip.mixed", numel, flat.data.dtype, flat.data.device)
        self.mixings = 0
        self._stepped = False          # this step's local update was taken in before_step
        self.knob = self.KNOB.bind(get=lambda: float(self.gossip_every), set=self._set_period)

    def _set_period(self, value: float) -> None:
        if value is None or int(value) != value or value < 1:
            raise ValueError(f"gossip: gossip_every must be an integer >= 1, got {value!r}")
        self.gossip_every = int(value)

    def knob_spec(self) -> KnobSpec:
        return self.KNOB

    def _mixes_at(self, step: int) -> bool:
        return (step + 1) % self.gossip_every == 0

    def before_step(self, step: int, lr: float) -> None:
        """``before``: x <- sum_j W_ij x_j + u_new. The momentum step is taken first, u <- m u - lr g, because
        the gradient buffer is the process's (geodml.engine.worker): it must be consumed before the wait
        on the neighbours; x is then mixed and moved by u (local_update does nothing at this step)."""
        if self.gossip_mix == "before" and self._mixes_at(step):
            self.u.mul_(self.momentum).add_(self.flat.grad, alpha=-lr)
            self.mix(step)
            self.flat.data.add_(self.u)
            self._stepped = True

    def local_update(self, step: int, lr: float) -> None:
        if self._stepped:
            self._stepped = False
            return
        super().local_update(step, lr)

    def after_step(self, step: int, lr: float) -> None:
        if self.gossip_mix == "after" and self._mixes_at(step):
            self.mix(step)

    def mix(self, step: int) -> None:
        """x_i <- sum_{j in N(i) + i} W_ij x_j: send this model to every neighbour, receive theirs (one wait),
        then sum in rank order (the scratch buffers are written only after the wait)."""
        if not self.neighbours:
            return
        wire, mixed = self._wire, self._mixed
        pack_into(self.tensors, wire)
        for j in self.neighbours:
            self.comm.send(j, "model", [wire], step=step)
        got = self.comm.recv_from(self.neighbours, "model", step=step)
        mixed.zero_()
        for j in self.order:
            if j == self.ctx.rank:
                pack_into(self.tensors, wire)
            else:
                copy_array_into(wire, got[j][0])
            mixed.add_(wire, alpha=self.row[j])
        unpack_from(mixed, self.tensors)
        self.mixings += 1

    @property
    def models_agree(self) -> bool:
        return self.ctx.world_size == 1

    def stats(self) -> dict[str, float]:
        return {"gossip_mixings": float(self.mixings), "gossip_every": float(self.gossip_every)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gossip": {"mixings": self.mixings, "every": self.gossip_every}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.mixings = int(state["gossip"]["mixings"])
        self.gossip_every = int(state["gossip"]["every"])


__all__ = ["MIX_ORDERS", "Gossip"]
