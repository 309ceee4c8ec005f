"""Local training: every partition trains alone with vanilla momentum SGD, no communication.

The zero-communication end of the Quagmire trade-off, and the compute-only baseline of the
per-step overhead benchmark. The global model is the average of the partitions' weights.
"""

from __future__ import annotations

from geodml.algorithms.base import Algorithm


class Local(Algorithm):
    name = "local"

    @property
    def models_agree(self) -> bool:
        return self.ctx.world_size == 1
