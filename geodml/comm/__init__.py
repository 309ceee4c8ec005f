"""Communication layer: the only way an algorithm talks to other partitions (DESIGN.md "Comm").

* :func:`build_comm` -- the factory the run uses, after the default process group exists.
* :class:`Comm` (geodml.comm.collectives) -- collectives, point-to-point, clock, ledger.
* geodml.comm.wan -- topologies, the link model, pacing and the emulated clock semantics.
* geodml.comm.transport -- the ZeroMQ peer transport (sockets, envelopes, zero-copy frames).
* geodml.comm.ledger -- byte accounting per (src region, dst region, kind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geodml.comm.collectives import WAN_MODES, Comm
from geodml.comm.ledger import KINDS, Ledger
from geodml.comm.transport import CommError, CommTimeoutError, PeerTransport
from geodml.comm.wan import Topology, TopologyError, WanLink, default_topology, load_topology

if TYPE_CHECKING:
    from geodml.config import CommConfig

__all__ = ["Comm", "Ledger", "KINDS", "WAN_MODES", "build_comm", "CommError", "CommTimeoutError", "PeerTransport", "Topology",
           "TopologyError", "WanLink", "load_topology", "default_topology"]


def build_comm(cfg: CommConfig, *, rank: int, world_size: int, device=None) -> Comm:
    """The Comm of this rank, on every rank (collective: all ranks must call it, in the same order).

    Loads ``cfg.topology`` and places the ranks (``TopologyError`` if it cannot), then, when
    there is more than one rank, binds this rank's ZeroMQ socket (``cfg.bind_host`` or
    :func:`geodml.comm.transport.default_bind_host`) and exchanges every rank's address through
    the default torch.distributed store. ``cfg.wan`` selects off/virtual/real, ``cfg.wan_scale``
    scales every bandwidth, ``cfg.timeout_s`` bounds every wait on a peer. ``device`` is where the
    process group's collectives take tensors (:func:`geodml.runtime.collective_device`; default
    the CPU); tensors elsewhere are staged through it. Close it with
    :meth:`Comm.close` (idempotent) before the process group is destroyed.
    """
    import torch.distributed as dist

    topology = load_topology(cfg.topology)
    regions = topology.placement(world_size)
    transport = None
    if world_size > 1:
        if not dist.is_initialized():
            raise RuntimeError("build_comm needs the default torch.distributed process group; initialise it first")
        store = dist.distributed_c10d._get_default_store()
        transport = PeerTransport(rank=rank, world_size=world_size, store=store, bind_host=cfg.bind_host,
                                  timeout_s=cfg.timeout_s, region_of_rank=regions, paced=cfg.wan == "real",
                                  wire_auth=cfg.wire_auth, max_message_bytes=int(cfg.max_message_mb * 1024 * 1024))
    try:
        return Comm(rank=rank, world_size=world_size, region_of_rank=regions, topology=topology, wan=cfg.wan,
                    wan_scale=cfg.wan_scale, transport=transport, timeout_s=cfg.timeout_s,
                    device=device)
    except BaseException:
        if transport is not None:
            transport.close()
        raise
