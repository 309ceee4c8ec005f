"""Bulk synchronous parallel (BSP) SGD: the communication-heavy quality target.

Quagmire (Hsieh et al., ICML 2020) §2.1: "all updates from each P_k are shared among all
data partitions after each training step". Every step the gradients of all K partitions are
averaged with one all-reduce (charged as kind ``gradient`` under the ring cost model), and
every partition applies the same momentum-SGD update, so all partitions hold one identical
model. With equal minibatch sizes this equals single-process SGD on the union of the K
minibatches (tests/test_bsp.py checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams
from geodml.algorithms.knob import KnobSpec

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig


class BSP(Algorithm):
    name = "bsp"
    KNOB: ClassVar[KnobSpec | None] = None  # no communication knob

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> BSP:
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx)

    def before_step(self, step: int, lr: float) -> None:
        self.comm.all_reduce(self.flat.grad, "gradient", average=True)
