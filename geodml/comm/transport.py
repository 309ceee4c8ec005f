"""ZeroMQ peer transport: step-tagged, zero-copy messages between the ranks of one run.

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
process built, identically on every rank) and reads its peers' addresses from there.

Messages. A multipart ZeroMQ message: frame 0 is a msgpack envelope
``[1, kind, step, src, arrival_s, [[dtype.str, shape], ...]]`` (``arrival_s`` is always a
float64, so the envelope size does not depend on it) followed in the same frame by a 56-byte
security trailer (see Wire security; one frame less to send), then one frame per array
holding its raw bytes. The ledger charges envelope +
arrays (the emulated system's message); the trailer, like ZeroMQ's and TCP's framing, is the
emulator's own transport overhead and is not charged, so byte counts do not depend on
``--wire-auth``. Arrays of 64 KiB or more are handed to ZeroMQ without copying (``zmq.Frame`` over
the array's memory; no ``tobytes()``); smaller ones are copied, which is cheaper than tracking
(for ``send()``, which waits for the hand-over, below 128 KiB: see Costs). On receipt
``np.frombuffer`` views each frame: the arrays are views of the received frames (no copy;
each message has its own frames, so they belong to the receiver).

Ownership. :meth:`PeerTransport.send` returns when ZeroMQ has released the arrays' memory
(the bytes are in the kernel), so the caller may overwrite its buffers at once, as after
``torch.distributed.send``: an algorithm that refills a preallocated buffer, or sends its
live parameters, can never ship a half-overwritten tensor. That hand-over wait costs a
streaming sender some throughput (see ``python -m geodml.bench transport``), so
``send(..., wait=False)`` returns at once instead and :meth:`PeerTransport.flush` waits for
every such message; until then the arrays must not be written. Messages released later by
the ``--wan real`` pacer are copied first (negligible next to the paced WAN time), so the
caller's arrays are free at once in that mode.

Costs (2-core VM, loopback, ``python -m geodml.bench transport``: 1 MB messages of two 500 KB
arrays, ratios to raw pyzmq ``send_multipart(copy=False)`` that does not wait). pyzmq frees a
zero-copy frame through its garbage-collector thread; the hand-over signal rides on that: the
last zero-copy array is sent as a fresh view whose weakref callback releases a lock that
``send`` blocks on (:func:`_release_signal`), much cheaper than a ``zmq.MessageTracker`` (an Event per
message; with it ``send()`` reached 0.64-0.73x, raw pyzmq itself with ``track=True`` and a wait
per message ~0.8x). Copying instead of waiting was measured and is slower for large arrays:
``copy=True`` 0.60-0.68x (libzmq mallocs every frame and the fresh memory page-faults: 35-76
faults and 230-330 us of sender CPU per 1 MB message, against 17-35 us zero-copy); copying
into reused, pre-faulted buffers sent without waiting 0.58x (a cache-cold 1 MB memcpy is
~120 us, more than the wait). For ``send()`` of smaller arrays the fixed cost of the wait
dominates; ratios copy vs zero-copy, two arrays per message: 64 KiB arrays 0.74x vs 0.48x,
96 KiB 0.75x vs 0.53x, 128 KiB 0.72x vs 0.66x, 192 KiB 0.63x vs 0.69x, hence
ZERO_COPY_MIN_BYTES_WAIT = 128 KiB (``wait=False`` pays no wait, so it keeps 64 KiB). The
frames are sent one ``Socket.send`` each (``send_multipart`` adds Python work per frame) and
received one ``Socket.recv`` each, following ``Frame.more``.

Receiving. There is no receiver thread: ZeroMQ's own I/O thread already receives in the
background. :meth:`PeerTransport.recv` returns a queued message if one matches, else
receives from the PULL socket in the caller's thread (blocking inside ZeroMQ with the GIL
released, up to the deadline), queueing every message per (src, kind, step) in arrival
order, until the one asked for is there. A Python receiver thread would only add GIL hand-offs. Messages for later steps
(or other kinds) stay queued until asked for: out-of-order messages are buffered, not lost.
Every wait has a deadline; a peer that sends nothing raises :class:`CommTimeoutError` naming it.

Wire security (``--wire-auth on``, the default; docs/reliability.md "Wire security"). Rank 0
draws a 32-byte secret per transport and shares it through the torch.distributed store (the
run's rendezvous: whoever can read it can join the process group anyway). The trailer is
``seq`` (uint64, big-endian), ``dst`` (uint32), ``src`` (uint32), ``mid`` (uint64) and a
32-byte tag = keyed BLAKE2b(secret, ``seq || dst || src || mid || envelope || mid ||
GMAC(arrays)``). GMAC is AES-256-GCM with the arrays as associated data and nothing encrypted,
under a bulk key = keyed BLAKE2b(secret, "geodml bulk GMAC key"), with the 96-bit nonce
``src || mid``; ``mid`` counts the messages a rank prepares, so no nonce repeats under a key,
and one GMAC serves every destination of a message. (It was SHA-256 of the arrays until
2026-11-23: GMAC costs 0.15 ms per MB here against SHA-256's 0.66 ms with SHA-NI.)
``seq`` counts the messages this rank sent to
``dst`` in the order they enter the socket (under ``--wan real`` every send, markers too, goes
through the pacer thread, so that order is the wire order); a receiver accepts from ``src``
only a ``seq`` above the last one it accepted. Measured (1 MB, this VM): SHA-256 1.0 ms
(SHA-NI), keyed BLAKE2b 2.3 ms, HMAC-SHA256 1.05 ms; on ~80 B keyed BLAKE2b 1.9 us vs HMAC 5 us
(one compression vs four); ZeroMQ CURVE streamed 1 MB at 0.1-0.7 GB/s vs 1.8-2.4 GB/s plain,
and it encrypts, which nothing here needs. Hence a fast MAC over the bulk (once per message,
shared by every destination: GMAC, 0.15 ms per MB with AES-NI and carry-less multiply) and a
keyed BLAKE2b MAC over the short rest. The receiver checks the trailer's ``src`` against the
envelope's once the tag has passed. Every received message is
checked before anything is parsed or applied: size (``max_message_bytes``; ZeroMQ's
``MAXMSGSIZE`` drops single frames above it by disconnecting their sender), tag, envelope
structure, field types (known kind, integer step, numeric dtypes, shapes that match the
frames), source/destination, sequence. A message that fails is dropped, counted in
:attr:`PeerTransport.rejected` by reason (:data:`REJECT_REASONS`; exported as
``geodml_wire_rejected_messages_total{reason}``) and reported once per reason on stderr; the
rank carries on. ``--wire-auth off`` skips the tag (the trailer is still sent and every other
check still runs) -- for trusted networks and for measuring what authentication costs.

Shutdown. :meth:`PeerTransport.close` is idempotent: it waits (bounded) for paced messages
to be released, closes the PUSH sockets with a linger of at most 5 s (a message sent just
before close still leaves; a dead peer cannot hang shutdown), the PULL with linger 0, and
terminates the context. A finalizer does the same at interpreter exit if close was not called.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import re
import secrets
import struct
import sys
import itertools
import math
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence

import msgpack
import numpy as np
import zmq

from geodml.comm.ledger import KINDS
from geodml.comm.wan import Pacer

PROTOCOL_VERSION = 1
_SNDMORE = zmq.SNDMORE
ZERO_COPY_MIN_BYTES = 65536
"""Arrays at least this large are sent without copying; smaller ones are copied (cheaper)."""
ZERO_COPY_MIN_BYTES_WAIT = 131072
"""The same for ``send(wait=True)``, which also waits for ZeroMQ to release the memory: below
128 KiB copying is cheaper than that wait (measured; see the module docstring)."""
WIRE_AUTH_MODES = ("on", "off")
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest message (all frames) a rank sends or accepts unless told otherwise (``--max-message-mb``)."""
MAX_ARRAYS = 4096
"""Most arrays one message may carry (a cap on what a hostile sender can make a receiver list)."""
MAX_ENVELOPE_BYTES = 1 << 20
TAG_BYTES = 32
_TRAILER = struct.Struct(">QIIQ")  # seq, dst, src, message id; then the tag
_NONCE = struct.Struct(">IQ")  # src, message id: the bulk MAC's 96-bit GCM nonce
_MID = struct.Struct(">Q")
TRAILER_BYTES = _TRAILER.size + TAG_BYTES
_NO_TAG = bytes(TAG_BYTES)
REJECT_REASONS = ("oversized", "malformed", "unauthenticated", "wrong_type", "unknown_peer", "replayed")
"""Why a received message was dropped: over the size limit; not a geodml message (framing,
msgpack, counts or sizes that do not add up); bad or missing tag; a field of the wrong type (kind,
step, dtype, shape); a source that is not another rank of this run, or addressed to another
rank; a sequence number not above the last one accepted from that source."""
_DRAIN_MAX = 1024  # messages taken after a deadline before giving up (a flood cannot stall a timeout)
_DTYPE_RE = re.compile(r"[<>|=]?[biuf][1248]")
CLOSE_LINGER_S = 5.0
"""Longest time close() lets queued outgoing messages drain (ZeroMQ linger)."""

