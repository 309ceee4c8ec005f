"""ZeroMQ peer transport: sockets, addressing, and handing messages (geodml.comm.wire) to them.

Sockets. Each rank binds one PULL socket and connects one PUSH socket to every peer's PULL.
Traffic is one-way (an algorithm sends updates and later receives its peers'), so no
request/reply pattern is needed; a PUSH connected to exactly one peer is a dedicated ordered
pipe with its own back-pressure, and the PULL fair-queues all peers so none can starve
another. ROUTER/DEALER would add identity frames and a ROUTER drops messages for peers it
does not (yet) know, where PUSH queues them until the peer connects: nothing is lost.

Addresses. The PULL binds ``tcp://HOST:<random port>``; HOST is ``bind_host`` (``--bind-host``;
a host name is resolved to its address; ``*``/``0.0.0.0`` binds every interface and advertises
the default address) or, by default, this node's address on the interface that routes to
``MASTER_ADDR`` (so 127.0.0.1 when the master is this machine over loopback, the node's LAN
address in a multi-node run); see :func:`default_bind_host`. Every rank publishes its address in the
torch.distributed store under ``geodml/comm/<n>/addr/<rank>`` (n counts the transports this
process built, identically on every rank) and reads its peers' addresses from there. Under
``--wire-auth on`` the transport takes the run's 32-byte secret from its caller: ``build_comm``
has rank 0 draw it and broadcasts it over the process group, so it never sits in the store
(torchrun ``--standalone`` binds the store on every interface; docs/reliability.md).

Frames. A message goes as one multipart ZeroMQ message in the wire format (geodml.comm.wire):
envelope + trailer in frame 0 (one frame less to send), one frame per array. Arrays of
:data:`ZERO_COPY_MIN_BYTES` (64 KiB) or more are handed to ZeroMQ without copying (``zmq.Frame``
over the array's memory; no ``tobytes()``); smaller ones are copied, which is cheaper than
tracking (for ``send()``, which waits for the hand-over, below :data:`ZERO_COPY_MIN_BYTES_WAIT`,
128 KiB). The frames are sent one ``Socket.send`` each and received one ``Socket.recv`` each,
following ``Frame.more``. On receipt ``np.frombuffer`` views each frame: the arrays are views of
the received frames (no copy; each message has its own frames, so they belong to the receiver).
The measurements behind these choices: docs/performance.md, "Zero-copy hand-over and
copy thresholds".

Ownership. :meth:`PeerTransport.send` returns when ZeroMQ has released the arrays' memory
(the bytes are in the kernel), so the caller may overwrite its buffers at once, as after
``torch.distributed.send``: an algorithm that refills a preallocated buffer, or sends its
live parameters, can never ship a half-overwritten tensor. pyzmq frees a zero-copy frame
through its garbage-collector thread; the hand-over signal rides on that: the last zero-copy
array is sent as a fresh view whose weakref callback releases a lock that ``send`` blocks on
(:func:`_release_signal`), much cheaper than a ``zmq.MessageTracker``. That hand-over wait costs
a streaming sender some throughput, so ``send(..., wait=False)`` returns at once instead and
:meth:`PeerTransport.flush` waits for every such message; until then the arrays must not be
written. Messages released later by the ``--wan real`` pacer (geodml.comm.pacing) are copied
first (negligible next to the paced WAN time), so the caller's arrays are free at once in that
mode; then every send, markers too, goes through the pacer thread, so the order in which the
trailers' sequence numbers are assigned is the wire order.

Receiving. There is no receiver thread: ZeroMQ's own I/O thread already receives in the
background. :meth:`PeerTransport.recv` returns a queued message if one matches, else
receives from the PULL socket in the caller's thread (blocking inside ZeroMQ with the GIL
released, up to the deadline), queueing every message per (src, kind, step) in arrival
order, until the one asked for is there. A Python receiver thread would only add GIL
hand-offs. Messages for later steps (or other kinds) stay queued until asked for:
out-of-order messages are buffered, not lost. Every wait has a deadline; a peer that sends
nothing raises :class:`CommTimeoutError` naming it.

Rejected messages. Every received message is checked before anything is parsed or applied:
size (``max_message_bytes``; ZeroMQ's ``MAXMSGSIZE`` drops single frames above it by
disconnecting their sender), then the wire checks (geodml.comm.wire). A message that fails is
dropped, counted in :attr:`PeerTransport.rejected` by reason (:data:`REJECT_REASONS`; exported as
``geodml_wire_rejected_messages_total{reason}``) and reported once per reason on stderr; the
rank carries on.

Shutdown. :meth:`PeerTransport.close` is idempotent: it waits (bounded) for paced messages
to be released, closes the PUSH sockets with a linger of at most 5 s (a message sent just
before close still leaves; a dead peer cannot hang shutdown), the PULL with linger 0, and
terminates the context. A finalizer does the same at interpreter exit if close was not called.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import itertools
import math
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import zmq

from geodml.comm.api import CommError, CommTimeoutError
from geodml.comm.pacing import PacedSend, Pacer, Target
from geodml.comm.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_ARRAYS,
    REJECT_REASONS,
    Incoming,
    Outgoing,
    Rejected,
    WireCodec,
)
from geodml.config import WIRE_AUTH_MODES

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = ["PeerTransport", "CommError", "CommTimeoutError", "default_bind_host", "REJECT_REASONS",
           "ZERO_COPY_MIN_BYTES", "ZERO_COPY_MIN_BYTES_WAIT", "CLOSE_LINGER_S"]

_SNDMORE = zmq.SNDMORE
ZERO_COPY_MIN_BYTES = 65536
"""Arrays at least this large are sent without copying; smaller ones are copied (cheaper)."""
ZERO_COPY_MIN_BYTES_WAIT = 131072
"""The same for ``send(wait=True)``, which also waits for ZeroMQ to release the memory: below
128 KiB copying is cheaper than that wait (docs/performance.md, "Zero-copy hand-over")."""
_DRAIN_MAX = 1024  # messages taken after a deadline before giving up (a flood cannot stall a timeout)
CLOSE_LINGER_S = 5.0
"""Longest time close() lets queued outgoing messages drain (ZeroMQ linger)."""

_namespace_counter = itertools.count()


def default_bind_host() -> str:
    """The address this rank binds and advertises when ``--bind-host`` is not given.

    The local address of the interface that routes to ``MASTER_ADDR`` (found with a UDP
    ``connect``, which sends nothing): 127.0.0.1 when the master is reached over loopback,
    the node's LAN address in a multi-node run. Without ``MASTER_ADDR``: 127.0.0.1 if all ranks
    are on this node (``LOCAL_WORLD_SIZE == WORLD_SIZE``), else this host name's address.
    """
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            infos = socket.getaddrinfo(master, int(os.environ.get("MASTER_PORT", "29500")), type=socket.SOCK_DGRAM)
            family, _, _, _, addr = infos[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                return s.getsockname()[0]
        except OSError:
            pass
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if local is None or local == world:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def _resolve(host: str) -> str:
    """An IP address for ``host`` (ZeroMQ binds interfaces or addresses, not DNS names)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as e:
        raise ValueError(f"--bind-host {host!r} is neither an IP address nor a resolvable host name: {e}") from None


