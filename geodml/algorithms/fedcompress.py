"""FedAvg with a compressed upload (``--algo fedavg --compress powersgd|qsgd|int8|int4``): a variant that
overrides one hook, ``sum_contributions``, and sends the contribution p_k (w_t - w^k) through
geodml.algorithms.compressed (its docstring says what goes on the wire). With ``--compress none`` the
variant is not built; tests/test_compress.py checks that a lossless setting gives FedAvg's model."""

from __future__ import annotations

from typing import Any

import torch

from geodml.algorithms.compressed import Compressor
from geodml.algorithms.fedavg import FedAvg


class CompressedUpload(FedAvg):
    """FedAvg whose participants upload compressed contributions (module docstring)."""

    name = "compressed"

    def __init__(self, *, compress: str, compress_rank: int = 1, compress_levels: int = 16, **kw: Any) -> None:
        flat, ctx = kw["flat"], kw["ctx"]
        nbuf = sum(b.numel() for b in flat.float_buffers)
        self.compressor = Compressor(compress, flat=flat, comm=kw["comm"], ctx=ctx, rank=compress_rank,
                                     levels=compress_levels, message="model", extra=nbuf + self.wire_extra)
        super().__init__(**kw)

    def sum_contributions(self, buf: torch.Tensor, sel: tuple[int, ...], p: float) -> None:
        if len(sel) == 1:
            self.write_contribution(buf, p)
            return
        if self.compressor.codec is None:                 # PowerSGD: every partition (RunConfig checks C = 1)
            self.write_contribution(buf, p)
            self.compressor.sum_all_reduce(buf)
            return
        self.compressor.sum_star(buf, sel, 2 * self.round, lambda wire: self.write_contribution(wire, p))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "compress": self.compressor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.compressor.load_state_dict(state["compress"])


__all__ = ["CompressedUpload"]