_namespace_counter = itertools.count()
_DTYPES: dict[str, np.dtype] = {}
_DTYPE_STRS: dict[np.dtype, str] = {}


class CommError(RuntimeError):
    """A peer or the transport failed (protocol error, unreachable peer)."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait on a peer passed its deadline; the message names the peer."""


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
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise ValueError(f"--bind-host {host!r} is neither an IP address nor a resolvable host name: {e}") from None


def _tcp_endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class Outgoing:
    """A message ready to send: envelope fields, the arrays' bytes and its size on the wire.

    ``payloads``: the C-contiguous arrays themselves (ZeroMQ reads their memory; no copy).
    ``nbytes``: envelope + payload bytes, what the ledger charges and the link model carries.
    ``envelope0``: the envelope with arrival_s = 0.0 (same length as any other; reused under
    ``--wan off``).
    """

    __slots__ = ("kind", "step", "src", "descs", "payloads", "nbytes", "envelope0", "digest")

    def __init__(self, kind: str, step: int, src: int, descs: list, payloads: list[np.ndarray], nbytes: int,
                 envelope0: bytes = b"", digest: bytes = b"") -> None:
        self.kind, self.step, self.src, self.descs = kind, step, src, descs
        self.payloads, self.nbytes, self.envelope0 = payloads, nbytes, envelope0
        self.digest = digest  # message id (8 B) + GMAC of the arrays' bytes (b"" under --wire-auth off)

    def envelope(self, arrival_s: float) -> bytes:
        if arrival_s == 0.0 and self.envelope0:
            return self.envelope0
        return msgpack.packb([PROTOCOL_VERSION, self.kind, self.step, self.src, float(arrival_s), self.descs])


