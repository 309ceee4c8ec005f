"""Traffic in time (docs/design.md "WAN emulation"): the emulated clock, the link FIFOs, and under
``--wan real`` the wall-clock pacing of messages and collectives. The link model itself
(``WanLink.transfer_s``) is in geodml.comm.topology; the collectives' durations in
geodml.comm.collectives. No sockets here: :class:`LinkPacing` says when each message arrives
(emulated) and leaves (wall); the Comm hands it over accordingly (a :class:`Pacer` thread runs
:class:`PacedSend` jobs at their release time).

Emulated clock (``--wan virtual`` and ``real``)
-----------------------------------------------
Each rank keeps its own clock ``C`` in seconds, 0 when its Comm is built:

* ``advance_compute(s)``: ``C += s`` (the trainer reports measured compute time).
* point-to-point send of a B-byte message (msgpack envelope + tensor bytes) to rank d: the
  directed link self->d is a FIFO served at its bandwidth (a :class:`TokenBucket` of depth 0),
  so concurrent messages on one link share it: ``start = max(C, link_free)``,
  ``link_free = start + B*8/bw``, ``arrival = link_free + latency``. The envelope carries
  ``arrival``. Sending does not advance the sender's clock (the NIC works while the sender
  computes, as with ``isend``). Each message is charged ``transfer_s(B)`` link seconds.
* a lock-step marker (a message without arrays; geodml.comm.charged) arrives at the sender's
  ``C``, takes no link time and is not charged.
* receive: ``C = max(C, arrival)``; ``recv_from_all`` takes the latest arrival.
* collectives: they are synchronous, so every rank leaves at ``max over ranks of C`` (exchanged
  with an uncharged MAX) plus the cost model's duration (geodml.comm.collectives).
  Collectives and point-to-point messages do not contend for a link in the model.

``--wan off`` keeps only the compute time (communication is free) and charges 0 emulated
seconds. ``--wan real`` keeps the same clock as ``virtual`` and additionally makes wall time
follow it: messages are released (by a :class:`Pacer` thread) at ``wall_link_free + latency``
computed with a wall-clock :class:`TokenBucket` per directed link, and collectives are held
until their duration has passed after the MAX that synchronizes the ranks. Wall time then
approximates the emulated WAN time.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from geodml.comm.topology import LinksOut
from geodml.config import WAN_MODES

Target = tuple[int, float, "float | None"]
"""One copy of a message: (destination rank, emulated arrival_s, ``time.monotonic()`` release time or
None for now)."""


class TokenBucket:
    """Serializer of one directed link: tokens (bytes) accrue at ``rate`` up to ``depth_bytes``.

    ``reserve(B, now)`` takes B tokens, going into debt if needed, and returns the time at which
    the debt is paid: when the last byte of the message has left. With depth 0 (the default,
    the exact link model) this is a FIFO: ``max(now, previous finish) + B/rate``. Times are in
    any one clock's seconds (emulated or ``time.monotonic``); ``now`` must not go backwards.
    """

    def __init__(self, bytes_per_s: float, depth_bytes: float = 0.0) -> None:
        assert bytes_per_s > 0 and depth_bytes >= 0
        self.bytes_per_s = float(bytes_per_s)
        self.depth_bytes = float(depth_bytes)
        self._level = float(depth_bytes)
        self._t: float | None = None

    def reserve(self, num_bytes: float, now: float) -> float:
        if self._t is not None:
            now = max(now, self._t)
            self._level = min(self.depth_bytes, self._level + (now - self._t) * self.bytes_per_s)
        self._t = now
        self._level -= num_bytes
        return now + max(0.0, -self._level) / self.bytes_per_s


class EmulatedClock:
    """One rank's emulated time and the FIFO state of its outgoing links (module docstring).

    A link's FIFO exists once the rank has sent on it (memory grows with the peers it talks
    to, not with the run's ranks: a FedAvg client of 10,000 talks to a handful)."""

    def __init__(self, links_out: LinksOut) -> None:
        self.now_s = 0.0
        self._links = links_out
        self._buckets: dict[int, TokenBucket] = {}

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def send(self, dst: int, num_bytes: int) -> float:
        """Emulated arrival time at ``dst`` of a message sent now; the clock does not move."""
        bucket = self._buckets.get(dst)
        link = self._links[dst]
        if bucket is None:
            assert link is not None, "no link to self"
            bucket = self._buckets[dst] = TokenBucket(link.bytes_per_s)
        assert link is not None
        return bucket.reserve(num_bytes, self.now_s) + link.latency_s

    def receive(self, arrival_s: float) -> None:
        self.now_s = max(self.now_s, arrival_s)

    def collective(self, start_s: float, duration_s: float) -> None:
        """Leave a collective that every rank entered by ``start_s`` and that took ``duration_s``."""
        self.now_s = max(self.now_s, start_s) + duration_s

    def state_dict(self) -> dict:
        """Emulated time and the FIFO state of each outgoing link used so far (for checkpoints)."""
        return {"now_s": self.now_s, "buckets": {d: (b._level, b._t) for d, b in sorted(self._buckets.items())}}

    def load_state_dict(self, state: dict) -> None:
        saved = state["buckets"]
        if isinstance(saved, list):  # checkpoints before 2026-11-23: one entry per rank, None for unused links
            if len(saved) != len(self._links):
                raise ValueError(f"checkpoint clock has {len(saved)} links, this run {len(self._links)}")
            saved = {d: v for d, v in enumerate(saved) if v is not None}
        self.now_s = float(state["now_s"])
        self._buckets.clear()
        for d, (level, t) in saved.items():
            d = int(d)
            link = self._links[d] if 0 <= d < len(self._links) else None
            if link is None:
                raise ValueError(f"checkpoint clock has a link to rank {d}, which this run has not")
            b = self._buckets[d] = TokenBucket(link.bytes_per_s)
            b._level, b._t = float(level), None if t is None else float(t)


