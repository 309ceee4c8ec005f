"""Communication layer: the only way an algorithm talks to other partitions (docs/design.md "Comm").

* geodml.comm.api -- the contract: :class:`Comm` (what an algorithm may use), :class:`RunComm`
  (what the run may use besides), :class:`CommError`, :class:`CommTimeoutError`.
* geodml.comm.charged -- the contract implemented once: argument checks, charges, clock.
* :class:`DistComm` (geodml.comm.dist) -- one partition per process: torch.distributed + ZeroMQ;
  :func:`build_comm` is the factory the run uses, after the default process group exists.
* :class:`InProcessComm` (geodml.comm.inprocess) -- several partitions of one process, one thread
  each (an :class:`InProcessGroup` builds them); charges exactly what DistComm charges.
* geodml.comm.collectives -- the collectives' cost models; geodml.comm.ledger -- byte accounting
  per (src region, dst region, kind).
* geodml.comm.topology -- topologies, the link model, placement; geodml.comm.pacing -- the
  emulated clock, link FIFOs and ``--wan real`` pacing.
* geodml.comm.wire -- the message format and its checks; geodml.comm.transport -- the ZeroMQ
  peer transport (sockets, addresses, zero-copy frames).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geodml.comm.api import Comm, CommError, CommTimeoutError, RunComm
from geodml.comm.dist import DistComm
from geodml.comm.inprocess import InProcessComm, InProcessGroup
from geodml.comm.ledger import KINDS, Ledger
from geodml.comm.topology import Topology, TopologyError, WanLink, default_topology, load_topology
from geodml.comm.transport import PeerTransport
from geodml.config import WAN_MODES

if TYPE_CHECKING:
    import torch

    from geodml.config import CommConfig
    from geodml.engine.hub import Hub

    def _both_comms_implement_the_contract(dist_comm: DistComm, in_process: InProcessComm) -> tuple[RunComm, RunComm]:
        """Never called: mypy checks here that both Comms implement RunComm, signatures included."""
        return dist_comm, in_process

__all__ = ["Comm", "RunComm", "DistComm", "InProcessComm", "InProcessGroup", "Ledger", "KINDS", "WAN_MODES",
           "build_comm", "build_hosted_group",
           "CommError", "CommTimeoutError", "PeerTransport", "Topology", "TopologyError", "WanLink",
           "load_topology", "default_topology"]


def share_wire_secret(rank: int) -> bytes:
    """The run's 32-byte wire secret: drawn by rank 0 and broadcast over the default process group
    (collective: every rank calls it). Not through the store, which torchrun --standalone binds on
    every interface and which anyone who reaches it can read (docs/reliability.md)."""
    import secrets

    import torch.distributed as dist

    box: list[bytes | None] = [secrets.token_bytes(32) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    secret = box[0]
    assert isinstance(secret, bytes) and len(secret) == 32
    return secret


def _peer_transport(cfg: CommConfig, *, rank: int, world_size: int, names: list[str]) -> PeerTransport:
    """This process's ZeroMQ transport among ``world_size`` processes (collective: binds, exchanges
    addresses through the default store, shares the wire secret); ``names`` describe the peers."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("the Comm needs the default torch.distributed process group; initialise it first")
    return PeerTransport(rank=rank, world_size=world_size, store=dist.distributed_c10d._get_default_store(),
                         bind_host=cfg.bind_host, timeout_s=cfg.timeout_s, region_of_rank=names,
                         paced=cfg.wan == "real", wire_auth=cfg.wire_auth,
                         max_message_bytes=int(cfg.max_message_mb * 1024 * 1024),
                         secret=share_wire_secret(rank) if cfg.wire_auth == "on" else None)


def build_comm(cfg: CommConfig, *, rank: int, world_size: int, device: torch.device | str | None = None,
               topology: Topology | None = None) -> DistComm:
    """The DistComm of this rank, on every rank (collective: all ranks must call it, in the same order).

    Loads ``cfg.topology`` (unless ``topology``, already loaded from it, is given) and places the
    ranks (``TopologyError`` if it cannot), then, when there is more than one rank, binds this
    rank's ZeroMQ socket (``cfg.bind_host`` or :func:`geodml.comm.transport.default_bind_host`) and
    exchanges every rank's address through the default torch.distributed store. ``cfg.wan``
    selects off/virtual/real, ``cfg.wan_scale`` scales every bandwidth, ``cfg.timeout_s`` bounds
    every wait on a peer. ``device`` is where the process group's collectives take tensors
    (:func:`geodml.runtime.collective_device`; default the CPU); tensors elsewhere are staged
    through it. Close it with :meth:`DistComm.close` (idempotent) before the process group is
    destroyed.
    """
    if topology is None:
        topology = load_topology(cfg.topology)
    regions = topology.placement(world_size)
    transport = _peer_transport(cfg, rank=rank, world_size=world_size, names=regions) if world_size > 1 else None
    try:
        return DistComm(rank=rank, world_size=world_size, region_of_rank=regions, topology=topology, wan=cfg.wan,
                        wan_scale=cfg.wan_scale, transport=transport, timeout_s=cfg.timeout_s, device=device)
    except BaseException:
        if transport is not None:
            transport.close()
        raise


def build_hosted_group(cfg: CommConfig, *, partitions: int, process: int, processes: int,
                       topology: Topology | None = None, device: torch.device | None = None,
                       hub: Hub | None = None) -> InProcessGroup:
    """This process's :class:`InProcessGroup` when P ``partitions`` run on ``processes`` processes
    (geodml.comm.crossproc): it hosts block ``process`` of the partitions. With more than one
    process this is collective over the default process group (every process calls it): it binds
    the process's ZeroMQ socket and exchanges addresses as :func:`build_comm` does, with ranks =
    processes. ``device``: where the process group's collectives take tensors (the CPU unless it
    is NCCL; geodml.runtime.collective_device); ``hub``: the engine's scheduler whose tasks the
    hosted partitions are (geodml.engine.hub). Close the group (it closes the transport) before
    the process group is destroyed."""
    from geodml.comm.crossproc import CrossProcess, blocks

    cross = None
    if processes > 1:
        names = [f"partitions {b.start}-{b.stop - 1}" for b in blocks(partitions, processes)]
        cross = CrossProcess(process=process, processes=processes, partitions=partitions, device=device,
                             transport=_peer_transport(cfg, rank=process, world_size=processes, names=names))
    try:
        return InProcessGroup.from_config(cfg, partitions, topology=topology, cross=cross, hub=hub)
    except BaseException:
        if cross is not None:
            cross.close()
        raise
