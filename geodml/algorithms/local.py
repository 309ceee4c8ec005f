"""Local training: every partition trains alone with vanilla momentum SGD, no communication.

The zero-communication end of the Quagmire trade-off, and the compute-only baseline of the
per-step overhead benchmark. The global model is the average of the partitions' weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams
from geodml.algorithms.knob import KnobSpec

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig


class Local(Algorithm):
    name = "local"
    KNOB: ClassVar[KnobSpec | None] = None  # no communication knob

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Local:
        return cls(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx)

    @property
    def models_agree(self) -> bool:
        return self.ctx.world_size == 1
