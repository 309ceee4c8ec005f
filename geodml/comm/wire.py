"""The wire format of point-to-point messages: envelope, security trailer and the receiver's
checks. Pure bytes in and out: no sockets, no clocks (geodml.comm.transport moves the frames).

Messages. A message is a list of frames: frame 0 is a msgpack envelope
``[1, kind, step, src, arrival_s, [[dtype.str, shape], ...]]`` (``arrival_s`` is always a
float64, so the envelope size does not depend on it) followed in the same frame by a 56-byte
security trailer, then one frame per array holding its raw bytes (C order). The ledger charges
envelope + arrays (:attr:`Outgoing.nbytes`: the emulated system's message); the trailer, like
ZeroMQ's and TCP's framing, is the emulator's own transport overhead and is not charged, so byte
counts do not depend on ``--wire-auth``. Only bool, integer and float arrays go on the wire.

Wire security (``--wire-auth on``, the default; docs/reliability.md "Wire security"). Every rank
of a run holds the run's 32-byte secret (the transport shares it). The trailer is ``seq``
(uint64, big-endian), ``dst`` (uint32), ``src`` (uint32), ``mid`` (uint64) and a 32-byte tag =
keyed BLAKE2b(secret, ``seq || dst || src || mid || envelope || mid || GMAC(arrays)``). GMAC is
AES-256-GCM with the arrays as associated data and nothing encrypted, under a bulk key = keyed
BLAKE2b(secret, "geodml bulk GMAC key"), with the 96-bit nonce ``src || mid``; ``mid`` counts
the messages a rank prepares, so no nonce repeats under a key, and one GMAC serves every
destination of a message. Why these two MACs (a fast one over the bulk, once per message, and a
keyed BLAKE2b over the short rest) and what they cost: docs/performance.md, "Wire security: MAC
choice".
``seq`` counts the messages this rank sent to ``dst`` in the order they enter the socket (the
transport seals a message as it hands it to the socket, so that order is the wire order); a
receiver accepts from ``src`` only a ``seq`` above the last one it accepted. ``--wire-auth off``
sends a zero tag and skips its check; every other check still runs.

The decoder's checks (:meth:`WireCodec.check`), before anything is parsed or applied: tag (before
msgpack sees a byte), envelope structure, field types (known kind, integer step, numeric dtypes,
shapes that match the frames), source/destination, the trailer's ``src`` against the envelope's,
sequence. A message that fails raises :class:`Rejected` with one of :data:`REJECT_REASONS`; the
size limit (``oversized``) is checked by the transport while it receives the frames.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from geodml.comm.ledger import KINDS

PROTOCOL_VERSION = 1
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
_DTYPE_RE = re.compile(r"[<>|=]?[biuf][1248]")

_DTYPES: dict[str, np.dtype] = {}
_DTYPE_STRS: dict[np.dtype, str] = {}


class Rejected(Exception):
    """A received message fails a check; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class Outgoing:
    """A message ready to send: envelope fields, the arrays' bytes and its size on the wire.

    ``payloads``: the C-contiguous arrays themselves (no copy). ``nbytes``: envelope + payload
    bytes, what the ledger charges and the link model carries. ``envelope0``: the envelope with
    arrival_s = 0.0 (same length as any other; reused under ``--wan off``). ``digest``: message
    id (8 B) + GMAC of the arrays (b"" under ``--wire-auth off``).
    """

    __slots__ = ("kind", "step", "src", "descs", "payloads", "nbytes", "envelope0", "digest")

    def __init__(self, kind: str, step: int, src: int, descs: list, payloads: list[np.ndarray], nbytes: int,
                 envelope0: bytes = b"", digest: bytes = b"") -> None:
        self.kind, self.step, self.src, self.descs = kind, step, src, descs
        self.payloads, self.nbytes, self.envelope0 = payloads, nbytes, envelope0
        self.digest = digest

    def envelope(self, arrival_s: float) -> bytes:
        if arrival_s == 0.0 and self.envelope0:
            return self.envelope0
        return _pack([PROTOCOL_VERSION, self.kind, self.step, self.src, float(arrival_s), self.descs])


class Incoming:
    """A received message (``nbytes``: envelope + payload, as the sender charged it)."""

    __slots__ = ("src", "kind", "step", "arrival_s", "arrays", "nbytes")

    def __init__(self, src: int, kind: str, step: int, arrival_s: float, arrays: list[np.ndarray], nbytes: int) -> None:
        self.src, self.kind, self.step, self.arrival_s = src, kind, step, arrival_s
        self.arrays, self.nbytes = arrays, nbytes


_packers = threading.local()


