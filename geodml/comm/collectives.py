"""Cost models of the charged collectives (docs/design.md "WAN emulation"): the bytes each rank sends
and how long a collective takes, computed from sizes and the topology alone (no communication).
geodml.comm.charged applies them; both Comms (DistComm, InProcessComm) therefore charge alike.

torch.distributed collectives cannot be shaped, so the bytes each link carries follow a cost
model and are charged to the links that model uses. K = world size, ranks in rank order form
the ring, ``link(r -> s)`` is the topology's link between the two ranks' regions.

* ``all_reduce`` -- ring all-reduce (reduce-scatter then all-gather). The tensor of n
  elements is cut into K chunks (chunk c has n//K elements, plus one if c < n%K). In each of
  the 2(K-1) steps rank r sends one chunk to rank (r+1) mod K: in reduce-scatter step s the
  chunk (r - s) mod K, in all-gather step s the chunk (r + 1 - s) mod K. Each rank therefore
  sends about 2(K-1)/K x size bytes, as 2(K-1) messages, all on its link to its successor.
  Duration: the ring steps are synchronous, so
  ``sum over steps s of max over ranks r of link(r -> r+1).transfer_s(bytes r sends in step s)``.
* ``broadcast`` -- star: the source sends the whole tensor to each other rank (K-1 messages,
  concurrently on independent links). Duration: ``max over d of link(src -> d).transfer_s(size)``.
* ``all_gather`` -- ring: each rank's piece travels K-1 hops; every rank sends K-1 pieces
  (all of the same size) to its successor. Duration:
  ``(K-1) * max over r of link(r -> r+1).transfer_s(piece size)``.

Each rank charges what it sends itself: bytes, messages, and as emulated seconds the sum of
``transfer_s`` of its own messages (0 under ``--wan off``). The duration is computed
identically on every rank, and the clock moves to ``max over ranks of the clock at entry +
duration`` (geodml.comm.pacing).
"""

from __future__ import annotations

from collections.abc import Sequence

from geodml.comm.topology import WanLink


def ring_chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Elements of each of the K ring chunks: n//K, plus one for the first n%K chunks."""
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


def ring_allreduce_sent_total(numel: int, world_size: int, rank: int) -> int:
    """``sum(ring_allreduce_sent_elements(numel, world_size, rank))`` in O(1): the reduce-scatter sends
    every chunk but chunk r+1, the all-gather every chunk but chunk r+2 (indices mod K)."""
    k = world_size
    if k == 1:
        return 0
    base, extra = divmod(numel, k)

    def size(c: int) -> int:
        return base + (1 if c % k < extra else 0)
    return 2 * numel - size(rank + 1) - size(rank + 2)


def ring_allreduce_wan_bytes(numel: int, element_size: int, region_of_rank: Sequence[str]) -> int:
    """WAN bytes all K ranks together send in one ring all-reduce: what each rank sends to its
    ring successor (``ring_allreduce_sent_elements``), counted when the two are in different
    regions. With one region per rank this is 2(K-1) x numel x element_size."""
    k = len(region_of_rank)
    return sum(ring_allreduce_sent_total(numel, k, r) * element_size for r in range(k)
               if region_of_rank[r] != region_of_rank[(r + 1) % k])


def ring_allreduce_duration_s(numel: int, element_size: int, ring_links: Sequence[WanLink]) -> float:
    """Emulated seconds of a ring all-reduce; ``ring_links[r]`` is the link r -> (r+1) mod K."""
    k = len(ring_links)
    if k <= 1:
        return 0.0
    per_rank = [ring_allreduce_sent_elements(numel, k, r) for r in range(k)]
    return sum(max(ring_links[r].transfer_s(per_rank[r][s] * element_size) for r in range(k))
               for s in range(2 * (k - 1)))


def ring_allgather_duration_s(piece_bytes: int, ring_links: Sequence[WanLink]) -> float:
    """Emulated seconds of a ring all-gather of equal pieces; ``ring_links[r]``: r -> (r+1) mod K."""
    k = len(ring_links)
    if k <= 1:
        return 0.0
    return (k - 1) * max(lk.transfer_s(piece_bytes) for lk in ring_links)


def star_broadcast_duration_s(num_bytes: int, links_from_src: Sequence[WanLink]) -> float:
    """Emulated seconds of a star broadcast: the slowest of the source's K-1 links."""
    return max((lk.transfer_s(num_bytes) for lk in links_from_src), default=0.0)
