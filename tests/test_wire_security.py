"""Wire security of the ZeroMQ transport (issue 10 item 3; docs/reliability.md "Wire security").

A hostile raw ZeroMQ PUSH socket connects to a live transport's PULL and injects each kind of bad
message; each is dropped, counted under its reason, never queued or applied, and the rank keeps
receiving its real peer. Hostile frames are built here from the documented wire format (an
independent reference: one-shot AES-GCM over the concatenated arrays as the bulk GMAC, keyed
BLAKE2b over seq||dst||src||mid||envelope||mid||gmac),
so a format change that the docstring does not describe fails these tests. Also: a seeded
mutation fuzz of the decoder (thousands of inputs, never raises, accepts only intact messages),
sequence numbers in wire order under the ``--wan real`` pacer, the exporter's counter, and the
metrics endpoint's loopback default.
"""

import hashlib
import struct
import time

import msgpack
import numpy as np
import pytest
import zmq
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tests.support.inprocess import transport_group as _group

_MID_COUNTER = 10**9  # message ids of hand-built messages (the real transports count from 0)


def _frames(key: bytes | None, *, kind="update", step=0, src=0, dst=1, seq=0, arrays=(), descs=None,
            envelope: bytes | None = None, version=1, arrival_s=0.0, mid=None):
    """The frames of one message in the documented format (the tag is zeros without ``key``);
    the message id defaults to a fresh one per call (a real sender never repeats one)."""
    global _MID_COUNTER
    if mid is None:
        mid = _MID_COUNTER = _MID_COUNTER + 1
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if descs is None:
        descs = [[a.dtype.str, list(a.shape)] for a in arrays]
    if envelope is None:
        envelope = msgpack.packb([version, kind, step, src, arrival_s, descs])
    head = struct.pack(">QIIQ", seq, dst, src, mid)
    tag = bytes(32)
    if key is not None:
        bulk_key = hashlib.blake2b(b"geodml bulk GMAC key", key=key, digest_size=32).digest()
        gmac = AESGCM(bulk_key).encrypt(struct.pack(">IQ", src, mid), b"", b"".join(a.tobytes() for a in arrays))
        tag = hashlib.blake2b(head + envelope + struct.pack(">Q", mid) + gmac, key=key, digest_size=32).digest()
    return [envelope + head + tag, *[a.tobytes() for a in arrays]]


TRAILER = 56  # seq (8) + dst (4) + src (4) + mid (8) + tag (32)


def _reseq(frames, seq):
    """``frames`` with the sequence number in the trailer (end of frame 0) replaced."""
    f0 = frames[0]
    return [f0[:-TRAILER] + struct.pack(">Q", seq) + f0[-TRAILER + 8:], *frames[1:]]


def _drain(t, total: int, timeout_s: float = 10.0) -> None:
    """Let transport ``t`` take messages off its socket until ``total`` were rejected."""
    deadline = time.monotonic() + timeout_s
    while sum(t.rejected.values()) < total and time.monotonic() < deadline:
        t._receive(50)


@pytest.fixture
def pair(monkeypatch):
    kw = {"bind_host": "127.0.0.1", "max_message_bytes": 64 * 1024}
    a, b = _group(monkeypatch, [kw, kw])
    ctx = zmq.Context()
    hostile = ctx.socket(zmq.PUSH)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.connect(b.address)
    yield a, b, hostile
    hostile.close(linger=0)
    ctx.term()
    a.close()
    b.close()