def _pack(obj: object) -> bytes:
    """``msgpack.packb(obj)`` with this thread's Packer, kept: packb builds a Packer whose buffer
    (256 KiB) is allocated and freed on every call, which in a training process (a large,
    trimmed heap) page-faults it in again each time: 124 us per envelope in a profiled Gaia pool
    step, about 16 us with the kept Packer (docs/performance.md, "Python per message")."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer()
    return packer.pack(obj)


def describe(kind: str, step: int, src: int, arrays: Sequence[np.ndarray], *,
             max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Outgoing:
    """The message of C-contiguous ``arrays`` (see :func:`as_array`), without a digest; nothing
    is copied. ``TypeError`` for a dtype the wire does not carry, ``ValueError`` for more than
    :data:`MAX_ARRAYS` arrays or a message (with its trailer) above ``max_message_bytes``."""
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
    envelope0 = _pack([PROTOCOL_VERSION, kind, step, src, 0.0, descs])
    size = len(envelope0) + nbytes
    if size + TRAILER_BYTES > max_message_bytes:
        raise ValueError(f"a {kind!r} message of {size} B is larger than the maximum message size "
                         f"({max_message_bytes} B); raise --max-message-mb on every rank")
    return Outgoing(kind, step, src, descs, payloads, size, envelope0)


def envelope_nbytes(kind: str, step: int, src: int, arrays: Sequence[np.ndarray]) -> int:
    """Size of the msgpack envelope of a message (what ``Outgoing.nbytes`` adds to the payload)."""
    descs = [[a.dtype.str, list(a.shape)] for a in arrays]
    return len(_pack([PROTOCOL_VERSION, kind, step, src, 0.0, descs]))


def as_array(x: object) -> np.ndarray:
    """A C-contiguous numpy array for ``x`` (numpy array or CPU/GPU torch tensor), no copy if possible."""
    if isinstance(x, np.ndarray):
        a = x
    else:
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"can only send numpy arrays or torch tensors, got {type(x).__name__}")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            raise TypeError("bfloat16 tensors cannot be sent as numpy arrays; convert with .float() or .half()")
        a = t.resolve_conj().resolve_neg().numpy()
    if a.dtype.hasobject:
        raise TypeError(f"cannot send arrays of Python objects (dtype {a.dtype})")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a


class WireCodec:
    """One rank's end of the wire format: describes, digests and seals outgoing messages, and
    checks incoming ones (module docstring). Not thread-safe: the transport seals from one
    thread at a time (the caller's, or the pacer's under ``--wan real``).

    ``describe_peer(rank)`` names a peer in rejection details (default: ``"rank N"``).
    """

    def __init__(self, *, rank: int, world_size: int, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 describe_peer: Callable[[int], str] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.max_message_bytes = max_message_bytes
        self.mac_key = b""
        """The run's secret; b"" under ``--wire-auth off`` (no tag is made or checked)."""
        self.send_seq = [0] * world_size
        """Next sequence number towards each peer."""
        self.recv_seq = [-1] * world_size
        """Last sequence number accepted from each peer."""
        self._next_mid = 0  # id of the next message this rank prepares (the bulk MAC's nonce)
        self._describe_peer = describe_peer or (lambda r: f"rank {r}")
        self._gcm: tuple[Any, Any, Any] | None = None

    def set_mac_key(self, key: bytes) -> None:
        """Authenticate with the run's 32-byte secret from now on."""
        assert len(key) == 32
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        bulk_key = hashlib.blake2b(b"geodml bulk GMAC key", key=key, digest_size=32).digest()
        self.mac_key = key
        self._gcm = (Cipher, algorithms.AES(bulk_key), modes.GCM)

    # ---- sending ---------------------------------------------------------------------------
    def prepare(self, kind: str, step: int, arrays: Sequence[np.ndarray]) -> Outgoing:
        """:func:`describe` a message from this rank, plus its digest under ``--wire-auth on``."""
        out = describe(kind, step, self.rank, arrays, max_message_bytes=self.max_message_bytes)
        if self.mac_key:
            mid = self._next_mid
            self._next_mid = mid + 1
            out.digest = _MID.pack(mid) + self.bulk_mac(self.rank, mid, out.payloads)
        return out

    def bulk_mac(self, src: int, mid: int, arrays: Sequence[Any]) -> bytes:
        """GMAC (AES-256-GCM with the arrays as associated data, nothing encrypted) of a message's
        arrays (numpy arrays or received frames) under the run's bulk key; the nonce (src, message
        id) is never reused for a key."""
        assert self._gcm is not None, "no MAC key"
        cipher, aes, gcm = self._gcm
        e = cipher(aes, gcm(_NONCE.pack(src, mid))).encryptor()
        for a in arrays:  # as byte views, no copy (cryptography refuses typed numpy buffers)
            e.authenticate_additional_data(a.reshape(-1).view(np.uint8) if type(a) is np.ndarray else memoryview(a))
        e.finalize()
        return e.tag

    def trailer(self, envelope: bytes, digest: bytes, dst: int) -> bytes:
        """The next security trailer towards ``dst`` (advances its sequence number): call it as the
        message enters the socket."""
        seq = self.send_seq[dst]
        self.send_seq[dst] = seq + 1
        if not self.mac_key:
            return _TRAILER.pack(seq, dst, self.rank, 0) + _NO_TAG
        head = _TRAILER.pack(seq, dst, self.rank, _MID.unpack_from(digest)[0])
        return head + hashlib.blake2b(head + envelope + digest, key=self.mac_key, digest_size=TAG_BYTES).digest()

    # ---- receiving -------------------------------------------------------------------------
    def check(self, frames: Sequence[Any]) -> Incoming:
        """The message in ``frames`` (bytes-like: ``bytes``, ``zmq.Frame``) if it passes every
        check; else :class:`Rejected`. The arrays are views of the frames (no copy); accepting a
        message advances its source's sequence number."""
        head = frames[0]
        head = head if type(head) is bytes else bytes(head)
        if len(head) <= TRAILER_BYTES:
            raise Rejected("malformed", f"a {len(head)}-byte first frame: no envelope and {TRAILER_BYTES}-byte trailer")
        if len(head) > MAX_ENVELOPE_BYTES:
            raise Rejected("oversized", f"a {len(head)} B envelope")
        env, trailer = head[:-TRAILER_BYTES], head[-TRAILER_BYTES:]
        seq, dst, tsrc, mid = _TRAILER.unpack_from(trailer)
        if self.mac_key:  # before anything is parsed: unauthenticated bytes never reach msgpack
            fields = trailer[:_TRAILER.size]
            digest = fields[-_MID.size:] + self.bulk_mac(tsrc, mid, frames[1:])
            tag = hashlib.blake2b(fields + env + digest, key=self.mac_key, digest_size=TAG_BYTES).digest()
            if not hmac.compare_digest(tag, trailer[_TRAILER.size:]):
                raise Rejected("unauthenticated", "its tag does not match this run's secret")
        kind, step, src, arrival_s, descs = self._envelope(env, len(frames) - 1)
        if not (0 <= src < self.world_size) or src == self.rank or dst != self.rank:
            raise Rejected("unknown_peer", f"from rank {src} to rank {dst}; this is rank {self.rank} of "
                                           f"{self.world_size}")
        if tsrc != src:
            raise Rejected("malformed", f"the trailer names rank {tsrc} as its source, the envelope rank {src}")
        arrays, nbytes = self._arrays(descs, frames, kind, step, src)
        if seq <= self.recv_seq[src]:
            raise Rejected("replayed", f"sequence number {seq} from rank {src}, already at {self.recv_seq[src]}")
        self.recv_seq[src] = seq
        return Incoming(src, kind, step, arrival_s, arrays, len(env) + nbytes)

    @staticmethod
    def _envelope(env: bytes, num_frames: int) -> tuple[str, int, int, float, list]:
        """(kind, step, src, arrival_s, descs) of an envelope whose fields have the right types."""
        try:
            fields = msgpack.unpackb(env)
        except Exception as e:
            raise Rejected("malformed", f"not a geodml envelope: {type(e).__name__}") from None
        if type(fields) is not list or len(fields) != 6:
            raise Rejected("malformed", "the envelope is not a 6-field list")
        version, kind, step, src, arrival_s, descs = fields
        if version != PROTOCOL_VERSION:
            raise Rejected("malformed", f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
        if type(descs) is not list or len(descs) != num_frames:
            raise Rejected("malformed", f"{len(descs) if type(descs) is list else 'no'} arrays described, "
                                        f"{num_frames} attached")
        if type(kind) is not str or kind not in KINDS:
            raise Rejected("wrong_type", f"kind {kind!r}")
        if type(step) is not int or type(src) is not int or type(arrival_s) is not float:
            raise Rejected("wrong_type", f"step {step!r}, src {src!r}, arrival_s {arrival_s!r}")
        return kind, step, src, arrival_s, descs

    def _arrays(self, descs: list, frames: Sequence[Any], kind: str, step: int,
                src: int) -> tuple[list[np.ndarray], int]:
        """Views of ``frames[1:]`` as the arrays ``descs`` describes, and their bytes."""
        arrays = []
        nbytes = 0
        for i, desc in enumerate(descs, 1):
            if type(desc) is not list or len(desc) != 2:
                raise Rejected("wrong_type", f"array description {desc!r}")
            dtype_str, shape = desc
            dt = _DTYPES.get(dtype_str) if type(dtype_str) is str else None
            if dt is None:
                if type(dtype_str) is not str or not _DTYPE_RE.fullmatch(dtype_str):
                    raise Rejected("wrong_type", f"dtype {dtype_str!r}")
                dt = _DTYPES[dtype_str] = np.dtype(dtype_str)
            if (type(shape) is not list or len(shape) > 32
                    or not all(type(n) is int and n >= 0 for n in shape)):
                raise Rejected("wrong_type", f"shape {shape!r}")
            f = frames[i]
            numel = shape[0] if len(shape) == 1 else math.prod(shape)
            if len(f) != numel * dt.itemsize:
                raise Rejected("malformed", f"{kind!r} step {step} from {self._describe_peer(src)} has {len(f)} "
                                            f"bytes for a {dtype_str}{tuple(shape)} array")
            a = np.frombuffer(f, dtype=dt)  # a view of the frame (the array keeps it alive)
            if len(shape) != 1:
                a = a.reshape(shape)
            if not a.flags.aligned:  # tiny frames live inside the zmq_msg_t and may be unaligned
                a = a.copy()
            arrays.append(a)
            nbytes += a.nbytes
        return arrays, nbytes
