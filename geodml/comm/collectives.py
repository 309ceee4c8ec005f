"""Dense collectives over torch.distributed that charge the ledger by a documented cost model.

torch.distributed collectives cannot be shaped, so the bytes each link carries follow a
cost model, charged to the links that model uses:

* ``all_reduce`` -- ring all-reduce (reduce-scatter then all-gather). The tensor of n
  elements is cut into K chunks (chunk c has n//K elements, plus one if c < n%K). In each of
  the 2(K-1) steps rank r sends one chunk to rank (r+1) mod K: in reduce-scatter step s the
  chunk (r - s) mod K, in all-gather step s the chunk (r + 1 - s) mod K. Each rank therefore
  sends about 2(K-1)/K * size bytes, all on its link to the next rank in the ring.
* ``broadcast`` -- star: the source sends the whole tensor to each other rank.
* ``all_gather`` -- ring: each rank's piece travels K-1 hops; every rank sends (K-1) pieces
  of its neighbours' size to its successor.

``meta_*`` collectives are the emulator's own bookkeeping (metric averages, evaluation
counts, end-of-run totals); they are not part of the emulated system and are never charged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from geodml.comm.ledger import Ledger


def ring_chunk_sizes(numel: int, world_size: int) -> list[int]:
    base, extra = divmod(numel, world_size)
    return [base + (1 if c < extra else 0) for c in range(world_size)]


def ring_allreduce_sent_elements(numel: int, world_size: int, rank: int) -> list[int]:
    """Elements rank ``rank`` sends to its ring successor in each of the 2(K-1) steps."""
    k = world_size
    if k == 1:
        return []
    sizes = ring_chunk_sizes(numel, k)
    reduce_scatter = [sizes[(rank - s) % k] for s in range(k - 1)]
    all_gather = [sizes[(rank + 1 - s) % k] for s in range(k - 1)]
    return reduce_scatter + all_gather


class Comm:
    """What an algorithm may use to talk to other partitions.

    Dense collectives run over the default torch.distributed process group; point-to-point
    sparse messages go through the ZeroMQ transport. Every byte that leaves this rank is
    charged to ``self.ledger`` under a traffic kind (see geodml.comm.ledger.KINDS).
    """

    def __init__(self, *, rank: int, world_size: int, region_of_rank: list[str]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.region_of_rank = list(region_of_rank)
        self.ledger = Ledger(rank, self.region_of_rank)

    # ---- charged collectives -------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, kind: str, *, average: bool = False) -> None:
        """In-place sum (or mean) over all ranks, charged as a ring all-reduce."""
        k = self.world_size
        if k > 1:
            sent = ring_allreduce_sent_elements(tensor.numel(), k, self.rank)
            self.ledger.charge((self.rank + 1) % k, kind, sum(sent) * tensor.element_size(), messages=len(sent))
            dist.all_reduce(tensor)
        if average:
            tensor.div_(k)

    # ---- uncharged bookkeeping -----------------------------------------------------------
    def meta_all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum over ranks for the emulator's own bookkeeping (never charged)."""
        if self.world_size > 1:
            dist.all_reduce(tensor)

    def meta_all_gather_object(self, obj: object) -> list[object]:
        """Gather a picklable object from every rank (never charged)."""
        if self.world_size == 1:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Release sockets and threads (idempotent)."""
