"""DistComm: the Comm of one partition per process (docs/design.md "Comm"; contract: geodml.comm.api).

Dense collectives run over the default torch.distributed process group; point-to-point messages
go through the ZeroMQ peer transport (geodml.comm.transport). What every call charges and how
it moves the emulated clock is geodml.comm.charged, the same for every Comm.

Devices: the process group's collectives take tensors on one device (``device``: the rank's
GPU under NCCL, the CPU under gloo). A tensor elsewhere (a CPU counter under NCCL, a model on a
shared GPU under gloo) is copied to that device, reduced there, and copied back, through a
staging buffer kept per (shape, dtype): results and charges are the same, only a host<->device
copy is added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from geodml.comm.api import CommError
from geodml.comm.charged import ChargedComm
from geodml.comm.pacing import Target
from geodml.comm.topology import Topology
from geodml.comm.transport import PeerTransport
from geodml.comm.wire import Incoming, Outgoing

_T = TypeVar("_T")


class Staging:
    """In-place collectives over the default process group for tensors on any device (module
    docstring, Devices): a tensor on ``device`` goes as it is, one elsewhere through a buffer on
    ``device`` kept per (shape, dtype). Shared by DistComm and geodml.comm.crossproc; used by one
    thread at a time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[tuple, torch.Tensor] = {}

    def run(self, tensor: torch.Tensor, op: Callable[[torch.Tensor], object]) -> None:
        """``op`` (an in-place collective) on ``tensor``, staged when it is not on ``device``."""
        if tensor.device == self.device:
            op(tensor)
            return
        buf = self.buffer(tensor, tensor.dtype)
        buf.copy_(tensor)
        op(buf)
        tensor.copy_(buf)

    def buffer(self, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The staging buffer of ``like``'s shape in ``dtype`` on ``device`` (contents undefined)."""
        key = (tuple(like.shape), dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = torch.empty(like.shape, dtype=dtype, device=self.device)
        return buf


class DistComm(ChargedComm):
    """A :class:`geodml.comm.api.RunComm` over torch.distributed and ZeroMQ.

    Build it with :func:`geodml.comm.build_comm` after the default process group exists.
    ``DistComm(rank=, world_size=, region_of_rank=)`` alone gives collectives with ``--wan off``
    accounting and no point-to-point transport. A DistComm is used from one thread.

    Errors: bad arguments (unknown kind, invalid rank) raise ``ValueError``; a peer that does
    not answer within ``timeout_s`` raises :class:`geodml.comm.CommTimeoutError` naming it; a
    point-to-point call without a transport or after :meth:`close` raises ``CommError``.
    """

    def __init__(self, *, rank: int, world_size: int, region_of_rank: Sequence[str],
                 topology: Topology | None = None, wan: str = "off", wan_scale: float = 1.0,
                 transport: PeerTransport | None = None, timeout_s: float = 60.0,
                 device: torch.device | str | None = None) -> None:
        if wan == "real" and topology is not None and transport is not None and transport.pacer is None:
            raise ValueError("--wan real needs a paced transport (PeerTransport(..., paced=True))")
        super().__init__(rank=rank, world_size=world_size, region_of_rank=region_of_rank, topology=topology,
                         wan=wan, wan_scale=wan_scale, timeout_s=timeout_s)
        self._transport = transport
        self.device = torch.device(device if device is not None else "cpu")
        """Where the process group's collectives take tensors (others are staged through it)."""
        self._staging = Staging(self.device)

    # ---- the parts of the contract that depend on the transport --------------------------------
    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the tensors of every ``send(..., wait=False)`` so far may be overwritten."""
        if self._transport is not None and not self._closed:
            self._transport.flush(timeout_s)

    def wire_rejected(self) -> dict[str, int]:
        """Received ZeroMQ messages this rank dropped, by reason (geodml.comm.wire.REJECT_REASONS);
        empty without a peer transport. Read by the Prometheus exporter from its own thread."""
        return dict(self._transport.rejected) if self._transport is not None else {}

    def meta_all_gather_object(self, obj: _T) -> list[_T]:
        """Gather a picklable object from every rank (never charged)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Release sockets and threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # ---- data movement -----------------------------------------------------------------------
    def _reduce(self, tensor: torch.Tensor) -> None:
        if tensor.is_floating_point() and tensor.dtype != torch.float64:
            # Accumulate in float64 and round once, as the in-process group does (geodml.comm.crossproc,
            # Exactness): the sum then does not depend on gloo's/NCCL's reduction order.
            buf = self._staging.buffer(tensor, torch.float64)
            buf.copy_(tensor)
            dist.all_reduce(buf)
            tensor.copy_(buf)
            return
        self._staging.run(tensor, dist.all_reduce)

    def _bcast(self, tensor: torch.Tensor, src: int) -> None:
        self._staging.run(tensor, lambda t: dist.broadcast(t, src))

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        k = self.world_size
        out = [torch.empty_like(tensor) for _ in range(k)]
        src = tensor.contiguous()
        if src.device == self.device:
            dist.all_gather(out, src)
            return out
        staged_out = [torch.empty_like(tensor, device=self.device) for _ in range(k)]
        dist.all_gather(staged_out, src.to(self.device))
        for o, so in zip(out, staged_out):
            o.copy_(so)
        return out

    def _max_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def _describe(self, kind: str, step: int, arrays: list[np.ndarray]) -> Outgoing:
        return self._need_transport().prepare(kind, step, arrays)

    def _hand_over(self, out: Outgoing, targets: list[Target], wait: bool) -> None:
        self._need_transport().send(out, targets, wait=wait)

    def _take(self, src: int, kind: str, step: int, timeout_s: float | None) -> Incoming:
        return self._need_transport().recv(src, kind, step, timeout_s)

    def _take_from(self, srcs: list[int], kind: str, step: int, timeout_s: float | None) -> dict[int, Incoming]:
        return self._need_transport().recv_many(srcs, kind, step, timeout_s)

    # ---- internals ---------------------------------------------------------------------------
    def _need_transport(self) -> PeerTransport:
        self._check_closed()
        if self._transport is None:
            raise CommError("this Comm has no peer transport; build it with geodml.comm.build_comm")
        return self._transport