def _tcp_endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _describe(rank: int, *, region_of_rank: Sequence[str], addresses: Sequence[str]) -> str:
    """A peer as error messages name it: rank, region and address."""
    return f"rank {rank} (region {region_of_rank[rank]}, {addresses[rank] or 'address unknown'})"


class PeerTransport:
    """One rank's ZeroMQ endpoint (see the module docstring). Use from one thread only."""

    def __init__(self, *, rank: int, world_size: int, store: Store, bind_host: str | None = None,
                 timeout_s: float = 60.0, region_of_rank: Sequence[str] | None = None, paced: bool = False,
                 wire_auth: str = "on", max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 secret: bytes | None = None) -> None:
        assert 0 <= rank < world_size
        # wire_auth and the message size limit are validated by geodml.config.CommConfig
        assert wire_auth in WIRE_AUTH_MODES and isinstance(max_message_bytes, int) and max_message_bytes >= 1024
        if wire_auth == "on" and not (isinstance(secret, bytes) and len(secret) == 32):
            raise ValueError("PeerTransport: --wire-auth on needs the run's 32-byte secret (build_comm shares one "
                             "over the process group; it is never put in the store)")
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.wire_auth = wire_auth
        self.max_message_bytes = max_message_bytes
        self._secret = secret if wire_auth == "on" else None
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        """Received messages dropped, by reason (see :data:`REJECT_REASONS`)."""
        self.region_of_rank = (list(region_of_rank) if region_of_rank is not None
                               else [f"?{r}" for r in range(world_size)])
        self._closed = False
        self._pending: dict[tuple[int, str, int], deque[Incoming]] = {}
        self._rcvtimeo_ms = -1
        self._in_flight: deque[tuple[tuple, Outgoing, list[int]]] = deque()
        self.addresses = [""] * world_size
        self._codec = WireCodec(rank=rank, world_size=world_size, max_message_bytes=max_message_bytes,
                                describe_peer=functools.partial(_describe, region_of_rank=self.region_of_rank,
                                                                addresses=self.addresses))
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._push: dict[int, zmq.Socket] = {}
        self.pacer: Pacer | None = Pacer(name=f"geodml-pacer-{rank}") if paced else None
        # Releases sockets, context and pacer thread on close(), garbage collection or exit.
        self._finalizer = weakref.finalize(self, _shutdown, self._ctx, self._pull, self._push, self.pacer)
        try:
            self._setup(store, bind_host or default_bind_host())
        except BaseException:
            self.close()
            raise

    def _setup(self, store: Store, bind_host: str) -> None:
        timeout_ms = max(1, int(self.timeout_s * 1000))
        if bind_host in ("*", "0.0.0.0", "::"):  # all interfaces; advertise the default address
            bind_ip, advertise = bind_host, _resolve(default_bind_host())
        else:
            bind_ip = advertise = _resolve(bind_host)
        ipv6 = ":" in bind_ip or ":" in advertise
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.IPV6, int(ipv6))
        # Per frame: ZeroMQ disconnects a sender of a larger frame before buffering it.
        self._pull.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        wildcard = "*" if bind_ip in ("*", "0.0.0.0", "::") else None
        port = self._pull.bind_to_random_port(f"tcp://{wildcard}" if wildcard else
                                              (f"tcp://[{bind_ip}]" if ":" in bind_ip else f"tcp://{bind_ip}"))
        self.address = _tcp_endpoint(advertise, port)
        base = f"geodml/comm/{next(_namespace_counter)}"
        ns = f"{base}/addr"
        store.set(f"{ns}/{self.rank}", self.address)
        self.addresses[self.rank] = self.address
        deadline = time.monotonic() + self.timeout_s
        for r in range(self.world_size):
            if r == self.rank:
                continue
            left = deadline - time.monotonic()
            try:
                store.wait([f"{ns}/{r}"], datetime.timedelta(seconds=max(left, 0.001)))
            except Exception:  # the store raises its own timeout type
                missing = [p for p in range(self.world_size) if p != self.rank and not store.check([f"{ns}/{p}"])]
                raise CommTimeoutError(
                    f"rank {self.rank}: rank(s) {', '.join(map(str, missing)) or r} did not publish their ZeroMQ "
                    f"address within {self.timeout_s:g} s (they did not build their Comm: crashed or still starting)"
                ) from None
            self.addresses[r] = store.get(f"{ns}/{r}").decode()
        if self._secret is not None:
            self._codec.set_mac_key(self._secret)
        for r, addr in enumerate(self.addresses):
            if r == self.rank:
                continue
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, int(min(self.timeout_s, CLOSE_LINGER_S) * 1000))
            s.setsockopt(zmq.SNDTIMEO, timeout_ms)
            s.setsockopt(zmq.IPV6, int(addr.startswith("tcp://[")))
            s.copy_threshold = ZERO_COPY_MIN_BYTES  # send(copy=False) copies exactly the smaller arrays
            s.connect(addr)
            self._push[r] = s

    # ---- naming peers in errors ------------------------------------------------------
    def describe(self, rank: int) -> str:
        return _describe(rank, region_of_rank=self.region_of_rank, addresses=self.addresses)

    @property
    def _mac_key(self) -> bytes:
        """The run's wire secret (b"" under ``--wire-auth off``)."""
        return self._codec.mac_key

    @property
    def _recv_seq(self) -> list[int]:
        """Last sequence number accepted from each peer (the wire codec's)."""
        return self._codec.recv_seq

    def _check_open(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: the transport is closed")
        if self.pacer is not None and self.pacer.error is not None:
            err = self.pacer.error
            raise CommError(f"rank {self.rank}: a paced send failed: {err}") from err

    # ---- sending ---------------------------------------------------------------------
    def prepare(self, kind: str, step: int, arrays: Sequence[np.ndarray]) -> Outgoing:
        """Describe a message of C-contiguous ``arrays`` (see :func:`geodml.comm.wire.as_array`);
        nothing is copied. ``TypeError``/``ValueError`` as :func:`geodml.comm.wire.describe`."""
        return self._codec.prepare(kind, step, arrays)

    def send(self, out: Outgoing, targets: Sequence[Target], *, wait: bool = True) -> None:
        """Send ``out`` to every ``(dst, arrival_s, release_at)`` of ``targets``.

        ``release_at`` None: now, zero-copy. With ``wait`` (default) this returns once ZeroMQ has
        released the arrays (the caller may overwrite them); without, at once, and the arrays
        must stay untouched until :meth:`flush` returns. ``release_at`` given: the pacer sends a
        private copy at ``time.monotonic() == release_at`` (the caller's arrays are free at once).
        """
        self._check_open()
        if self.pacer is not None:
            # One thread per socket: the pacer sends everything (also unpaced messages such as
            # markers, released now), so sequence numbers are assigned in wire order.
            now = time.monotonic()
            owned = [p.copy() for p in out.payloads]  # one private copy for every destination (never written)
            label = (out.kind, out.step, out.digest)  # not `out`: the caller's arrays are free at once
            for dst, arrival_s, release_at in targets:
                self.pacer.submit(now if release_at is None else release_at,
                                  PacedSend(self._send_paced, dst, [out.envelope(arrival_s), *owned], label))
            return
        now_targets = targets
        parts, view = _parts(out.payloads, shared=len(now_targets) > 1, wait=wait)
        for dst, arrival_s, release_at in now_targets:
            assert release_at is None, "paced send needs a transport built with paced=True"
            envelope = out.envelope(arrival_s)
            try:
                _send_parts(self._push[dst], envelope + self._codec.trailer(envelope, out.digest, dst), parts)
            except zmq.Again:
                raise CommTimeoutError(
                    f"rank {self.rank}: {self.describe(dst)} did not accept the {out.kind!r} message for step "
                    f"{out.step} within {self.timeout_s:g} s: its queue is full (it is not receiving)") from None
        if view is None:
            return
        # Set up the signal now that ZeroMQ's I/O thread is writing (we hold the view, so it
        # cannot fire early), then drop our references: it fires once ZeroMQ's are gone too.
        released = _release_signal(view)
        del parts, view
        if wait:
            if not released[0].acquire(timeout=self.timeout_s):
                raise CommTimeoutError(self._not_taken(out, [t[0] for t in now_targets], f"{self.timeout_s:g} s"))
        else:
            # ZeroMQ releases messages in order: drop the finished ones from the front.
            in_flight = self._in_flight
            while in_flight and not in_flight[0][0][0].locked():
                in_flight.popleft()
            in_flight.append((released, out, [t[0] for t in now_targets]))

    def _send_paced(self, dst: int, frames: list, label: tuple[str, int, bytes]) -> None:
        """Send a paced message (kind, step, digest) now, in the pacer thread: the one thread that
        sends then, and the trailer is made here, so sequence numbers follow the wire order."""
        kind, step, digest = label
        try:
            frames[0] += self._codec.trailer(frames[0], digest, dst)
            self._push[dst].send_multipart(frames, copy=False)
        except zmq.Again:
            raise CommTimeoutError(f"rank {self.rank}: {self.describe(dst)} did not accept the paced {kind!r} "
                                   f"message for step {step} within {self.timeout_s:g} s") from None

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until ZeroMQ has released the arrays of every ``send(wait=False)`` so far."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while self._in_flight:
            (lock, _), out, dsts = self._in_flight[0]
            if not lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                raise CommTimeoutError(self._not_taken(out, dsts, "the flush timeout"))
            self._in_flight.popleft()

    def _not_taken(self, out: Outgoing, dsts: list[int], within: str) -> str:
        who = ", ".join(self.describe(d) for d in dsts)
        return (f"rank {self.rank}: the {out.kind!r} message for step {out.step} ({out.nbytes} B) was not taken by "
                f"{who} within {within} (peer unreachable or not running)")

    # ---- receiving -------------------------------------------------------------------
    def recv(self, src: int, kind: str, step: int, timeout_s: float | None = None) -> Incoming:
        """The next message from ``src`` of ``kind`` for ``step``; waits at most ``timeout_s``."""
        key = (src, kind, step)
        q = self._pending.get(key)
        if q and not self._closed:
            msg = q.popleft()
            if not q:
                del self._pending[key]
            return msg
        self._check_open()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + timeout
        while True:  # the common case: the next message on the socket is the one asked for
            left = deadline - time.monotonic()
            if left <= 0:
                for _ in range(_DRAIN_MAX):  # queue whatever is already there, then look once more
                    if not self._receive(0):
                        break
                if self._pending.get(key):
                    return self.recv(src, kind, step, 0)
                raise CommTimeoutError(self._timeout_message([src], kind, step, timeout))
            got = self._receive(max(1, math.ceil(left * 1000)), want=key)
            if got is not None:
                return got
            self._check_open()

    def recv_many(self, srcs: Sequence[int], kind: str, step: int,
                  timeout_s: float | None = None) -> dict[int, Incoming]:
        """One message of ``kind`` for ``step`` from each of ``srcs``."""
        self._check_open()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + timeout
        got: dict[int, Incoming] = {}
        want = [s for s in srcs]
        drained = 0
        while True:
            for s in want:
                if s not in got:
                    q = self._pending.get((s, kind, step))
                    if q:
                        got[s] = q.popleft()
                        if not q:
                            del self._pending[(s, kind, step)]
            if len(got) == len(want):
                return got
            left = deadline - time.monotonic()
            if left <= 0 and drained < _DRAIN_MAX and self._receive(0):
                drained += 1
                continue  # something was already waiting in the socket: look at it first
            if left <= 0:
                missing = [s for s in want if s not in got]
                # Put back what we took, so a caller that handles the timeout loses nothing.
                for s, m in got.items():
                    self._pending.setdefault((s, kind, step), deque()).appendleft(m)
                raise CommTimeoutError(self._timeout_message(missing, kind, step, timeout))
            self._receive(max(1, math.ceil(left * 1000)))
            self._check_open()

    def recv_any(self, timeout_s: float) -> Incoming | None:
        """The oldest queued message of any (src, kind, step), else the next one from the socket
        within ``timeout_s``; None if none came (a dispatcher's loop: geodml.comm.crossproc)."""
        self._check_open()
        if not self._pending:
            self._receive(max(1, math.ceil(timeout_s * 1000)))
        for key, q in self._pending.items():
            msg = q.popleft()
            if not q:
                del self._pending[key]
            return msg
        return None

    @overload
    def _receive(self, timeout_ms: int, want: tuple[int, str, int]) -> Incoming | None: ...

    @overload
    def _receive(self, timeout_ms: int, want: None = None) -> bool: ...

    def _receive(self, timeout_ms: int, want: tuple[int, str, int] | None = None) -> Incoming | bool | None:
        """Take the next message from the socket, blocking in ZeroMQ (GIL released) at most
        ``timeout_ms`` (0: only if one is already there). With ``want``: return it if it is
        that (src, kind, step), else queue it and return None. Without: queue it and return
        whether one came. A message that fails the checks (module docstring, Rejected messages) is
        dropped and counted; it counts as "one came" (the caller looks again, bounded)."""
        if timeout_ms >= 16:  # round down to 4 significant bits, so that RCVTIMEO rarely changes
            timeout_ms &= -1 << (timeout_ms.bit_length() - 4)  # (waking early only means one more loop)
        if timeout_ms != self._rcvtimeo_ms:
            self._pull.setsockopt(zmq.RCVTIMEO, timeout_ms)
            self._rcvtimeo_ms = timeout_ms
        pull = self._pull
        try:
            head = pull.recv(0, False)  # a zmq.Frame, no copy; .more says whether parts follow
        except zmq.Again:
            return None if want is not None else False
        frames = [head]
        more = head.more
        if more:
            total, limit, over = len(head), self.max_message_bytes, False
            while more:  # the rest of a multipart message is already here (ZeroMQ delivers it whole)
                f = pull.recv(0, False)
                more = f.more
                total += len(f)
                if not over:
                    frames.append(f)
                    if len(frames) > MAX_ARRAYS + 1 or total > limit:
                        over, frames = True, []  # drain the remaining parts, keep none
            if over:
                self._reject("oversized", f"{total} B in its frames (limit {limit} B)" if total > limit
                             else f"more than {MAX_ARRAYS} arrays")
                return None if want is not None else True
        msg = self._decode(frames)
        if msg is None:
            return None if want is not None else True
        key = (msg.src, msg.kind, msg.step)
        if want is not None and key == want:
            return msg
        self._pending.setdefault(key, deque()).append(msg)
        return None if want is not None else True

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        if self.rejected[reason] == 1:
            print(f"geodml: warning: rank {self.rank} dropped a {reason} message on its ZeroMQ socket ({detail}); "
                  f"further ones are counted in geodml_wire_rejected_messages_total{{reason=\"{reason}\"}}",
                  file=sys.stderr, flush=True)

    def _decode(self, frames: list) -> Incoming | None:
        """The message in ``frames`` if it passes every wire check, else None (dropped and
        counted). Never raises on anything a peer can send."""
        try:
            return self._codec.check(frames)
        except Rejected as r:
            self._reject(r.reason, r.detail)
        except Exception as e:  # a check this code did not foresee: still only a dropped message
            self._reject("malformed", f"{type(e).__name__}: {e}")
        return None

    def _timeout_message(self, missing: list[int], kind: str, step: int, timeout: float) -> str:
        parts = []
        for s in missing:
            queued = sorted((k, st) for (src, k, st) in self._pending if src == s)
            have = (f"; queued from it: {', '.join(f'{k}@{st}' for k, st in queued[:8])}"
                    f"{' ...' if len(queued) > 8 else ''}") if queued else "; nothing else queued from it"
            parts.append(f"{self.describe(s)}{have}")
        return (f"rank {self.rank}: no {kind!r} message for step {step} within {timeout:g} s from "
                f"{'; '.join(parts)}. That peer is silent, crashed, or sends a different kind/step.")

    def queued(self) -> list[tuple[int, str, int]]:
        """(src, kind, step) of every received message not yet asked for (oldest key order)."""
        return [k for k, q in self._pending.items() for _ in q]

    # ---- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent; see the module docstring."""
        if self._closed:
            return
        self._closed = True
        if self.pacer is not None:
            self.pacer.flush(min(self.timeout_s, 60.0))
        self._in_flight.clear()  # the PUSH linger below still lets their bytes leave
        self._finalizer()


def _send_parts(sock: zmq.Socket, head: bytes, parts: list[tuple[Any, bool]]) -> None:
    """One message on ``sock``: envelope + trailer, then each ``(part, copy)`` (see :func:`_parts`)."""
    if not parts:
        sock.send(head)
        return
    sock.send(head, _SNDMORE)
    for obj, copy in parts[:-1]:
        sock.send(obj, _SNDMORE, copy=copy)
    obj, copy = parts[-1]
    sock.send(obj, 0, copy=copy)


def _parts(payloads: list[np.ndarray], *, shared: bool, wait: bool) -> tuple[list[tuple[Any, bool]], np.ndarray | None]:
    """What to hand ``Socket.send`` for each payload, ``(object, copy)``, and the array to watch.

    Arrays of ZERO_COPY_MIN_BYTES or more (ZERO_COPY_MIN_BYTES_WAIT or more with ``wait``) go
    without copying, smaller ones are copied by ``send``. With ``shared`` (several destinations)
    the zero-copy ``zmq.Frame`` objects are built here once and shared by every destination.
    The last zero-copy array is sent as a fresh view of itself, returned second (None if every
    array is copied): pyzmq holds that view until libzmq frees the frame, so it dies exactly
    when ZeroMQ is done with the memory (see :func:`_release_signal`). ZeroMQ writes the frames
    of a message in order, to every destination in order, so when the last zero-copy frame is
    released all earlier ones are too. The caller must drop the parts and the view after
    sending: the view dies only when nothing refers to it.
    """
    min_bytes = ZERO_COPY_MIN_BYTES_WAIT if wait else ZERO_COPY_MIN_BYTES
    parts: list[tuple[Any, bool]] = [(p, p.nbytes < min_bytes) for p in payloads]
    last = len(parts) - 1
    while last >= 0 and parts[last][1]:
        last -= 1
    if last < 0:
        return parts, None
    view = payloads[last].view()
    parts[last] = (view, False)
    if shared:
        parts = [(p, True) if copy else (zmq.Frame(p, copy=False), False) for p, copy in parts]
    return parts, view


def _release_signal(view: np.ndarray) -> tuple[threading.Lock, weakref.ref]:
    """A held lock that is released when ``view`` dies, and the weakref that releases it.

    The weakref's callback runs in pyzmq's garbage-collector thread as it drops the view (the
    caller must hold the view until this returns). ``lock.acquire(timeout=...)`` is one
    blocking call, far cheaper than a ``zmq.MessageTracker`` (an Event with its Condition on
    both sides), and ``not lock.locked()`` polls it.
    """
    lock = threading.Lock()
    lock.acquire()

    def release(_ref: weakref.ref) -> None:
        lock.release()

    return lock, weakref.ref(view, release)


def _shutdown(ctx: zmq.Context, pull: zmq.Socket, push: dict, pacer: Pacer | None) -> None:
    if pacer is not None and not pacer.close():
        return  # the pacer thread is wedged in a send: leak the sockets rather than hang or crash
    for s in push.values():
        s.close()
    pull.close(linger=0)
    ctx.term()
