"""The process half of a run whose P partitions are spread over R > 1 processes, each hosting a
contiguous block (docs/design.md "Comm"; README "Partitions and processes").

An :class:`geodml.comm.inprocess.InProcessGroup` hosts one process's block; its
:class:`CrossProcess` carries what leaves the process:

* Collectives reduce locally first (the group combines its partitions' tensors) and cross the
  processes once, over the default torch.distributed process group: a sum of partial sums, a
  broadcast from the process that hosts the source partition, an all-gather of the blocks (padded
  to the largest block), a MAX of the clocks, an object all-gather. Charges do not change: each
  partition charges the documented cost model over P partitions (geodml.comm.charged), whatever
  the real traffic between processes is.
* Point-to-point messages to a partition of another process go over one ZeroMQ
  :class:`geodml.comm.transport.PeerTransport` per process (ranks = processes, the same sockets,
  wire checks and ``--wire-auth`` as one partition per process). A message to several partitions
  of one process crosses once: the arrays once, plus a small routing array (float64: source
  partition, then each destination partition and its emulated arrival time), which is the
  emulator's own framing, like the wire trailer, and is not charged. The ledger charges what the
  emulated partition-to-partition message is (geodml.comm.wire.describe with the source
  partition), exactly as in a run with one partition per process. Under ``--wan real`` each
  destination has its own release time, so each goes as its own message.
* A dispatcher thread per process takes messages off the socket (blocking inside ZeroMQ, in
  bounded slices so that :meth:`close` stops it) and puts each into the destination partition's
  mailbox; partition threads send under a lock (ZeroMQ sockets belong to one thread at a time).

Exactness: floating sums accumulate in float64 and round once to the tensor's dtype (the group
and DistComm alike), so a sum does not depend on how the partitions are grouped into processes
unless a float64 partial sum rounds, which needs addends about 2^29 apart in magnitude, and even
then changes the result only when it lands on a rounding boundary of the tensor's dtype.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml.comm.api import CommError
from geodml.comm.dist import Staging
from geodml.comm.pacing import Target
from geodml.comm.wire import Incoming, Outgoing

if TYPE_CHECKING:
    from geodml.comm.transport import PeerTransport

_SLICE_S = 0.2  # the dispatcher's longest blocking receive: how fast close() stops it


def blocks(partitions: int, processes: int) -> list[range]:
    """The contiguous block of partitions each process hosts: sizes differ by at most one, the
    larger blocks first (process r hosts partitions ``r*P//R .. (r+1)*P//R - 1``)."""
    assert 1 <= processes <= partitions, (processes, partitions)
    return [range(r * partitions // processes, (r + 1) * partitions // processes) for r in range(processes)]


def process_of(partitions: int, processes: int) -> list[int]:
    """The process that hosts each partition (:func:`blocks`)."""
    owner = [0] * partitions
    for r, b in enumerate(blocks(partitions, processes)):
        for p in b:
            owner[p] = r
    return owner


class CrossProcess:
    """This process's link to the other processes of the run (module docstring).

    ``transport`` has ranks = processes (None: collectives only). ``deliver(dst, msg)`` puts a
    message for hosted partition ``dst`` into its mailbox; ``fail(err)`` breaks the hosting group
    when the dispatcher fails. Call :meth:`start` once the group exists, :meth:`close` once.
    """

    def __init__(self, *, process: int, processes: int, partitions: int, transport: PeerTransport | None,
                 device: torch.device | None = None) -> None:
        self.process, self.processes, self.partitions = process, processes, partitions
        self.device = device or torch.device("cpu")
        """Where the process group's collectives take tensors: the CPU (gloo), or this process's
        GPU (NCCL). A tensor elsewhere (partitions on a GPU shared over gloo) is staged
        (geodml.comm.dist.Staging)."""
        self._staging = Staging(self.device)
        self.blocks = blocks(partitions, processes)
        self.owner = process_of(partitions, processes)
        self.hosted = self.blocks[process]
        self._transport = transport
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deliver: Callable[[int, Incoming], None] | None = None
        self._fail: Callable[[CommError], None] | None = None

    # ---- collectives (called by the group's last-arriving partition, under the group's lock) ----
    # Tensors on the group's device go as they are (the CPU under gloo, the GPU under NCCL).
    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """In place: the sum over processes (every process gets the same bytes)."""
        import torch.distributed as dist
        self._staging.run(tensor, dist.all_reduce)

    def max_(self, value: float) -> float:
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def broadcast_(self, tensor: torch.Tensor, src_partition: int) -> None:
        """In place: the tensor of the process hosting ``src_partition``, on every process."""
        import torch.distributed as dist
        self._staging.run(tensor, lambda t: dist.broadcast(t, self.owner[src_partition]))

    def all_gather_blocks(self, local: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every partition's tensor in partition order, given this process's block's (equal shapes),
        on the group's device."""
        import torch.distributed as dist
        width = max(len(b) for b in self.blocks)
        like = local[0]
        stacked = torch.zeros((width, *like.shape), dtype=like.dtype, device=self.device)
        for i, t in enumerate(local):
            stacked[i].copy_(t)
        out = [torch.empty_like(stacked) for _ in range(self.processes)]
        dist.all_gather(out, stacked)
        return [out[r][i] for r, b in enumerate(self.blocks) for i in range(len(b))]

    def all_gather_objects(self, local: list[Any]) -> list[Any]:
        """Every partition's object in partition order, given this process's block's."""
        import torch.distributed as dist
        per_process: list[Any] = [None] * self.processes
        dist.all_gather_object(per_process, local)
        return [o for block in per_process for o in block]

    # ---- messages ----------------------------------------------------------------------------
    def send(self, src: int, out: Outgoing, targets: Sequence[Target]) -> None:
        """Send partition ``src``'s message ``out`` to partitions of other processes: one message
        per destination process (per destination under ``--wan real``), carrying the routing array."""
        transport = self._need_transport()
        by_process: dict[tuple[int, float | None], list[tuple[int, float]]] = {}
        for dst, arrival_s, release_at in targets:
            by_process.setdefault((self.owner[dst], release_at), []).append((dst, arrival_s))
        with self._send_lock:
            for (proc, release_at), dsts in by_process.items():
                route = np.empty(1 + 2 * len(dsts), dtype=np.float64)
                route[0] = src
                route[1:1 + len(dsts)] = [d for d, _ in dsts]
                route[1 + len(dsts):] = [a for _, a in dsts]
                msg = transport.prepare(out.kind, out.step, [*out.payloads, route])
                transport.send(msg, [(proc, 0.0, release_at)], wait=True)

    def start(self, deliver: Callable[[int, Incoming], None], fail: Callable[[CommError], None]) -> None:
        """Start the dispatcher (no-op without a transport)."""
        self._deliver, self._fail = deliver, fail
        if self._transport is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._dispatch, name=f"geodml-dispatch-{self.process}", daemon=True)
        self._thread.start()

    def _dispatch(self) -> None:
        assert self._deliver is not None and self._fail is not None
        transport = self._transport
        assert transport is not None
        try:
            while not self._stop.is_set():
                msg = transport.recv_any(_SLICE_S)
                if msg is None:
                    continue
                self._route(msg)
        except BaseException as exc:  # noqa: BLE001 -- becomes the group's error
            if not self._stop.is_set():
                print(f"geodml: error: process {self.process}: the message dispatcher failed: {exc!r}",
                      file=sys.stderr, flush=True)
                self._fail(exc if isinstance(exc, CommError) else CommError(f"the message dispatcher failed: {exc!r}"))

    def _route(self, msg: Incoming) -> None:
        assert self._deliver is not None
        *arrays, route = msg.arrays
        n = (len(route) - 1) // 2
        src = int(route[0]) if route.dtype == np.float64 and len(route) else -1
        if (route.dtype != np.float64 or route.ndim != 1 or len(route) != 1 + 2 * n or n < 1
                or not 0 <= src < self.partitions or self.owner[src] != msg.src):
            raise CommError(f"process {self.process}: a message from process {msg.src} has a bad routing array")
        nbytes = msg.nbytes - route.nbytes  # what was charged is the sender's; this is only informative
        for dst, arrival_s in zip(route[1:1 + n], route[1 + n:]):
            d = int(dst)
            if d not in self.hosted:
                raise CommError(f"process {self.process}: a message for partition {d}, which it does not host")
            # one list for every hosted destination: a receiving Comm hands out a copy of it (charged.py)
            self._deliver(d, Incoming(src, msg.kind, msg.step, float(arrival_s), arrays, nbytes))

    def _need_transport(self) -> PeerTransport:
        if self._transport is None:
            raise CommError(f"process {self.process}: no transport between processes")
        return self._transport

    def wire_rejected(self) -> dict[str, int]:
        return dict(self._transport.rejected) if self._transport is not None else {}

    def describe(self, partition: int) -> str:
        return f"process {self.owner[partition]}"

    def close(self) -> None:
        """Stop the dispatcher and close the transport (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=_SLICE_S * 10)
            self._thread = None
        if self._transport is not None:
            with self._send_lock:
                self._transport.close()