class Incoming:
    """A received message (``nbytes``: envelope + payload, as the sender charged it)."""

    __slots__ = ("src", "kind", "step", "arrival_s", "arrays", "nbytes")

    def __init__(self, src: int, kind: str, step: int, arrival_s: float, arrays: list[np.ndarray], nbytes: int) -> None:
        self.src, self.kind, self.step, self.arrival_s, self.arrays, self.nbytes = src, kind, step, arrival_s, arrays, nbytes


def envelope_nbytes(kind: str, step: int, src: int, arrays: Sequence[np.ndarray]) -> int:
    """Size of the msgpack envelope of a message (what ``Outgoing.nbytes`` adds to the payload)."""
    descs = [[a.dtype.str, list(a.shape)] for a in arrays]
    return len(msgpack.packb([PROTOCOL_VERSION, kind, step, src, 0.0, descs]))


def as_array(x: object) -> np.ndarray:
    """A C-contiguous numpy array for ``x`` (numpy array or CPU/GPU torch tensor), no copy if possible."""
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            torch = None
        if torch is not None and isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.dtype == torch.bfloat16:
                raise TypeError("bfloat16 tensors cannot be sent as numpy arrays; convert with .float() or .half()")
            a = t.resolve_conj().resolve_neg().numpy()
        else:
            raise TypeError(f"can only send numpy arrays or torch tensors, got {type(x).__name__}")
    if a.dtype.hasobject:
        raise TypeError(f"cannot send arrays of Python objects (dtype {a.dtype})")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a


