"""Comm: the only way an algorithm talks to other partitions (DESIGN.md "Comm").

Dense collectives run over the default torch.distributed process group; sparse point-to-point
messages go through the ZeroMQ transport (geodml.comm.transport). Every byte that leaves a
rank is charged to its ledger (geodml.comm.ledger) under a traffic kind, and under
``--wan virtual|real`` advances the emulated clock (clock semantics: geodml.comm.wan).

Cost models of the collectives
------------------------------
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
identically on every rank from the sizes and the topology alone (no communication), and the
clock moves to ``max over ranks of the clock at entry + duration``.

Point-to-point messages are charged ``envelope + tensor bytes`` per destination, with
``transfer_s`` of that size on the directed link as emulated seconds.

A message with *no arrays* is a lock-step marker: the emulator runs partitions in step, so
an algorithm that has nothing to send this step (Gaia with no significant update) still tells
its peers so, where a real deployment would send nothing at all. Markers are therefore not
charged and carry no link time: they arrive at the sender's clock (they still synchronize
the ranks' clocks, as the lock-step emulation does).

Devices: the process group's collectives take tensors on one device (``device``: the rank's
GPU under NCCL, the CPU under gloo). A tensor elsewhere (a CPU counter under NCCL, a model on a
shared GPU under gloo) is copied to that device, reduced there, and copied back, through a
staging buffer kept per (shape, dtype): results and charges are the same, only a host<->device
copy is added.

``meta_*`` collectives are the emulator's own bookkeeping (metric averages, evaluation
counts, end-of-run totals, the clock synchronization itself); they are not part of the
emulated system and are never charged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from geodml.comm.ledger import KINDS, Ledger
from geodml.comm.transport import CommError, PeerTransport, as_array
from geodml.comm.wan import EmulatedClock, TokenBucket, Topology, WanLink

WAN_MODES = ("off", "virtual", "real")
_KIND_SET = frozenset(KINDS)


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


def ring_allreduce_wan_bytes(numel: int, element_size: int, region_of_rank: Sequence[str]) -> int:
    """WAN bytes all K ranks together send in one ring all-reduce: what each rank sends to its
    ring successor (``ring_allreduce_sent_elements``), counted when the two are in different
    regions. With one region per rank this is 2(K-1) x numel x element_size."""
    k = len(region_of_rank)
    return sum(sum(ring_allreduce_sent_elements(numel, k, r)) * element_size for r in range(k)
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


class Comm:
    """What an algorithm may use to talk to other partitions (see the module docstring).

    Build it with :func:`geodml.comm.build_comm` after the default process group exists.
    ``Comm(rank=, world_size=, region_of_rank=)`` alone gives collectives with ``--wan off``
    accounting and no point-to-point transport. A Comm is used from one thread.

    * charged collectives (every rank calls them): ``all_reduce``, ``broadcast``, ``all_gather``;
    * charged point-to-point, tagged (kind, step): ``send``/``send_to_all`` (no copy; return
      when the tensors may be overwritten, or at once with ``wait=False`` until ``flush``),
      ``recv``/``recv_from_all`` (numpy arrays viewing the received frames; messages for
      other steps or kinds are kept until asked for);
    * uncharged bookkeeping: ``meta_all_reduce``, ``meta_all_gather_object``;
    * the clock: ``advance_compute(seconds)`` (the trainer, every step), ``emulated_s``;
    * ``ledger`` (bytes per region pair and kind), ``link(src, dst)``, ``close()``.

    Errors: bad arguments (unknown kind, invalid rank) raise ``ValueError``; a peer that does
    not answer within ``timeout_s`` raises :class:`geodml.comm.CommTimeoutError` naming it.
    """

    def __init__(self, *, rank: int, world_size: int, region_of_rank: Sequence[str],
                 topology: Topology | None = None, wan: str = "off", wan_scale: float = 1.0,
                 transport: PeerTransport | None = None, timeout_s: float = 60.0,
                 device: torch.device | str | None = None) -> None:
        if wan not in WAN_MODES:
            raise ValueError(f"--wan: choose one of {', '.join(WAN_MODES)}, got {wan!r}")
        if wan != "off" and topology is None:
            raise ValueError(f"--wan {wan} needs a topology for the link model")
        if wan == "real" and transport is not None and transport.pacer is None:
            raise ValueError("--wan real needs a paced transport (PeerTransport(..., paced=True))")
        if len(region_of_rank) != world_size:
            raise ValueError(f"region_of_rank has {len(region_of_rank)} entries for world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.region_of_rank = list(region_of_rank)
        self.wan = wan
        self.wan_scale = float(wan_scale)
        self.timeout_s = float(timeout_s)
        self.topology = topology.scaled(wan_scale) if topology is not None else None
        self.ledger = Ledger(rank, self.region_of_rank)
        self._transport = transport
        self._timed = wan in ("virtual", "real")
        k = world_size
        self._links: list[list[WanLink | None]] | None = None
        if self.topology is not None:
            self._links = [[self.topology.link(self.region_of_rank[s], self.region_of_rank[d]) if s != d else None
                            for d in range(k)] for s in range(k)]
        self._clock = EmulatedClock(self._links[rank] if self._links is not None else [None] * k)
        self._wall_buckets = ([TokenBucket(lk.bytes_per_s) if lk is not None else None for lk in self._links[rank]]
                              if wan == "real" else None)
        self.device = torch.device(device if device is not None else "cpu")
        """Where the process group's collectives take tensors (others are staged through it)."""
        self._stage: dict[tuple, torch.Tensor] = {}
        self._closed = False

    # ---- model ---------------------------------------------------------------------------
    def link(self, src: int, dst: int) -> WanLink:
        """The (bandwidth-scaled) link from rank ``src`` to rank ``dst`` under the topology."""
        if self._links is None:
            raise ValueError("this Comm has no topology")
        self._check_rank(src, "src", allow_self=True)
        self._check_rank(dst, "dst", allow_self=True)
        if src == dst:
            raise ValueError(f"no link from rank {src} to itself")
        link = self._links[src][dst]
        assert link is not None
        return link

    @property
    def emulated_s(self) -> float:
        """This rank's emulated clock in seconds (compute only under ``--wan off``)."""
        return self._clock.now_s

    def advance_compute(self, seconds: float) -> None:
        """Add measured compute time to this rank's emulated clock."""
        if not seconds >= 0:
            raise ValueError(f"compute time must be >= 0 seconds, got {seconds!r}")
        self._clock.advance(float(seconds))

    # ---- charged collectives ---------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, kind: str, *, average: bool = False) -> None:
        """In-place sum (or mean) over all ranks, charged as a ring all-reduce."""
        self._check_kind(kind)
        k = self.world_size
        if k > 1:
            es = tensor.element_size()
            sent = ring_allreduce_sent_elements(tensor.numel(), k, self.rank)
            duration = link_s = 0.0
            if self._timed:
                ring = self._ring_links()
                duration = ring_allreduce_duration_s(tensor.numel(), es, ring)
                link_s = sum(ring[self.rank].transfer_s(n * es) for n in sent)
            self.ledger.charge((self.rank + 1) % k, kind, sum(sent) * es, messages=len(sent), emulated_s=link_s)
            self._collective(lambda: self._staged(tensor, dist.all_reduce), duration)
        if average:
            tensor.div_(k)

    def broadcast(self, tensor: torch.Tensor, src: int, kind: str) -> None:
        """In place: every rank receives ``src``'s tensor; charged as a star from ``src``."""
        self._check_kind(kind)
        self._check_rank(src, "src", allow_self=True)
        k = self.world_size
        if k == 1:
            return
        nbytes = tensor.numel() * tensor.element_size()
        others = [d for d in range(k) if d != src]
        duration = 0.0
        if self._timed:
            duration = star_broadcast_duration_s(nbytes, [self._links[src][d] for d in others])
        if self.rank == src:
            for d in others:
                self.ledger.charge(d, kind, nbytes, messages=1,
                                   emulated_s=self._links[src][d].transfer_s(nbytes) if self._timed else 0.0)
        self._collective(lambda: self._staged(tensor, lambda t: dist.broadcast(t, src)), duration)

    def all_gather(self, tensor: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's tensor (all of equal shape), in rank order; charged as a ring all-gather."""
        self._check_kind(kind)
        k = self.world_size
        out = [torch.empty_like(tensor) for _ in range(k)]
        if k == 1:
            out[0].copy_(tensor)
            return out
        nbytes = tensor.numel() * tensor.element_size()
        duration = link_s = 0.0
        if self._timed:
            ring = self._ring_links()
            duration = ring_allgather_duration_s(nbytes, ring)
            link_s = (k - 1) * ring[self.rank].transfer_s(nbytes)
        self.ledger.charge((self.rank + 1) % k, kind, (k - 1) * nbytes, messages=k - 1, emulated_s=link_s)
        src = tensor.contiguous()
        if src.device == self.device:
            self._collective(lambda: dist.all_gather(out, src), duration)
            return out
        staged_out = [torch.empty_like(tensor, device=self.device) for _ in range(k)]
        self._collective(lambda: dist.all_gather(staged_out, src.to(self.device)), duration)
        for o, so in zip(out, staged_out):
            o.copy_(so)
        return out

    # ---- charged point-to-point (ZeroMQ) -----------------------------------------------------
    def send(self, dst: int, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
             wait: bool = True) -> None:
        """Send ``tensors`` to rank ``dst`` as one message tagged (kind, step), without copying.

        Returns when ZeroMQ has taken the bytes, so the caller may overwrite its tensors at
        once. ``wait=False`` returns immediately (streaming many messages); the tensors must
        then stay untouched until :meth:`flush` (or :meth:`close`) returns.
        """
        if type(dst) is not int or dst == self.rank or not 0 <= dst < self.world_size:  # hot path: one test
            self._check_rank(dst, "dst")
            dst = int(dst)
        self._post(self._prepare(kind, tensors, step), [dst], wait)

    def send_to_all(self, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
                    wait: bool = True) -> None:
        """Send the same message to every other rank (one message per peer, each charged)."""
        if self.world_size > 1:
            self._post(self._prepare(kind, tensors, step), [d for d in range(self.world_size) if d != self.rank], wait)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the tensors of every ``send(..., wait=False)`` so far may be overwritten."""
        if self._transport is not None and not self._closed:
            self._transport.flush(timeout_s)

    def recv(self, src: int, kind: str, *, step: int, timeout_s: float | None = None) -> list[np.ndarray]:
        """The arrays of the next (kind, step) message from ``src`` (views of the received frames).

        Waits at most ``timeout_s`` (default: ``--comm-timeout``); messages for other steps or
        kinds that arrive meanwhile are kept for later calls.
        """
        self._check_kind(kind)
        self._check_rank(src, "src")
        msg = self._need_transport().recv(src, kind, self._check_step(step), timeout_s)
        if self._timed:
            self._clock.receive(msg.arrival_s)
        return msg.arrays

    def recv_from_all(self, kind: str, *, step: int, timeout_s: float | None = None) -> dict[int, list[np.ndarray]]:
        """One (kind, step) message from every other rank: ``{src: arrays}`` in rank order."""
        self._check_kind(kind)
        if self.world_size == 1:
            return {}
        others = [s for s in range(self.world_size) if s != self.rank]
        msgs = self._need_transport().recv_many(others, kind, self._check_step(step), timeout_s)
        if self._timed:
            self._clock.receive(max(m.arrival_s for m in msgs.values()))
        return {s: msgs[s].arrays for s in others}

    def wire_rejected(self) -> dict[str, int]:
        """Received ZeroMQ messages this rank dropped, by reason (geodml.comm.transport.REJECT_REASONS);
        empty without a peer transport. Read by the Prometheus exporter from its own thread."""
        return dict(self._transport.rejected) if self._transport is not None else {}

    # ---- uncharged bookkeeping -----------------------------------------------------------
    def meta_all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum over ranks for the emulator's own bookkeeping (never charged)."""
        if self.world_size > 1:
            self._staged(tensor, dist.all_reduce)

    def meta_broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """In place: ``src``'s tensor on every rank, for the emulator's bookkeeping (never charged)."""
        if self.world_size > 1:
            self._staged(tensor, lambda t: dist.broadcast(t, src))

    def meta_all_gather_object(self, obj: object) -> list[object]:
        """Gather a picklable object from every rank (never charged)."""
        if self.world_size == 1:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def state_dict(self) -> dict:
        """Ledger totals and the emulated clock (for checkpoints; ``--wan real`` wall pacing restarts fresh)."""
        return {"ledger": self.ledger.state_dict(), "clock": self._clock.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state["ledger"])
        self._clock.load_state_dict(state["clock"])

    def close(self) -> None:
        """Release sockets and threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # ---- internals -------------------------------------------------------------------------
    def _ring_links(self) -> list[WanLink]:
        k = self.world_size
        return [self._links[r][(r + 1) % k] for r in range(k)]

    def _staged(self, tensor: torch.Tensor, op: Callable[[torch.Tensor], object]) -> None:
        """Run the in-place collective ``op`` on ``tensor``, through a buffer on ``self.device``
        when the tensor lives elsewhere (module docstring, Devices)."""
        if tensor.device == self.device:
            op(tensor)
            return
        key = (tuple(tensor.shape), tensor.dtype)
        buf = self._stage.get(key)
        if buf is None:
            buf = self._stage[key] = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        buf.copy_(tensor)
        op(buf)
        tensor.copy_(buf)

    def _collective(self, run: Callable[[], object], duration_s: float) -> None:
        if not self._timed:
            run()
            return
        # Synchronous collective: it starts when the last rank arrives (uncharged MAX of clocks).
        t = torch.tensor([self._clock.now_s], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        start_s = float(t.item())
        wall0 = time.monotonic()
        run()
        self._clock.collective(start_s, duration_s)
        if self.wan == "real":
            left = wall0 + duration_s - time.monotonic()
            if left > 0:
                time.sleep(left)

    def _prepare(self, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], step: int):
        # Per message, so each check is one cheap test first (profiled: ~18 us of Python per send).
        if kind not in _KIND_SET:
            self._check_kind(kind)
        if type(step) is not int:
            step = self._check_step(step)
        if isinstance(tensors, (torch.Tensor, np.ndarray)):
            raise TypeError("tensors must be a sequence of tensors/arrays (wrap a single one in a list)")
        # numpy arrays that are already C-contiguous go as they are (prepare() checks their dtype)
        arrays = [t if type(t) is np.ndarray and t.flags.c_contiguous else as_array(t) for t in tensors]
        return self._need_transport().prepare(kind, step, arrays)

    def _post(self, out, dsts: list[int], wait: bool = True) -> None:
        transport = self._need_transport()
        if not self._timed:  # --wan off: nothing to model, only bytes to charge
            transport.send(out, [(d, 0.0, None) for d in dsts], wait=wait)
            if out.payloads:  # markers are not charged (module docstring)
                charge, kind, nbytes = self.ledger.charge, out.kind, out.nbytes
                for d in dsts:
                    charge(d, kind, nbytes)
            return
        wall_now = time.monotonic() if self.wan == "real" else 0.0
        targets, link_s = [], []
        marker = not out.payloads  # lock-step marker: see the module docstring
        for d in dsts:
            arrival_s = seconds = 0.0
            release_at = None
            if marker:
                arrival_s = self._clock.now_s if self._timed else 0.0
            elif self._timed:
                link = self._links[self.rank][d]
                arrival_s = self._clock.send(d, out.nbytes)
                seconds = link.transfer_s(out.nbytes)
                if self.wan == "real":
                    release_at = self._wall_buckets[d].reserve(out.nbytes, wall_now) + link.latency_s
            targets.append((d, arrival_s, release_at))
            link_s.append(seconds)
        transport.send(out, targets, wait=wait)
        if marker:
            return
        for (d, _, _), seconds in zip(targets, link_s):
            self.ledger.charge(d, out.kind, out.nbytes, messages=1, emulated_s=seconds)

    def _need_transport(self) -> PeerTransport:
        if self._closed:
            raise CommError(f"rank {self.rank}: this Comm is closed")
        if self._transport is None:
            raise CommError("this Comm has no peer transport; build it with geodml.comm.build_comm")
        return self._transport

    def _check_kind(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown traffic kind {kind!r}; choose one of {', '.join(KINDS)}")

    def _check_rank(self, r: int, what: str, *, allow_self: bool = False) -> None:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.world_size:
            raise ValueError(f"{what} must be a rank in 0..{self.world_size - 1}, got {r!r}")
        if r == self.rank and not allow_self:
            raise ValueError(f"{what} is this rank ({r}); point-to-point messages go to other ranks")

    @staticmethod
    def _check_step(step: int) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an integer, got {step!r}")
        return int(step)
