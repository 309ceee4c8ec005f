"""Bulk synchronous parallel (BSP) SGD: the communication-heavy quality target.

Quagmire (Hsieh et al., ICML 2020) §2.1: "all updates from each P_k are shared among all
data partitions after each training step". Every step the gradients of all K partitions are
averaged with one all-reduce (charged as kind ``gradient`` under the ring cost model), and
every partition applies the same momentum-SGD update, so all partitions hold one identical
model. With equal minibatch sizes this equals single-process SGD on the union of the K
minibatches (tests/test_bsp.py checks it).

``--compress powersgd|qsgd|int8|int4`` replaces the all-reduce by the compressed exchange of
geodml.algorithms.compressed (every partition still applies the same decoded mean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams
from geodml.algorithms.compressed import Compressor
from geodml.algorithms.knob import KnobSpec

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig


class BSP(Algorithm):
    name = "bsp"
    KNOB: ClassVar[KnobSpec | None] = None  # no communication knob

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> BSP:
        a = cfg.compression
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx, compress=a.compress,
                   compress_rank=a.compress_rank, compress_levels=a.compress_levels)

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext, compress: str = "none",
                 compress_rank: int = 1, compress_levels: int = 16) -> None:
        super().__init__(flat=flat, comm=comm, momentum=momentum, ctx=ctx)
        self.compressor = None if compress == "none" else Compressor(
            compress, flat=flat, comm=comm, ctx=ctx, rank=compress_rank, levels=compress_levels)

    def before_step(self, step: int, lr: float) -> None:
        if self.compressor is None:
            self.comm.all_reduce(self.flat.grad, "gradient", average=True)
        else:
            self.compressor.mean(self.flat.grad)

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        return out if self.compressor is None else {**out, "compress": self.compressor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.compressor is not None:
            self.compressor.load_state_dict(state["compress"])
