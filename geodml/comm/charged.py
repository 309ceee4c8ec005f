"""The Comm contract (geodml.comm.api) once: argument checks, what each call charges to the
ledger, and the emulated clock. How the bytes move is a subclass's business
(geodml.comm.dist: torch.distributed + ZeroMQ; geodml.comm.inprocess: threads of one process),
so every Comm charges the same bytes, messages and emulated seconds for the same calls.

Charges
-------
* Collectives: by the cost models of geodml.comm.collectives (ring all-reduce, star
  broadcast, ring all-gather); each rank charges what it sends itself.
* Point-to-point: ``envelope + tensor bytes`` (geodml.comm.wire, :attr:`Outgoing.nbytes`) per
  destination, one message each, with ``transfer_s`` of that size on the directed link as
  emulated seconds (0 under ``--wan off``).
* A message with *no arrays* is a lock-step marker: the emulator runs partitions in step, so
  an algorithm that has nothing to send this step (Gaia with no significant update) still tells
  its peers so, where a real deployment would send nothing at all. Markers are therefore not
  charged and carry no link time: they arrive at the sender's clock (they still synchronize
  the ranks' clocks, as the lock-step emulation does).
* ``meta_*`` collectives are the emulator's own bookkeeping (metric averages, evaluation
  counts, end-of-run totals, the clock synchronization itself); they are not part of the
  emulated system and are never charged.

Clock: geodml.comm.pacing (:class:`LinkPacing`): a collective starts when the last rank
arrives (an uncharged MAX of the clocks) and lasts its cost model's duration; a message arrives
at the time its link FIFO says; ``--wan real`` also paces wall time.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from geodml.comm.api import CommError
from geodml.comm.collectives import (
    ring_allgather_duration_s,
    ring_allreduce_duration_s,
    ring_allreduce_sent_elements,
    star_broadcast_duration_s,
)
from geodml.comm.ledger import KINDS, Ledger
from geodml.comm.pacing import LinkPacing, Target
from geodml.comm.topology import NoLinks, RankLinks, Topology, WanLink, rank_links
from geodml.comm.wire import Incoming, Outgoing, as_array
from geodml.config import WAN_MODES

_KIND_SET = frozenset(KINDS)
_T = TypeVar("_T")


class ChargedComm(ABC):
    """Implements :class:`geodml.comm.api.RunComm` on top of a few data-moving hooks.

    Subclasses implement the hooks below (``_reduce`` .. ``_take_from``), ``flush``,
    ``wire_rejected``, ``meta_all_gather_object`` and ``close`` (which sets ``_closed``). The
    hooks are called only with checked arguments and, for collectives, only when K > 1.

    ``region_of_rank`` places the ranks; ``topology`` (scaled by ``wan_scale``) gives the links,
    required unless ``wan == "off"``. ``timeout_s`` bounds every wait on a peer.
    """

    def __init__(self, *, rank: int, world_size: int, region_of_rank: Sequence[str],
                 topology: Topology | None = None, wan: str = "off", wan_scale: float = 1.0,
                 links: RankLinks | None = None,
                 timeout_s: float = 60.0) -> None:
        assert wan in WAN_MODES, wan  # validated by geodml.config.CommConfig
        if wan != "off" and topology is None:
            raise ValueError(f"--wan {wan} needs a topology for the link model")
        if len(region_of_rank) != world_size:
            raise ValueError(f"region_of_rank has {len(region_of_rank)} entries for world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        # shared, not copied: the ranks of an in-process group hold one list (O(P), not O(P^2))
        self.region_of_rank = region_of_rank if isinstance(region_of_rank, list) else list(region_of_rank)
        self.wan = wan
        self.wan_scale = float(wan_scale)
        self.timeout_s = float(timeout_s)
        self.topology = topology.scaled(wan_scale) if topology is not None else None
        self.ledger = Ledger(rank, self.region_of_rank)
        self._timed = wan in ("virtual", "real")
        if links is None and self.topology is not None:
            links = rank_links(self.topology, self.region_of_rank)
        self._links = links  # [src][dst]; shared by the ranks of an in-process group (built once, by region)
        self._pacing = LinkPacing(wan, self._links[rank] if self._links is not None else NoLinks(world_size))
        self._windows_next: list[tuple[int, int, float]] = []   # a collective's (dst, bytes, spread s), placed at its start
        self._closed = False
        self._others: tuple[int, ...] | None = None  # every other rank (send_to_all), built on first use

    # ---- model -----------------------------------------------------------------------------
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
        return self._pacing.now_s

    def advance_compute(self, seconds: float) -> None:
        """Add measured compute time to this rank's emulated clock."""
        if not seconds >= 0:
            raise ValueError(f"compute time must be >= 0 seconds, got {seconds!r}")
        self._pacing.advance(float(seconds))

    # ---- charged collectives ---------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, kind: str, *, average: bool = False) -> None:
        """In-place sum (or mean) over all ranks, charged as a ring all-reduce."""
        self._check_kind(kind)
        if self.world_size > 1:
            self._collective(lambda: self._reduce(tensor), self.charge_all_reduce(tensor, kind))
        if average:
            tensor.div_(self.world_size)

    def charge_all_reduce(self, tensor: torch.Tensor, kind: str = "model") -> float:
        """Charge this rank's part of a ring all-reduce of ``tensor`` (K > 1); returns the
        collective's emulated duration (0 under ``--wan off``)."""
        k, es = self.world_size, tensor.element_size()
        sent = ring_allreduce_sent_elements(tensor.numel(), k, self.rank)
        duration = link_s = 0.0
        if self._timed:
            ring = self._ring_links()
            duration = ring_allreduce_duration_s(tensor.numel(), es, ring)
            link_s = sum(ring[self.rank].transfer_s(n * es) for n in sent)
        self.ledger.charge((self.rank + 1) % k, kind, sum(sent) * es, messages=len(sent), emulated_s=link_s)
        if self._timed:
            self._windows_next.append(((self.rank + 1) % k, sum(sent) * es, duration))
        return duration

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
        from_src: list[WanLink] = []
        if self._timed:
            assert self._links is not None
            from_src = [lk for lk in (self._links[src][d] for d in others) if lk is not None]
            assert len(from_src) == len(others)
            duration = star_broadcast_duration_s(nbytes, from_src)
        if self.rank == src:
            for i, d in enumerate(others):
                self.ledger.charge(d, kind, nbytes, messages=1,
                                   emulated_s=from_src[i].transfer_s(nbytes) if self._timed else 0.0)
                if self._timed:
                    self._windows_next.append((d, nbytes, from_src[i].transfer_s(nbytes)))
        self._collective(lambda: self._bcast(tensor, src), duration)

    def all_gather(self, tensor: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's tensor (all of equal shape), in rank order; charged as a ring all-gather."""
        self._check_kind(kind)
        k = self.world_size
        if k == 1:
            own = torch.empty_like(tensor)
            own.copy_(tensor)
            return [own]
        nbytes = tensor.numel() * tensor.element_size()
        duration = link_s = 0.0
        if self._timed:
            ring = self._ring_links()
            duration = ring_allgather_duration_s(nbytes, ring)
            link_s = (k - 1) * ring[self.rank].transfer_s(nbytes)
        self.ledger.charge((self.rank + 1) % k, kind, (k - 1) * nbytes, messages=k - 1, emulated_s=link_s)
        if self._timed:
            self._windows_next.append(((self.rank + 1) % k, (k - 1) * nbytes, duration))
        out: list[torch.Tensor] = []
        self._collective(lambda: out.extend(self._gather(tensor)), duration)
        return out

    # ---- charged point-to-point --------------------------------------------------------------
    def send(self, dst: int, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
             wait: bool = True) -> None:
        """Send ``tensors`` to rank ``dst`` as one message tagged (kind, step), without copying.

        Returns when the caller may overwrite its tensors. ``wait=False`` may return at once
        (streaming many messages); the tensors must then stay untouched until :meth:`flush`
        (or :meth:`close`) returns.
        """
        if type(dst) is not int or dst == self.rank or not 0 <= dst < self.world_size:  # hot path: one test
            self._check_rank(dst, "dst")
            dst = int(dst)
        self._post(self._prepare(kind, tensors, step), [dst], wait)

    def send_to_all(self, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
                    wait: bool = True) -> None:
        """Send the same message to every other rank (one message per peer, each charged)."""
        if self.world_size > 1:
            others = self._others
            if others is None:
                others = self._others = tuple(d for d in range(self.world_size) if d != self.rank)
            self._post(self._prepare(kind, tensors, step), others, wait)

    def recv(self, src: int, kind: str, *, step: int, timeout_s: float | None = None) -> list[np.ndarray]:
        """The arrays of the next (kind, step) message from ``src``.

        Waits at most ``timeout_s`` (default: the Comm's ``timeout_s``); messages for other
        steps or kinds that arrive meanwhile are kept for later calls.
        """
        self._check_kind(kind)
        self._check_rank(src, "src")
        msg = self._take(src, kind, self._check_step(step), timeout_s)
        self._pacing.receive(msg.arrival_s)
        return list(msg.arrays)  # a list of its own: an in-process message is shared by its destinations

    def recv_from_all(self, kind: str, *, step: int, timeout_s: float | None = None) -> dict[int, list[np.ndarray]]:
        """One (kind, step) message from every other rank: ``{src: arrays}`` in rank order."""
        self._check_kind(kind)
        if self.world_size == 1:
            return {}
        others = [s for s in range(self.world_size) if s != self.rank]
        msgs = self._take_from(others, kind, self._check_step(step), timeout_s)
        self._pacing.receive(max(m.arrival_s for m in msgs.values()))
        return {s: list(msgs[s].arrays) for s in others}  # lists of their own, as recv

    def recv_from(self, srcs: Sequence[int], kind: str, *, step: int,
                  timeout_s: float | None = None) -> dict[int, list[np.ndarray]]:
        """One (kind, step) message from each of ``srcs``: ``{src: arrays}`` in the order given."""
        self._check_kind(kind)
        for s in srcs:
            self._check_rank(s, "src")
        srcs = [int(s) for s in srcs]
        if len(set(srcs)) != len(srcs):
            raise ValueError(f"recv_from: the sources must be distinct, got {srcs}")
        if not srcs:
            return {}
        msgs = self._take_from(srcs, kind, self._check_step(step), timeout_s)
        self._pacing.receive(max(m.arrival_s for m in msgs.values()))
        return {s: list(msgs[s].arrays) for s in srcs}

    # ---- uncharged bookkeeping ---------------------------------------------------------------
    def meta_all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum over ranks for the emulator's own bookkeeping (never charged)."""
        if self.world_size > 1:
            self._reduce(tensor)

    def meta_broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """In place: ``src``'s tensor on every rank, for the emulator's bookkeeping (never charged)."""
        if self.world_size > 1:
            self._bcast(tensor, src)

    @abstractmethod
    def meta_all_gather_object(self, obj: _T) -> list[_T]:
        """Gather a picklable object from every rank (never charged)."""

    # ---- checkpoint and shutdown ---------------------------------------------------------------
    def state_dict(self) -> dict:
        """Ledger totals and the emulated clock (for checkpoints; ``--wan real`` wall pacing restarts fresh)."""
        return {"ledger": self.ledger.state_dict(), "clock": self._pacing.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state["ledger"])
        self._pacing.load_state_dict(state["clock"])

    @abstractmethod
    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the tensors of every ``send(..., wait=False)`` so far may be overwritten."""

    @abstractmethod
    def wire_rejected(self) -> dict[str, int]:
        """Received messages dropped by the wire checks, by reason."""

    @abstractmethod
    def close(self) -> None:
        """Release sockets and threads (idempotent)."""

    # ---- data-moving hooks (subclasses) ------------------------------------------------------
    @abstractmethod
    def _reduce(self, tensor: torch.Tensor) -> None:
        """In place: the sum over ranks, bit-identical on every rank (uncharged)."""

    @abstractmethod
    def _bcast(self, tensor: torch.Tensor, src: int) -> None:
        """In place: ``src``'s tensor on every rank (uncharged)."""

    @abstractmethod
    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor in rank order, as new tensors (uncharged)."""

    @abstractmethod
    def _max_over_ranks(self, value: float) -> float:
        """The largest ``value`` over ranks (uncharged; synchronizes the ranks)."""

    @abstractmethod
    def _describe(self, kind: str, step: int, arrays: list[np.ndarray]) -> Outgoing:
        """The message of ``arrays`` from this rank (geodml.comm.wire.describe); ``CommError`` once closed."""

    @abstractmethod
    def _hand_over(self, out: Outgoing, targets: list[Target], wait: bool) -> None:
        """Send ``out`` to every target, each released at its time (geodml.comm.pacing.Target)."""

    @abstractmethod
    def _take(self, src: int, kind: str, step: int, timeout_s: float | None) -> Incoming:
        """The next (kind, step) message from ``src``; ``CommTimeoutError`` after ``timeout_s``."""

    @abstractmethod
    def _take_from(self, srcs: list[int], kind: str, step: int, timeout_s: float | None) -> dict[int, Incoming]:
        """One (kind, step) message from each of ``srcs``; on a timeout none is lost."""

    # ---- internals -------------------------------------------------------------------------
    def _ring_links(self) -> list[WanLink]:
        assert self._links is not None
        k = self.world_size
        ring: list[WanLink] = []
        for r in range(k):
            link = self._links[r][(r + 1) % k]
            assert link is not None
            ring.append(link)
        return ring

    def _collective(self, run: Callable[[], object], duration_s: float) -> None:
        if not self._timed:
            run()
            return
        # Synchronous collective: it starts when the last rank arrives (uncharged MAX of clocks).
        start_s = self._max_over_ranks(self._pacing.now_s)
        self._place_windows(start_s)
        wall0 = time.monotonic()
        run()
        self._pacing.leave_collective(start_s, duration_s, wall0)

    def _place_windows(self, start_s: float) -> None:
        """The collective's bytes (charged before it started) into the peak-rate windows, from its start."""
        for dst, nbytes, spread_s in self._windows_next:
            self.ledger.record_window(dst, nbytes, start_s, spread_s)
        self._windows_next.clear()

    def _prepare(self, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], step: int) -> Outgoing:
        # Per message, so each check is one cheap test first (docs/performance.md, "Python per message").
        if kind not in _KIND_SET:
            self._check_kind(kind)
        if type(step) is not int:
            step = self._check_step(step)
        if isinstance(tensors, (torch.Tensor, np.ndarray)):
            raise TypeError("tensors must be a sequence of tensors/arrays (wrap a single one in a list)")
        # numpy arrays that are already C-contiguous go as they are (describe() checks their dtype)
        arrays = [t if type(t) is np.ndarray and t.flags.c_contiguous else as_array(t) for t in tensors]
        return self._describe(kind, step, arrays)

    def _post(self, out: Outgoing, dsts: Sequence[int], wait: bool = True) -> None:
        marker = not out.payloads  # lock-step marker: see the module docstring
        targets, link_s = self._pacing.plan(out.nbytes, dsts, marker=marker)
        self._hand_over(out, targets, wait)
        if marker:
            return
        charge, kind, nbytes = self.ledger.charge, out.kind, out.nbytes
        if link_s is None:  # --wan off: bytes only
            self.ledger.charge_each(dsts, kind, nbytes)
            return
        links = self._links[self.rank] if self._links is not None else None
        for (d, arrival_s, _), seconds in zip(targets, link_s):
            charge(d, kind, nbytes, messages=1, emulated_s=seconds)
            link = links[d] if links is not None else None
            if link is not None:      # the transfer ends one latency before it arrives
                self.ledger.record_window(d, nbytes, arrival_s - link.latency_s - seconds, seconds)

    def _check_closed(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: this Comm is closed")

    def _check_kind(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown traffic kind {kind!r}; choose one of {', '.join(KINDS)}")

    def _check_rank(self, r: object, what: str, *, allow_self: bool = False) -> None:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.world_size:
            raise ValueError(f"{what} must be a rank in 0..{self.world_size - 1}, got {r!r}")
        if r == self.rank and not allow_self:
            raise ValueError(f"{what} is this rank ({r}); point-to-point messages go to other ranks")

    @staticmethod
    def _check_step(step: object) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an integer, got {step!r}")
        return int(step)