class PeerTransport:
    """One rank's ZeroMQ endpoint (see the module docstring). Use from one thread only."""

    def __init__(self, *, rank: int, world_size: int, store, bind_host: str | None = None,
                 timeout_s: float = 60.0, region_of_rank: Sequence[str] | None = None, paced: bool = False,
                 wire_auth: str = "on", max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        assert 0 <= rank < world_size
        if wire_auth not in WIRE_AUTH_MODES:
            raise ValueError(f"--wire-auth: choose one of {', '.join(WIRE_AUTH_MODES)}, got {wire_auth!r}")
        if not (isinstance(max_message_bytes, int) and max_message_bytes >= 1024):
            raise ValueError(f"the maximum message size must be at least 1 KiB, got {max_message_bytes!r} bytes")
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.wire_auth = wire_auth
        self.max_message_bytes = max_message_bytes
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        """Received messages dropped, by reason (see :data:`REJECT_REASONS`)."""
        self._send_seq = [0] * world_size  # next sequence number towards each peer
        self._recv_seq = [-1] * world_size  # last sequence number accepted from each peer
        self._mac_key = b""
        self._next_mid = 0  # id of the next message this rank prepares (the bulk MAC's nonce)
        self.region_of_rank = list(region_of_rank) if region_of_rank is not None else [f"?{r}" for r in range(world_size)]
        self._closed = False
        self._pending: dict[tuple[int, str, int], deque[Incoming]] = {}
        self._rcvtimeo_ms = -1
        self._in_flight: deque[tuple[tuple, Outgoing, list[int]]] = deque()
        self.addresses = [""] * world_size
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

    def _setup(self, store, bind_host: str) -> None:
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
        if self.wire_auth == "on" and self.rank == 0:  # set before rank 0's address: seen before it
            store.set(f"{base}/key", secrets.token_bytes(32))
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
        if self.wire_auth == "on":
            self._mac_key = store.get(f"{base}/key")
            if len(self._mac_key) != 32:
                raise CommError(f"rank {self.rank}: the run's wire secret in the store has {len(self._mac_key)} bytes, not 32")
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
            bulk_key = hashlib.blake2b(b"geodml bulk GMAC key", key=self._mac_key, digest_size=32).digest()
            self._gcm_cipher, self._gcm_aes, self._gcm_mode = Cipher, algorithms.AES(bulk_key), modes.GCM
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
        addr = self.addresses[rank] or "address unknown"
        return f"rank {rank} (region {self.region_of_rank[rank]}, {addr})"

    def _check_open(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: the transport is closed")
        if self.pacer is not None and self.pacer.error is not None:
            err = self.pacer.error
            raise CommError(f"rank {self.rank}: a paced send failed: {err}") from err

    # ---- sending ---------------------------------------------------------------------
    def prepare(self, kind: str, step: int, arrays: Sequence[np.ndarray]) -> Outgoing:
        """Describe a message of C-contiguous ``arrays`` (see :func:`as_array`); nothing is copied."""
        payloads = list(arrays)
        descs = []
        nbytes = 0
        for a in payloads:
            dt = a.dtype
            dtype_str = _DTYPE_STRS.get(dt)
            if dtype_str is None:
                if not _DTYPE_RE.fullmatch(dt.str):
                    raise TypeError(f"cannot send {dt} arrays: only bool, integer and float arrays go on the wire")
                dtype_str = _DTYPE_STRS[dt] = dt.str
            descs.append([dtype_str, list(a.shape)])
            nbytes += a.nbytes
        if len(payloads) > MAX_ARRAYS:
            raise ValueError(f"a message carries at most {MAX_ARRAYS} arrays, got {len(payloads)}")
        envelope0 = msgpack.packb([PROTOCOL_VERSION, kind, step, self.rank, 0.0, descs])
        size = len(envelope0) + nbytes
        if size + TRAILER_BYTES > self.max_message_bytes:
            raise ValueError(f"a {kind!r} message of {size} B is larger than the maximum message size "
                             f"({self.max_message_bytes} B); raise --max-message-mb on every rank")
        digest = b""
        if self._mac_key:
            mid = self._next_mid
            self._next_mid = mid + 1
            digest = _MID.pack(mid) + self._bulk_mac(self.rank, mid, payloads)
        return Outgoing(kind, step, self.rank, descs, payloads, size, envelope0, digest)

    def _bulk_mac(self, src: int, mid: int, arrays) -> bytes:
        """GMAC (AES-256-GCM with the arrays as associated data, nothing encrypted) of a message's
        arrays under the run's bulk key; the nonce (src, message id) is never reused for a key."""
        e = self._gcm_cipher(self._gcm_aes, self._gcm_mode(_NONCE.pack(src, mid))).encryptor()
        for a in arrays:  # as byte views, no copy (cryptography refuses typed numpy buffers and Frames)
            if type(a) is np.ndarray:
                a = a.reshape(-1).view(np.uint8)
            elif isinstance(a, zmq.Frame):
                a = a.buffer
            e.authenticate_additional_data(a)
        e.finalize()
        return e.tag

    def _trailer(self, envelope: bytes, digest: bytes, dst: int) -> bytes:
        """The next security trailer towards ``dst`` (advances its sequence number)."""
        seq = self._send_seq[dst]
        self._send_seq[dst] = seq + 1
        if not self._mac_key:
            return _TRAILER.pack(seq, dst, self.rank, 0) + _NO_TAG
        head = _TRAILER.pack(seq, dst, self.rank, _MID.unpack_from(digest)[0])
        return head + hashlib.blake2b(head + envelope + digest, key=self._mac_key, digest_size=TAG_BYTES).digest()

    def send(self, out: Outgoing, targets: Sequence[tuple[int, float, float | None]], *, wait: bool = True) -> None:
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
            for dst, arrival_s, release_at in targets:
                self.pacer.submit(now if release_at is None else release_at,
                                  _PacedSend(self, dst, [out.envelope(arrival_s), *owned], out.kind, out.step,
                                             out.nbytes, out.digest))
            return
        now_targets = targets
        parts, view = _parts(out.payloads, shared=len(now_targets) > 1, wait=wait)
        for dst, arrival_s, release_at in now_targets:
            assert release_at is None, "paced send needs a transport built with paced=True"
            envelope = out.envelope(arrival_s)
            try:
                _send_parts(self._push[dst], envelope + self._trailer(envelope, out.digest, dst), parts)
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
            msg = self._receive(max(1, math.ceil(left * 1000)), want=key)
            if msg is not None:
                return msg
            self._check_open()

    def recv_many(self, srcs: Sequence[int], kind: str, step: int, timeout_s: float | None = None) -> dict[int, Incoming]:
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

    def _receive(self, timeout_ms: int, want: tuple[int, str, int] | None = None) -> Incoming | bool | None:
        """Take the next message from the socket, blocking in ZeroMQ (GIL released) at most
        ``timeout_ms`` (0: only if one is already there). With ``want``: return it if it is
        that (src, kind, step), else queue it and return None. Without: queue it and return
        whether one came. A message that fails the checks (module docstring, Wire security) is
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
        """The message in ``frames`` if it passes every check, else None (dropped and counted).
        Never raises on anything a peer can send."""
        try:
            return self._check(frames)
        except _Rejected as r:
            self._reject(r.reason, r.detail)
        except Exception as e:  # a check this code did not foresee: still only a dropped message
            self._reject("malformed", f"{type(e).__name__}: {e}")
        return None

    def _check(self, frames: list) -> Incoming:
        head = frames[0].bytes
        if len(head) <= TRAILER_BYTES:
            raise _Rejected("malformed", f"a {len(head)}-byte first frame: no envelope and {TRAILER_BYTES}-byte trailer")
        if len(head) > MAX_ENVELOPE_BYTES:
            raise _Rejected("oversized", f"a {len(head)} B envelope")
        env, trailer = head[:-TRAILER_BYTES], head[-TRAILER_BYTES:]
        seq, dst, tsrc, mid = _TRAILER.unpack_from(trailer)
        if self._mac_key:  # before anything is parsed: unauthenticated bytes never reach msgpack
            head = trailer[:_TRAILER.size]
            digest = head[-_MID.size:] + self._bulk_mac(tsrc, mid, frames[1:])
            tag = hashlib.blake2b(head + env + digest, key=self._mac_key, digest_size=TAG_BYTES).digest()
            if not hmac.compare_digest(tag, trailer[_TRAILER.size:]):
                raise _Rejected("unauthenticated", "its tag does not match this run's secret")
        try:
            fields = msgpack.unpackb(env)
        except Exception as e:
            raise _Rejected("malformed", f"not a geodml envelope: {type(e).__name__}") from None
        if type(fields) is not list or len(fields) != 6:
            raise _Rejected("malformed", "the envelope is not a 6-field list")
        version, kind, step, src, arrival_s, descs = fields
        if version != PROTOCOL_VERSION:
            raise _Rejected("malformed", f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
        if type(descs) is not list or len(descs) != len(frames) - 1:
            raise _Rejected("malformed", f"{len(descs) if type(descs) is list else 'no'} arrays described, "
                                         f"{len(frames) - 1} attached")
        if type(kind) is not str or kind not in KINDS:
            raise _Rejected("wrong_type", f"kind {kind!r}")
        if type(step) is not int or type(src) is not int or type(arrival_s) is not float:
            raise _Rejected("wrong_type", f"step {step!r}, src {src!r}, arrival_s {arrival_s!r}")
        if not (0 <= src < self.world_size) or src == self.rank or dst != self.rank:
            raise _Rejected("unknown_peer", f"from rank {src} to rank {dst}; this is rank {self.rank} of "
                                            f"{self.world_size}")
        if tsrc != src:
            raise _Rejected("malformed", f"the trailer names rank {tsrc} as its source, the envelope rank {src}")
        arrays = []
        nbytes = len(env)
        for i, desc in enumerate(descs, 1):
            if type(desc) is not list or len(desc) != 2:
                raise _Rejected("wrong_type", f"array description {desc!r}")
            dtype_str, shape = desc
            dt = _DTYPES.get(dtype_str) if type(dtype_str) is str else None
            if dt is None:
                if type(dtype_str) is not str or not _DTYPE_RE.fullmatch(dtype_str):
                    raise _Rejected("wrong_type", f"dtype {dtype_str!r}")
                dt = _DTYPES[dtype_str] = np.dtype(dtype_str)
            if (type(shape) is not list or len(shape) > 32
                    or not all(type(n) is int and n >= 0 for n in shape)):
                raise _Rejected("wrong_type", f"shape {shape!r}")
            f = frames[i]
            numel = shape[0] if len(shape) == 1 else math.prod(shape)
            if len(f) != numel * dt.itemsize:
                raise _Rejected("malformed", f"{kind!r} step {step} from {self.describe(src)} has {len(f)} bytes "
                                             f"for a {dtype_str}{tuple(shape)} array")
            a = np.frombuffer(f, dtype=dt)  # a view of the frame (the array keeps it alive)
            if len(shape) != 1:
                a = a.reshape(shape)
            if not a.flags.aligned:  # tiny frames live inside the zmq_msg_t and may be unaligned
                a = a.copy()
            arrays.append(a)
            nbytes += a.nbytes
        if seq <= self._recv_seq[src]:
            raise _Rejected("replayed", f"sequence number {seq} from rank {src}, already at {self._recv_seq[src]}")
        self._recv_seq[src] = seq
        return Incoming(src, kind, step, arrival_s, arrays, nbytes)

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


class _Rejected(Exception):
    """A received message fails a check (internal to the receive path)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class _PacedSend:
    """The pacer's job for one message to one peer (runs in the pacer thread)."""

    __slots__ = ("transport", "dst", "frames", "kind", "step", "nbytes", "digest")

    def __init__(self, transport: PeerTransport, dst: int, frames: list, kind: str, step: int, nbytes: int,
                 digest: bytes) -> None:
        self.transport, self.dst, self.frames = transport, dst, frames
        self.kind, self.step, self.nbytes, self.digest = kind, step, nbytes, digest

    def __call__(self) -> None:
        t = self.transport
        try:  # the trailer is made now, in the one thread that sends on this socket: wire order
            self.frames[0] += t._trailer(self.frames[0], self.digest, self.dst)
            t._push[self.dst].send_multipart(self.frames, copy=False)
        except zmq.Again:
            raise CommTimeoutError(f"rank {t.rank}: {t.describe(self.dst)} did not accept the paced {self.kind!r} "
                                   f"message for step {self.step} within {t.timeout_s:g} s") from None
        finally:
            self.frames = []


def _send_parts(sock: zmq.Socket, head: bytes, parts: list[tuple[object, bool]]) -> None:
    """One message on ``sock``: envelope + trailer, then each ``(part, copy)`` (see :func:`_parts`)."""
    if not parts:
        sock.send(head)
        return
    sock.send(head, _SNDMORE)
    for obj, copy in parts[:-1]:
        sock.send(obj, _SNDMORE, copy=copy)
    obj, copy = parts[-1]
    sock.send(obj, 0, copy=copy)


def _parts(payloads: list[np.ndarray], *, shared: bool, wait: bool) -> tuple[list[tuple[object, bool]], object]:
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
    parts = [(p, p.nbytes < min_bytes) for p in payloads]
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
    return lock, weakref.ref(view, lambda _ref, release=lock.release: release())


def _shutdown(ctx: zmq.Context, pull: zmq.Socket, push: dict, pacer: Pacer | None) -> None:
    if pacer is not None and not pacer.close():
        return  # the pacer thread is wedged in a send: leak the sockets rather than hang or crash
    for s in push.values():
        s.close()
    pull.close(linger=0)
    ctx.term()
