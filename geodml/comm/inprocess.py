"""InProcessComm: several partitions of one run in one process, one thread each (docs/design.md
"Comm"; contract: geodml.comm.api).

An :class:`InProcessGroup` of K ranks holds what they share: a rendezvous for collectives and
one mailbox per rank for point-to-point messages; :meth:`InProcessGroup.comm` is rank r's
:class:`InProcessComm`, used from that rank's thread. What each call charges and how it moves
the emulated clock is geodml.comm.charged, exactly as for DistComm: messages are described in
the wire format (geodml.comm.wire), so the same envelope + tensor bytes, messages and emulated
seconds are charged, although no byte crosses a socket.

* Collectives (charged and ``meta_*``): every rank deposits its tensor; the last to arrive
  combines them under the group's lock (a sum in rank order: bit-identical on every rank) into a
  buffer of the group that every rank copies out. Every rank must call the same collectives in
  the same order; a rank that calls another one breaks the group (``CommError`` on every rank),
  as a mismatched collective breaks a process group.
* Messages: ``send`` copies the arrays once (so the caller may overwrite its tensors when it
  returns, and ``wait=False`` has nothing to wait for) into read-only arrays shared by every
  destination, and puts one message per destination in its mailbox; under ``--wan real`` a
  pacer thread (geodml.comm.pacing) puts it there at its release time. Nothing is charged for
  the copy: it is the emulator's, not the emulated system's.
* Waits: every wait is a condition wait with a deadline (the group's ``timeout_s`` or the
  call's), never a poll. A wait that passes it raises ``CommTimeoutError`` naming the ranks it
  waited for; a timed-out collective breaks the group. :meth:`InProcessGroup.abort` wakes every
  wait with ``CommError`` (a harness calls it when one rank's thread fails, so that the others
  do not sit out the timeout).
"""

from __future__ import annotations

import functools
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from geodml.comm.api import CommError, CommTimeoutError
from geodml.comm.charged import ChargedComm
from geodml.comm.crossproc import CrossProcess
from geodml.comm.pacing import Pacer, Target
from geodml.comm.topology import RankLinks, Topology, load_topology, rank_links
from geodml.comm.wire import DEFAULT_MAX_MESSAGE_BYTES, Incoming, Outgoing, describe

if TYPE_CHECKING:
    from geodml.config import CommConfig
    from geodml.engine.hub import Hub

_T = TypeVar("_T")