def test_hostile_socket_each_bad_message_dropped_and_counted(pair):
    a, b, hostile = pair
    key = b._mac_key
    assert len(key) == 32 and key == a._mac_key  # one per-run secret, shared by the caller (build_comm: over the process group)
    vals = np.arange(6, dtype=np.float32)
    # The real peer: two messages (seq 0, 1); a forged copy of the second is a replay.
    for step in range(2):
        a.send(a.prepare("update", step, [vals + step]), [(1, 0.0, None)])
    for step in range(2):
        assert np.array_equal(b.recv(0, "update", step, timeout_s=5).arrays[0], vals + step)
    assert b._recv_seq[0] == 1

    bad = {
        "malformed": [
            [b"hello"],                                                     # shorter than a trailer
            _frames(key, envelope=b"\xc1\xc1", arrays=[vals], seq=10),      # not msgpack (valid tag)
            _frames(key, arrays=[vals], descs=[["<f4", [6]], ["<f4", [1]]], seq=11),  # 2 described, 1 attached
            _frames(key, arrays=[vals], descs=[["<f4", [7]]], seq=12),      # 24 bytes for 7 floats
            _frames(key, arrays=[vals], version=2, seq=13),                 # unknown protocol version
        ],
        "unauthenticated": [
            _frames(b"k" * 32, arrays=[vals], seq=20),                      # another secret
            _frames(None, arrays=[vals], seq=21),                           # no tag at all
            _reseq(_frames(key, arrays=[vals], seq=22), 23),               # seq changed after tagging
        ],
        "wrong_type": [
            _frames(key, kind="bogus", arrays=[vals], seq=30),
            _frames(key, step="3", arrays=[vals], seq=31),
            _frames(key, arrays=[vals], descs=[["|O", [6]]], seq=32),       # Python objects
            _frames(key, arrays=[vals], descs=[["<f4", [-6]]], seq=33),
            _frames(key, arrays=[vals], descs=[["f4,i4", [3]]], seq=34),    # structured dtype
        ],
        "unknown_peer": [
            _frames(key, src=7, arrays=[vals], seq=40),                     # no such rank
            _frames(key, src=1, arrays=[vals], seq=41),                     # claims to be the receiver
            _frames(key, dst=0, arrays=[vals], seq=42),                     # addressed to another rank
        ],
        "replayed": [
            _frames(key, step=1, arrays=[vals + 1], seq=1),                 # a's second message again
            _frames(key, step=5, arrays=[vals], seq=0),                     # an older sequence number
        ],
        "oversized": [
            _frames(key, arrays=[np.zeros(10_000, np.float32)] * 3, seq=50),  # 120 KB in 30 KB frames > 64 KiB
        ],
    }
    for msgs in bad.values():
        for frames in msgs:
            hostile.send_multipart(frames)
    total = sum(len(v) for v in bad.values())
    _drain(b, total)
    assert b.rejected == {reason: len(bad.get(reason, [])) for reason in b.rejected}
    # A single frame above the limit never reaches the application: ZeroMQ (MAXMSGSIZE) drops
    # the hostile connection; nothing is counted, nothing is queued, the rank carries on.
    hostile.send_multipart(_frames(key, arrays=[np.zeros(20_000, np.float32)], seq=60))
    _drain(b, total + 1, timeout_s=0.5)
    assert sum(b.rejected.values()) == total
    assert b.queued() == [] and b._recv_seq[0] == 1  # nothing hostile was queued or moved the sequence
    a.send(a.prepare("update", 2, [vals * 3]), [(1, 0.0, None)])
    assert np.array_equal(b.recv(0, "update", 2, timeout_s=5).arrays[0], vals * 3)


def test_wire_auth_off_still_checks_structure_and_sequence(monkeypatch):
    kw = {"bind_host": "127.0.0.1", "wire_auth": "off"}
    a, b = _group(monkeypatch, [kw, kw])
    ctx = zmq.Context()
    hostile = ctx.socket(zmq.PUSH)
    try:
        assert a._mac_key == b"" and b._mac_key == b""
        hostile.connect(b.address)
        vals = np.arange(3, dtype=np.int64)
        a.send(a.prepare("model", 0, [vals]), [(1, 0.0, None)])
        assert np.array_equal(b.recv(0, "model", 0, timeout_s=5).arrays[0], vals)
        hostile.send_multipart(_frames(None, kind="model", step=0, arrays=[vals], seq=0))   # replay of seq 0
        hostile.send_multipart([b"\x93garbage" + b"x" * TRAILER])                               # not a 6-field list
        hostile.send_multipart(_frames(None, kind="model", step=9, arrays=[vals], seq=5))  # no MAC to check: taken
        _drain(b, 2)
        assert b.rejected["replayed"] == 1 and b.rejected["malformed"] == 1
        assert np.array_equal(b.recv(0, "model", 9, timeout_s=5).arrays[0], vals)  # off means: trusted network
    finally:
        hostile.close(linger=0)
        ctx.term()
        a.close()
        b.close()