class Pacer:
    """A thread that runs callables at given ``time.monotonic()`` instants (``--wan real``).

    ``submit(at, fn)`` never blocks; ``fn`` runs in the pacer thread at ``at`` or as soon as
    possible after it (never before), in time order (ties in submission order). Timed waits wake
    late by a varying amount (docs/performance.md, "Pacer wake-up lateness"), so the pacer keeps a
    running estimate of that lateness, wakes that much early and yields in a loop for the
    remainder. The first exception raised by a callable is kept in ``error`` for the owner to report.
    """

    MAX_WAKE_LATE_S = 0.002
    """Upper bound of the wake-up lateness the pacer compensates by waking early and spinning."""

    def __init__(self, name: str = "geodml-pacer") -> None:
        self._wake_late_s = 1e-4  # running estimate of how late a timed wait wakes
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._busy = 0
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, at: float, fn: Callable[[], None]) -> None:
        with self._cond:
            assert not self._closed, "pacer is closed"
            heapq.heappush(self._heap, (at, next(self._seq), fn))
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap) + self._busy

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted callable has run; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._heap or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop the thread; callables not yet run are dropped. False if the thread is still
        inside a callable after ``timeout_s``."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._closed:
                    return
                if not self._heap:
                    self._cond.wait()
                    continue
                at = self._heap[0][0]
                left = at - time.monotonic()
                if left > self._wake_late_s:
                    # Timed waits wake late (timer slack, scheduling): aim early by the recent
                    # lateness, then yield-spin the rest, so a release is neither early nor late.
                    target = at - self._wake_late_s
                    if not self._cond.wait(left - self._wake_late_s):
                        late = min(max(time.monotonic() - target, 0.0), self.MAX_WAKE_LATE_S)
                        self._wake_late_s += 0.2 * (late - self._wake_late_s)
                    continue
                if left > 0:
                    self._cond.release()
                    time.sleep(0)  # yield the GIL and the lock while spinning
                    self._cond.acquire()
                    continue
                _, _, fn = heapq.heappop(self._heap)
                self._busy += 1
                self._cond.release()
                try:
                    fn()
                except BaseException as e:  # reported to the owner through .error
                    if self.error is None:
                        self.error = e
                finally:
                    self._cond.acquire()
                    self._busy -= 1
                    self._cond.notify_all()