class InProcessGroup:
    """K ranks of one run in this process: :meth:`comm` gives each its :class:`InProcessComm`.

    ``topology`` (a :class:`Topology`, a name or path for :func:`load_topology`, or None for the
    default topology) places the ranks; ``wan``, ``wan_scale``, ``timeout_s`` and
    ``max_message_bytes`` mean what they mean for :func:`geodml.comm.build_comm`.
    """

    def __init__(self, world_size: int, *, topology: Topology | str | None = None, wan: str = "off",
                 wan_scale: float = 1.0, timeout_s: float = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, cross: CrossProcess | None = None,
                 hub: Hub | None = None) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world size must be a positive integer, got {world_size!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        topo = topology if isinstance(topology, Topology) else load_topology(topology)
        self.world_size = world_size
        self.region_of_rank = topo.placement(world_size)
        self.timeout_s = float(timeout_s)
        self.cross = cross
        self.hub = hub
        """The engine's cooperative scheduler (geodml.engine.hub) when the hosted ranks are tasks of one
        thread; None: each rank has a thread of its own (tests)."""
        self.hosted = cross.hosted if cross is not None else range(world_size)
        """The ranks (partitions) this group hosts: all of them, or this process's block."""
        assert cross is None or cross.partitions == world_size
        n = len(self.hosted)
        self._cond = threading.Condition()  # the rendezvous of collectives
        self._generation = 0  # collectives completed so far
        self._tags: list[Hashable | None] = [None] * n  # what each arrived hosted rank called
        self._values: list[Any] = [None] * n
        self._arrived = 0
        self._result: Any = None
        self._scratch: dict[tuple, torch.Tensor] = {}  # combined tensors, reused per (shape, dtype, device)
        self._decoded: list[Any] = []     # cooperative meta_all_gather_object: the last one's objects, decoded once
        self._decoded_generation = -1
        self._clocks: list[float | None] = [None] * n  # cooperative timed collectives: each rank's clock at arrival
        self._clock_result: tuple[float, float] = (0.0, 0.0)  # (the clocks' MAX, the wall time all had arrived)
        self._next = 0                   # cooperative sums: the next hosted rank to add, in rank order
        self._stash: dict[int, torch.Tensor] = {}  # cooperative sums: ranks that arrived before their turn
        self._staged: dict[tuple, torch.Tensor] = {}  # cooperative: copies of deposited tensors, per (slot, shape, dtype)
        self._error: CommError | None = None  # set once: the group is broken
        self._mailboxes = {r: _Mailbox() for r in self.hosted}
        links = rank_links(topo.scaled(wan_scale), self.region_of_rank)  # once for the group, not per rank
        self._comms = {r: InProcessComm(self, r, topology=topo, wan=wan, wan_scale=wan_scale,
                                        max_message_bytes=max_message_bytes, links=links) for r in self.hosted}
        if cross is not None:
            cross.start(self._deliver, self._fail)

    @classmethod
    def from_config(cls, cfg: CommConfig, world_size: int, *, topology: Topology | None = None,
                    cross: CrossProcess | None = None, hub: Hub | None = None) -> InProcessGroup:
        """The group :func:`geodml.comm.build_comm` would build for ``cfg`` (sockets aside);
        ``topology``: the already-loaded ``cfg.topology``, when the caller has it; ``cross``: this
        process's link to the others when the partitions span processes (:func:`build_hosted_group`)."""
        return cls(world_size, topology=topology if topology is not None else cfg.topology, wan=cfg.wan,
                   wan_scale=cfg.wan_scale, timeout_s=cfg.timeout_s,
                   max_message_bytes=int(cfg.max_message_mb * 1024 * 1024), cross=cross, hub=hub)

    def comm(self, rank: int) -> InProcessComm:
        """Rank ``rank``'s Comm (always the same object); ``rank`` must be hosted here."""
        return self._comms[rank]

    @property
    def comms(self) -> list[InProcessComm]:
        return list(self._comms.values())

    def abort(self, reason: object = "aborted") -> None:
        """Break the group: every current and future wait raises ``CommError`` naming ``reason``."""
        self._fail(CommError(f"the in-process group was aborted: {reason}"))

    def close(self) -> None:
        """Close every rank's Comm and the link to the other processes (idempotent)."""
        for c in self._comms.values():
            c.close()
        if self.cross is not None:
            self.cross.close()

    # ---- collectives ---------------------------------------------------------------------------
    def _exchange(self, rank: int, tag: Hashable, value: Any, combine: Callable[[list[Any]], Any],
                  clock: float | None = None) -> Any:
        """Deposit ``value`` and wait for every rank; the last to arrive computes
        ``combine(values in rank order)`` under the lock, and every rank gets that result (valid
        until this rank enters its next collective). ``clock``: cooperative ranks' emulated clock at
        a charged collective's arrival (:meth:`InProcessComm._collective`)."""
        if self.hub is not None and self.hub.active:
            return self._exchange_coop(rank, tag, value, combine, clock)
        with self._cond:
            self._check_error()
            gen = self._generation
            i = rank - self.hosted.start
            self._tags[i], self._values[i] = tag, value
            self._arrived += 1
            if self._arrived == len(self.hosted):
                try:
                    if any(t != tag for t in self._tags):
                        raise CommError("ranks called different collectives: " +
                                        ", ".join(f"rank {r}: {t}" for r, t in zip(self.hosted, self._tags)))
                    self._result = combine(self._values)
                except BaseException as e:
                    err = e if isinstance(e, CommError) else CommError(f"collective {tag} failed: {e!r}")
                    self._fail_locked(err)
                    raise err from (None if err is e else e)
                finally:
                    self._tags = [None] * len(self.hosted)
                    self._values = [None] * len(self.hosted)
                    self._arrived = 0
                self._generation += 1
                self._cond.notify_all()
                return self._result
            deadline = time.monotonic() + self.timeout_s
            while self._generation == gen:
                self._check_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r, t in zip(self.hosted, self._tags) if t is None]
                    err = CommTimeoutError(
                        f"rank {rank}: collective {tag} not joined within {self.timeout_s:g} s by "
                        f"{', '.join(self._describe(r) for r in missing)}: silent, crashed, or calling something else")
                    self._fail_locked(err)
                    raise err
                self._cond.wait(left)
            return self._result

    def _exchange_coop(self, rank: int, tag: Hashable, value: Any, combine: Callable[[list[Any]], Any],
                       clock: float | None = None) -> Any:
        """:meth:`_exchange` for ranks that are tasks of the hub (geodml.engine.hub): the same result.
        A task's tensors may be scratch that the next task overwrites (the worker's gradient), so a
        deposited tensor is used at once: a sum adds it in rank order into the group's accumulator
        (a rank that arrives before its turn is copied and added when its turn comes: the same
        additions in the same order as ``_sum``), a broadcast copies the source's, a gather copies
        each; non-tensor values are taken as they are. The waits switch to the other tasks. A charged
        collective's clocks travel with its data (``clock``): the MAX of the ranks' clocks at arrival
        (over the processes too) and the wall time the last one arrived, in ``_clock_result``."""
        hub = self.hub
        assert hub is not None
        with self._cond:
            self._check_error()
            gen = self._generation
            i = rank - self.hosted.start
            if self._tags[i] is not None:
                err = CommError(f"rank {rank} entered collective {tag} before its previous one ({self._tags[i]}) ended")
                self._fail_locked(err)
                raise err
            self._tags[i] = tag
            self._clocks[i] = clock
            kind, src = (tag[0], tag[1]) if isinstance(tag, tuple) else (tag, None)
            if kind == "sum":
                self._accumulate(i, value)
            elif kind == "broadcast":
                self._values[i] = self._stage(i, value) if src == rank else value  # others: their shape only
            elif kind == "all_gather":
                self._values[i] = self._stage(i, value)
            else:
                self._values[i] = value
            self._arrived += 1
            if self._arrived == len(self.hosted):
                try:
                    if any(t != tag for t in self._tags):
                        raise CommError("ranks called different collectives: " +
                                        ", ".join(f"rank {r}: {t}" for r, t in zip(self.hosted, self._tags)))
                    self._result = self._finish_sum() if kind == "sum" else combine(self._values)
                    if clock is not None:
                        m = max(c for c in self._clocks if c is not None)
                        self._clock_result = (self.cross.max_(m) if self.cross is not None else m, time.monotonic())
                except BaseException as e:
                    err = e if isinstance(e, CommError) else CommError(f"collective {tag} failed: {e!r}")
                    self._fail_locked(err)
                    raise err from (None if err is e else e)
                finally:
                    self._tags = [None] * len(self.hosted)
                    self._values = [None] * len(self.hosted)
                    self._arrived = 0
                    self._clocks = [None] * len(self.hosted)
                    self._next = 0
                    self._stash.clear()
                self._generation += 1
                hub.notify(("collective", id(self)))
                return self._result
        deadline = time.monotonic() + self.timeout_s
        done = hub.wait(("collective", id(self)), lambda: self._generation != gen or self._error is not None, deadline)
        with self._cond:
            if self._generation != gen:
                return self._result
            self._check_error()
            assert not done
            missing = [r for r, t in zip(self.hosted, self._tags) if t is None]
            err = CommTimeoutError(
                f"rank {rank}: collective {tag} not joined within {self.timeout_s:g} s by "
                f"{', '.join(self._describe(r) for r in missing)}: silent, crashed, or calling something else")
            self._fail_locked(err)
            raise err

    def _stage(self, slot: int, value: torch.Tensor) -> torch.Tensor:
        """A copy of ``value`` in a buffer of hosted slot ``slot`` (reused per shape and dtype)."""
        key = (slot, tuple(value.shape), value.dtype, value.device)
        buf = self._staged.get(key)
        if buf is None:
            buf = self._staged[key] = torch.empty_like(value, memory_format=torch.contiguous_format)
        buf.copy_(value)
        return buf

    def _accumulate(self, slot: int, value: torch.Tensor) -> None:
        """Add hosted slot ``slot``'s tensor to the sum in rank order (``_sum``'s arithmetic): at once
        when it is its turn, else a copy until its turn comes."""
        if slot != self._next:
            self._stash[slot] = self._stage(slot, value)
            return
        while True:
            if self._next == 0:
                self._values[0] = value  # the accumulator's shape and dtype
                buf = self._buffer(value)
                widen = value.is_floating_point() and value.dtype != torch.float64
                self._acc = self._buffer(value, torch.float64) if widen else buf
                self._acc.copy_(value)
            else:
                self._acc.add_(value)
            self._next += 1
            if self._next not in self._stash:
                return
            value = self._stash.pop(self._next)

    def _finish_sum(self) -> torch.Tensor:
        """The cooperative sum's result (every hosted rank added): over processes, then in the buffer."""
        acc = self._acc
        buf = self._buffer(acc) if acc.dtype == self._values[0].dtype else self._buffer(self._values[0])
        if self.cross is not None:
            self.cross.all_reduce_(acc)
        if acc is not buf:
            buf.copy_(acc)
        return buf

    def _sum(self, values: list[torch.Tensor]) -> torch.Tensor:
        """The sum of the hosted ``values`` in rank order (then over processes), in the group's
        buffer. Floating sums accumulate in float64 and round once (geodml.comm.crossproc,
        Exactness), so they do not depend on how partitions are grouped into processes."""
        buf = self._buffer(values[0])
        widen = values[0].is_floating_point() and values[0].dtype != torch.float64
        acc = self._buffer(values[0], torch.float64) if widen else buf
        acc.copy_(values[0])
        for v in values[1:]:
            acc.add_(v)
        if self.cross is not None:
            self.cross.all_reduce_(acc)
        if acc is not buf:
            buf.copy_(acc)
        return buf

    def _pick(self, values: list[torch.Tensor], src: int) -> torch.Tensor:
        """A copy of rank ``src``'s tensor in the group's buffer (from its process, if another)."""
        buf = self._buffer(values[0])
        if src in self.hosted:
            buf.copy_(values[src - self.hosted.start])
        if self.cross is not None:
            self.cross.broadcast_(buf, src)
        return buf

    def _gather_all(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.cross is not None:
            return self.cross.all_gather_blocks(values)
        return [v.clone() for v in values]

    def _objects(self, values: list[Any]) -> list[Any]:
        return self.cross.all_gather_objects(values) if self.cross is not None else list(values)

    def _max(self, values: list[float]) -> float:
        m = max(values)
        return self.cross.max_(m) if self.cross is not None else m

    def _buffer(self, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or like.dtype
        key = (tuple(like.shape), dtype, like.device)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return buf

    # ---- messages ------------------------------------------------------------------------------
    def _deliver(self, dst: int, msg: Incoming) -> None:
        self._deliver_to((dst,), msg)

    def _deliver_to(self, dsts: Iterable[int], msg: Incoming) -> None:
        """``msg`` into the mailbox of each of ``dsts`` (one object shared by all: receivers get a
        copy of its array list, and the arrays are read-only)."""
        key = (msg.src, msg.kind, msg.step)
        boxes = self._mailboxes
        for dst in dsts:
            box = boxes[dst]
            with box.lock:  # cond's lock, entered without Condition's Python-level __enter__ (hot: P^2 per step)
                queues = box.queues
                q = queues.get(key)
                if q is None:
                    queues[key] = msg  # the usual case: one message per (src, kind, step), no deque
                elif isinstance(q, deque):
                    q.append(msg)
                else:
                    queues[key] = deque((q, msg))
                if box.waiting:  # only its rank waits on a box: nobody waiting, nobody to wake
                    box.cond.notify_all()
        if self.hub is not None:
            for dst in dsts:
                self.hub.notify(("box", dst))

    def _take(self, rank: int, srcs: list[int], kind: str, step: int, timeout_s: float) -> dict[int, Incoming]:
        """One (kind, step) message from each of ``srcs``, taken together once all are there (so a
        timeout loses nothing)."""
        box = self._mailboxes[rank]
        deadline = time.monotonic() + timeout_s
        hub = self.hub
        if hub is not None and hub.active:
            def present() -> bool:
                with box.lock:
                    return self._error is not None or all((s, kind, step) in box.queues for s in srcs)
            hub.wait(("box", rank), present, deadline)
            deadline = time.monotonic()  # all there (taken below), or the error / timeout below: no further wait
        with box.cond:
            while True:
                queues = [box.queues.get((s, kind, step)) for s in srcs]
                if None not in queues:  # every source has a message
                    got: dict[int, Incoming] = {}
                    for s, q in zip(srcs, queues):
                        if isinstance(q, deque):
                            got[s] = q.popleft()
                            if not q:
                                del box.queues[(s, kind, step)]
                        else:
                            assert q is not None
                            got[s] = q
                            del box.queues[(s, kind, step)]
                    return got
                self._check_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [s for s, q in zip(srcs, queues) if q is None]
                    raise CommTimeoutError(self._timeout_message(rank, box, missing, kind, step, timeout_s))
                box.waiting += 1
                try:
                    box.cond.wait(left)
                finally:
                    box.waiting -= 1

    def _timeout_message(self, rank: int, box: _Mailbox, missing: list[int], kind: str, step: int,
                         timeout_s: float) -> str:
        parts = []
        for s in missing:
            queued = sorted((k, st) for (src, k, st) in box.queues if src == s)
            have = (f"; queued from it: {', '.join(f'{k}@{st}' for k, st in queued[:8])}"
                    f"{' ...' if len(queued) > 8 else ''}") if queued else "; nothing else queued from it"
            parts.append(f"{self._describe(s)}{have}")
        return (f"rank {rank}: no {kind!r} message for step {step} within {timeout_s:g} s from "
                f"{'; '.join(parts)}. That peer is silent, crashed, or sends a different kind/step.")

    # ---- failure -------------------------------------------------------------------------------
    def _describe(self, rank: int) -> str:
        where = "in-process" if rank in self.hosted or self.cross is None else self.cross.describe(rank)
        return f"rank {rank} (region {self.region_of_rank[rank]}, {where})"

    def _check_error(self) -> None:
        if self._error is not None:
            raise CommError(str(self._error)) from self._error

    def _fail(self, err: CommError) -> None:
        with self._cond:
            self._fail_locked(err)

    def _fail_locked(self, err: CommError) -> None:
        if self._error is None:
            self._error = err
        self._cond.notify_all()
        if self.hub is not None:
            self.hub.notify_all()
        for box in self._mailboxes.values():
            with box.cond:
                box.cond.notify_all()


class _Mailbox:
    """One rank's received messages per (src, kind, step), oldest first; only its rank waits on it."""

    __slots__ = ("cond", "lock", "queues", "waiting")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queues: dict[tuple[int, str, int], Incoming | deque[Incoming]] = {}
        """A key's one message, or a deque of its messages when several wait (never empty)."""
        self.waiting = 0
        """Threads in ``cond.wait`` now (changed under ``cond``): a delivery notifies only when > 0."""


class InProcessComm(ChargedComm):
    """Rank ``rank`` of an :class:`InProcessGroup` (module docstring): a
    :class:`geodml.comm.api.RunComm` that charges exactly what :class:`geodml.comm.dist.DistComm`
    charges. Build the group, not this. Used from one thread (or, for point-to-point only, from
    one thread that drives every rank in turn: sends never wait for the receiver)."""

    def __init__(self, group: InProcessGroup, rank: int, *, topology: Topology, wan: str, wan_scale: float,
                 max_message_bytes: int, links: RankLinks | None = None) -> None:
        super().__init__(rank=rank, world_size=group.world_size, region_of_rank=group.region_of_rank,
                         topology=topology, wan=wan, wan_scale=wan_scale, timeout_s=group.timeout_s, links=links)
        self._group = group
        self._arrival_s: float | None = None  # inside a cooperative charged collective: the clock at arrival
        self.max_message_bytes = max_message_bytes
        self._pacer: Pacer | None = Pacer(name=f"geodml-inprocess-pacer-{rank}") if wan == "real" else None

    def flush(self, timeout_s: float | None = None) -> None:
        """Nothing to wait for: :meth:`send` copies the arrays before it returns."""

    def wire_rejected(self) -> dict[str, int]:
        """Messages this process's transport dropped (empty when the partitions share one process)."""
        g = self._group
        return g.cross.wire_rejected() if g.cross is not None else {}

    def meta_all_gather_object(self, obj: _T) -> list[_T]:
        """A copy of every rank's object (pickled, as torch.distributed does), in rank order."""
        if self.world_size == 1:
            return [obj]
        g = self._group
        blobs = g._exchange(self.rank, "meta_all_gather_object", pickle.dumps(obj), g._objects)
        if g.hub is None or not g.hub.active:
            return [pickle.loads(b) for b in blobs]
        # cooperative ranks: decoded once for the hosted ranks (P of them would each decode P objects),
        # so they share the objects: callers read them (a run's bookkeeping), never change them
        if g._decoded_generation != g._generation:
            g._decoded = [pickle.loads(b) for b in blobs]
            g._decoded_generation = g._generation
        return list(g._decoded)

    def close(self) -> None:
        """Stop the pacer thread (``--wan real``) after releasing what it holds (bounded); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pacer is not None:
            self._pacer.flush(min(self.timeout_s, 60.0))
            self._pacer.close()

    # ---- data movement -------------------------------------------------------------------------
    def _collective(self, run: Callable[[], object], duration_s: float) -> None:
        """ChargedComm's charged collective. Cooperative ranks (geodml.engine.hub): the clocks' MAX
        travels with the data in one exchange, so the collective has one wait and the caller's
        tensor is taken before it and written after it (the next task may reuse it meanwhile); the
        ``--wan real`` hold waits on the hub instead of sleeping the process's thread."""
        g = self._group
        hub = g.hub
        if not self._timed or hub is None or not hub.active:
            super()._collective(run, duration_s)
            return
        self._arrival_s = self._pacing.now_s
        try:
            run()
        finally:
            self._arrival_s = None
        start_s, wall0 = g._clock_result
        self._place_windows(start_s)
        self._pacing.leave_collective(start_s, duration_s, wall0, sleep=hub.sleep)

    def _reduce(self, tensor: torch.Tensor) -> None:
        g = self._group
        tensor.copy_(g._exchange(self.rank, ("sum", tuple(tensor.shape), tensor.dtype), tensor, g._sum,
                                 self._arrival_s))

    def _bcast(self, tensor: torch.Tensor, src: int) -> None:
        g = self._group
        out = g._exchange(self.rank, ("broadcast", src, tuple(tensor.shape), tensor.dtype), tensor,
                          functools.partial(g._pick, src=src), self._arrival_s)
        if self.rank != src or g.hub is not None:  # cooperative: the source's tensor may be scratch reused meanwhile
            tensor.copy_(out)

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        g = self._group
        shared = g._exchange(self.rank, ("all_gather", tuple(tensor.shape), tensor.dtype), tensor, g._gather_all,
                             self._arrival_s)
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        for o, s in zip(out, shared):
            o.copy_(s)
        return out

    def _max_over_ranks(self, value: float) -> float:
        g = self._group
        return float(g._exchange(self.rank, "clock_max", value, g._max))

    def _describe(self, kind: str, step: int, arrays: list[np.ndarray]) -> Outgoing:
        self._check_open()
        out = describe(kind, step, self.rank, arrays, max_message_bytes=self.max_message_bytes)
        owned = []
        for a in out.payloads:  # the sender may overwrite its arrays once send returns
            c = a.copy()
            c.flags.writeable = False  # shared by every destination
            owned.append(c)
        out.payloads = owned
        return out

    def _hand_over(self, out: Outgoing, targets: list[Target], wait: bool) -> None:
        g = self._group
        if g.cross is not None:
            remote = [t for t in targets if t[0] not in g.hosted]
            if remote:
                g.cross.send(self.rank, out, remote)
                targets = [t for t in targets if t[0] in g.hosted]
        src, kind, step, payloads, nbytes = self.rank, out.kind, out.step, out.payloads, out.nbytes
        if not self._timed or not out.payloads:  # --wan off, or a marker: one arrival time, delivered now
            if targets:
                g._deliver_to([t[0] for t in targets], Incoming(src, kind, step, targets[0][1], payloads, nbytes))
            return
        deliver = g._deliver
        for dst, arrival_s, release_at in targets:
            msg = Incoming(src, kind, step, arrival_s, payloads, nbytes)
            if release_at is None:
                deliver(dst, msg)
            else:
                assert self._pacer is not None, "a release time only under --wan real"
                self._pacer.submit(release_at, functools.partial(g._deliver, dst, msg))

    def _take(self, src: int, kind: str, step: int, timeout_s: float | None) -> Incoming:
        self._check_open()
        return self._group._take(self.rank, [src], kind, step, self._timeout(timeout_s))[src]

    def _take_from(self, srcs: list[int], kind: str, step: int, timeout_s: float | None) -> dict[int, Incoming]:
        self._check_open()
        return self._group._take(self.rank, srcs, kind, step, self._timeout(timeout_s))

    # ---- internals -----------------------------------------------------------------------------
    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else float(timeout_s)

    def _check_open(self) -> None:
        self._check_closed()
        if self._pacer is not None and self._pacer.error is not None:
            err = self._pacer.error
            raise CommError(f"rank {self.rank}: a paced delivery failed: {err}") from err