def test_decoder_fuzz_never_raises_and_accepts_only_intact_messages(monkeypatch):
    """5,000 seeded mutations per auth mode (bit flips, truncation, insertion, frame drops and
    duplication, random msgpack envelopes). With auth on only an unmodified message passes; with
    auth off whatever passes is self-consistent (arrays match their descriptions)."""
    rng = np.random.default_rng(1234)

    def pick(options):
        return options[int(rng.integers(0, len(options)))]
    for mode in ("on", "off"):
        kw = {"bind_host": "127.0.0.1", "wire_auth": mode}
        a, b = _group(monkeypatch, [kw, kw])
        key = b._mac_key or None
        try:
            accepted = intact = 0
            for i in range(5000):
                arrays = [np.arange(int(rng.integers(0, 5)), dtype=np.int32), rng.random(2).astype(np.float16)]
                frames = _frames(key, step=i, arrays=arrays, seq=i)
                op = int(rng.integers(0, 7))
                changed = True
                if op == 0:  # flip one bit somewhere
                    f = int(rng.integers(0, len(frames)))
                    if frames[f]:
                        buf = bytearray(frames[f])
                        j = int(rng.integers(0, len(buf)))
                        buf[j] ^= 1 << int(rng.integers(0, 8))
                        frames[f] = bytes(buf)
                    else:
                        changed = False
                elif op == 1:  # truncate a frame
                    f = int(rng.integers(0, len(frames)))
                    changed = len(frames[f]) > 0
                    cut = int(rng.integers(0, len(frames[f]))) if changed else 0
                    frames[f] = frames[f][:cut] if changed else frames[f]
                elif op == 2:  # insert random bytes
                    f = int(rng.integers(0, len(frames)))
                    frames[f] = frames[f] + rng.bytes(int(rng.integers(1, 9)))
                elif op == 3:  # drop a frame
                    frames.pop(int(rng.integers(0, len(frames))))
                elif op == 4:  # duplicate a frame
                    f = int(rng.integers(0, len(frames)))
                    frames.insert(f, frames[f])
                elif op == 5:  # a random msgpack envelope, tagged correctly
                    junk = [pick([1, 2]), pick(["update", "x", 3]), int(rng.integers(-2, 3)),
                            int(rng.integers(-1, 3)), pick([0.0, 1]),
                            [[pick(["<i4", "<f2", "|b1", ">f8", "<U3", 5]),
                              [int(rng.integers(-1, 5))]] for _ in range(int(rng.integers(0, 3)))]]
                    n = int(rng.integers(0, 6))
                    env = msgpack.packb(junk[:n] if n < 6 else junk)
                    frames = _frames(key, envelope=env, arrays=arrays, seq=i)
                    changed = None  # may or may not be valid
                else:
                    changed = False
                b._recv_seq[0] = -1
                before = sum(b.rejected.values())
                msg = b._decode([zmq.Frame(f) for f in frames])
                assert (msg is None) == (sum(b.rejected.values()) == before + 1)
                if msg is not None:
                    accepted += 1
                    for arr, (dt, shape) in zip(msg.arrays, msgpack.unpackb(frames[0][:-TRAILER])[5]):
                        assert arr.dtype == np.dtype(dt) and list(arr.shape) == shape
                    if mode == "on":
                        assert changed is not True, (i, op)  # a modified message never passes the tag
                if changed is False:
                    intact += 1
                    assert msg is not None and msg.step == i
            assert intact > 500 and accepted >= intact
        finally:
            a.close()
            b.close()


def test_paced_markers_and_messages_keep_wire_order(monkeypatch):
    """Under --wan real every send goes through the pacer, so a marker sent after a paced message
    (but released first) gets the next sequence number in wire order: nothing is dropped as a replay."""
    kw = {"bind_host": "127.0.0.1", "paced": True}
    a, b = _group(monkeypatch, [kw, kw])
    try:
        x = np.arange(1000, dtype=np.float32)
        now = time.monotonic()
        a.send(a.prepare("update", 0, [x]), [(1, 0.0, now + 0.2)])  # paced: leaves in 0.2 s
        a.send(a.prepare("control", 0, []), [(1, 0.0, None)])     # marker: leaves now
        assert b.recv(0, "control", 0, timeout_s=5).arrays == []
        assert np.array_equal(b.recv(0, "update", 0, timeout_s=5).arrays[0], x)
        assert sum(b.rejected.values()) == 0 and b._recv_seq[0] == 1
    finally:
        a.close()
        b.close()


def test_oversized_send_is_a_value_error(monkeypatch):
    kw = {"bind_host": "127.0.0.1", "max_message_bytes": 4096}
    a, b = _group(monkeypatch, [kw, kw])
    try:
        with pytest.raises(ValueError, match="larger than the maximum message size.*--max-message-mb"):
            a.prepare("model", 0, [np.zeros(1024, np.float32)])
        with pytest.raises(TypeError, match="only bool, integer and float"):
            a.prepare("model", 0, [np.zeros(2, np.complex64)])
    finally:
        a.close()
        b.close()


def test_exporter_counts_rejections_and_binds_loopback_by_default():
    import urllib.request

    from geodml.cli import parse_config
    from geodml.metrics.prometheus import RankExporter

    cfg = parse_config(["--metrics-port", "9400"])
    assert cfg.metrics_host == "127.0.0.1"  # the exporter listens on loopback unless told otherwise
    assert cfg.comm.wire_auth == "on" and cfg.comm.max_message_mb == 512.0
    assert parse_config(["--wire-auth", "off", "--max-message-mb", "2"]).comm.wire_auth == "off"
    counts = {"unauthenticated": 3, "replayed": 1}
    x = RankExporter(labels={"rank": 0, "region": "r", "algo": "bsp", "run": "t"}, wire_rejected=lambda: counts)
    text = x.exposition().decode()
    assert 'geodml_wire_rejected_messages_total{algo="bsp",rank="0",reason="unauthenticated",region="r",run="t"} 3.0' in text
    assert 'reason="replayed"' in text and 'reason="malformed"' not in text
    x.start(cfg.metrics_host, 0)
    try:
        host, port = x._server.server_address[:2]
        assert host == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "geodml_wire_rejected_messages_total" in body
    finally:
        x.stop()