class LinkPacing:
    """One rank's traffic in time under a ``--wan`` mode (module docstring): the emulated clock,
    each message's arrival (emulated) and release (wall, ``real``), collectives' exit and hold.

    ``links_out[d]`` is the link to rank d (None for this rank, or for every rank without a
    topology, which only ``--wan off`` allows). Used from the rank's own thread.
    """

    def __init__(self, wan: str, links_out: LinksOut) -> None:
        assert wan in WAN_MODES, wan  # validated by geodml.config.CommConfig
        self.wan = wan
        self.timed = wan != "off"
        """Whether the link model moves the clock (``virtual`` and ``real``)."""
        self.clock = EmulatedClock(links_out)
        self._links = links_out
        self._wall: dict[int, TokenBucket] | None = {} if wan == "real" else None  # wall FIFOs, per link used

    @property
    def now_s(self) -> float:
        return self.clock.now_s

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def plan(self, nbytes: int, dsts: Sequence[int], *, marker: bool) -> tuple[list[Target], list[float] | None]:
        """Where and when one ``nbytes`` message to each of ``dsts`` goes, and the link seconds each
        copy is charged (None: 0 each, ``--wan off``). Reserves the links: call it once per message
        that is then handed over, in send order."""
        if not self.timed:  # --wan off: nothing to model
            return [(d, 0.0, None) for d in dsts], None
        wall_now = time.monotonic() if self._wall is not None else 0.0
        targets: list[Target] = []
        link_s: list[float] = []
        for d in dsts:
            if marker:  # arrives at the sender's clock, no link time (module docstring)
                targets.append((d, self.clock.now_s, None))
                link_s.append(0.0)
                continue
            link = self._links[d]
            assert link is not None, "no link to self"
            release_at = None
            if self._wall is not None:
                bucket = self._wall.get(d)
                if bucket is None:
                    bucket = self._wall[d] = TokenBucket(link.bytes_per_s)
                release_at = bucket.reserve(nbytes, wall_now) + link.latency_s
            targets.append((d, self.clock.send(d, nbytes), release_at))
            link_s.append(link.transfer_s(nbytes))
        return targets, link_s

    def receive(self, arrival_s: float) -> None:
        """A message that arrives at emulated ``arrival_s`` was received."""
        if self.timed:
            self.clock.receive(arrival_s)

    def leave_collective(self, start_s: float, duration_s: float, wall_start: float,
                         sleep: Callable[[float], None] = time.sleep) -> None:
        """Leave a collective that every rank entered by emulated ``start_s`` and that takes
        ``duration_s``; under ``real``, first wait until ``duration_s`` has passed since
        ``wall_start`` (``time.monotonic()`` once the ranks were synchronized), with ``sleep``
        (seconds; the engine's hub lets the process's other partitions run meanwhile)."""
        self.clock.collective(start_s, duration_s)
        if self._wall is not None:
            left = wall_start + duration_s - time.monotonic()
            if left > 0:
                sleep(left)

    def state_dict(self) -> dict:
        """The emulated clock (``--wan real`` wall pacing restarts fresh)."""
        return self.clock.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.clock.load_state_dict(state)


class PacedSend:
    """A :class:`Pacer` job: hand one message to one peer at its release time.

    ``send_now(dst, frames, message)`` runs in the pacer thread; ``frames`` are the message's
    private frames (dropped after the call, so their memory is freed as soon as the transport
    is done), ``message`` is passed through (the sender's description of it, for errors).
    """

    __slots__ = ("send_now", "dst", "frames", "message")

    def __init__(self, send_now: Callable[[int, list, Any], None], dst: int, frames: list, message: Any) -> None:
        self.send_now, self.dst, self.frames, self.message = send_now, dst, frames, message

    def __call__(self) -> None:
        try:
            self.send_now(self.dst, self.frames, self.message)
        finally:
            self.frames = []
