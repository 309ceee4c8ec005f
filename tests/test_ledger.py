"""Ledger totals, the collective cost models, the envelope size, token bucket and clock, by hand."""

import numpy as np
import pytest

from geodml.comm.collectives import (
    ring_allgather_duration_s,
    ring_allreduce_duration_s,
    ring_allreduce_sent_elements,
    ring_chunk_sizes,
    star_broadcast_duration_s,
)
from geodml.comm.ledger import KINDS, Ledger
from geodml.comm.pacing import EmulatedClock, TokenBucket
from geodml.comm.topology import WanLink
from geodml.comm.wire import envelope_nbytes


def test_kinds():
    assert set(KINDS) >= {"gradient", "update", "model", "travel", "control"}


def test_ledger_rows_and_summary_by_hand():
    regions = ["us", "eu", "us"]
    l0, l1, l2 = (Ledger(r, regions) for r in range(3))
    l0.charge(1, "update", 1000, emulated_s=0.5)          # us -> eu
    l0.charge(1, "update", 500, messages=2, emulated_s=0.25)
    l0.charge(2, "control", 40)                           # us -> us (LAN)
    l1.charge(0, "gradient", 3000, messages=4, emulated_s=1.0)  # eu -> us
    l1.charge(2, "model", 7)                              # eu -> us
    l2.charge(1, "gradient", 11, messages=3)             # us -> eu
    assert l0.wan_bytes == 1500 and l0.total_bytes == 1540
    assert l0.rows() == [
        {"src_region": "us", "dst_region": "eu", "kind": "update", "bytes": 1500, "messages": 3, "emulated_s": 0.75},
        {"src_region": "us", "dst_region": "us", "kind": "control", "bytes": 40, "messages": 1, "emulated_s": 0.0},
    ]
    s = Ledger.summarize(l0.rows() + l1.rows() + l2.rows())
    assert s["wan_bytes_total"] == 1500 + 3000 + 7 + 11
    assert s["lan_bytes_total"] == 40
    assert s["wan_bytes_by_kind"] == {"gradient": 3011, "model": 7, "update": 1500}
    assert s["wan_bytes_by_link"] == {"eu->us": 3007, "us->eu": 1511}
    assert s["bytes_by_link"] == {"eu->us": 3007, "us->eu": 1511, "us->us": 40}
    assert s["wan_messages_total"] == 3 + 4 + 1 + 3 and s["messages_total"] == 12
    assert s["wan_emulated_seconds_by_link"] == {"eu->us": 1.0, "us->eu": 0.75}
    assert s["wan_emulated_seconds_by_kind"] == {"gradient": 1.0, "model": 0.0, "update": 0.75}


def test_charge_each_is_one_charge_per_destination():
    """Ledger.charge_each (--wan off's send to many) sums per region first: the same rows."""
    regions = ["us", "eu", "us", "ap", "eu"]
    each, one_by_one = Ledger(0, regions), Ledger(0, regions)
    each.charge_each([1, 2, 3, 4], "update", 100)
    each.charge_each([4], "update", 7)
    for d in (1, 2, 3, 4):
        one_by_one.charge(d, "update", 100)
    one_by_one.charge(4, "update", 7)
    assert each.rows() == one_by_one.rows()
    assert {(r["dst_region"], r["bytes"], r["messages"]) for r in each.rows()} == {
        ("eu", 207, 3), ("us", 100, 1), ("ap", 100, 1)}
    # a tuple's regions are counted once and reused while the same tuple comes back (a Comm's
    # send to all); another tuple or a list is counted afresh
    cached, plain = Ledger(0, regions), Ledger(0, regions)
    all_others, two = (1, 2, 3, 4), (1, 4)
    for dsts in (all_others, all_others, two, all_others, [1, 2]):
        cached.charge_each(dsts, "update", 10)
        for d in dsts:
            plain.charge(d, "update", 10)
    assert cached.rows() == plain.rows()
    assert {(r["dst_region"], r["bytes"], r["messages"]) for r in cached.rows()} == {
        ("eu", 90, 9), ("us", 40, 4), ("ap", 30, 3)}


def test_ring_chunks_and_sent_elements_by_hand():
    # n = 10, K = 4: chunks 3, 3, 2, 2. Rank 0 sends in reduce-scatter steps 0..2 the chunks
    # 0, 3, 2 and in all-gather steps 0..2 the chunks 1, 0, 3.
    assert ring_chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert ring_allreduce_sent_elements(10, 4, 0) == [3, 2, 2, 3, 3, 2]
    assert ring_allreduce_sent_elements(10, 4, 1) == [3, 3, 2, 2, 3, 3]
    # Over all ranks every chunk is sent 2(K-1) times: 2 * 3 * 10 = 60 elements.
    assert sum(sum(ring_allreduce_sent_elements(10, 4, r)) for r in range(4)) == 60
    assert ring_allreduce_sent_elements(10, 1, 0) == []
    assert ring_allreduce_sent_elements(2, 3, 2) == [0, 1, 1, 0]  # empty chunks still make a step


def test_ring_allreduce_duration_by_hand():
    # K = 3 ring: 0->1 slow (8 Mbit/s = 1e6 B/s, 10 ms), 1->2 (16 Mbit/s = 2e6 B/s, 20 ms),
    # 2->0 LAN (800 Mbit/s = 1e8 B/s, 1 ms). n = 30 float32: chunks of 10 elements = 40 B,
    # each of the 4 steps takes max(0.01 + 40/1e6, 0.02 + 40/2e6, 0.001 + 40/1e8) = 0.02002 s.
    ring = [WanLink(8, 10), WanLink(16, 20), WanLink(800, 1)]
    assert ring_allreduce_duration_s(30, 4, ring) == pytest.approx(4 * 0.02002, rel=1e-12)
    # n = 31: chunk 0 has 11 elements; in every step some rank sends chunk 0 or not, so the
    # step maximum is over the ranks' own chunk sizes. Rank 1 (the slowest link's sender)
    # sends chunks 1, 0, 2, 1 -> 40, 44, 40, 40 B.
    expect = (0.02 + 40 / 2e6) * 3 + (0.02 + 44 / 2e6)
    assert ring_allreduce_duration_s(31, 4, ring) == pytest.approx(expect, rel=1e-12)
    assert ring_allreduce_duration_s(31, 4, ring[:1]) == 0.0


def test_allgather_and_broadcast_duration_by_hand():
    ring = [WanLink(8, 10), WanLink(16, 20), WanLink(800, 1)]
    assert ring_allgather_duration_s(8, ring) == pytest.approx(2 * (0.02 + 8 / 2e6), rel=1e-12)
    assert star_broadcast_duration_s(1000, [WanLink(16, 20), WanLink(8, 10)]) == pytest.approx(0.0205, rel=1e-12)


def test_envelope_size_by_hand():
    # msgpack [1, "update", 3, 1, 0.0, [["<i4", [10]], ["<f4", [10]]]]:
    # fixarray 1 + version 1 + "update" 7 + step 1 + src 1 + float64 9
    # + descriptor list 1 + 2 x (pair 1 + "<i4" 4 + shape list 1 + 10 as fixint 1) = 35 bytes
    arrays = [np.zeros(10, np.int32), np.zeros(10, np.float32)]
    assert envelope_nbytes("update", 3, 1, arrays) == 35
    # step 300 needs uint16 (3 bytes), shape 10000 needs uint16 (3 bytes)
    assert envelope_nbytes("update", 300, 1, [np.zeros(10_000, np.uint8)]) == 1 + 1 + 7 + 3 + 1 + 9 + 1 + 1 + 4 + 1 + 3


def test_token_bucket_fifo_by_hand():
    b = TokenBucket(100.0)           # 100 B/s, depth 0: a FIFO link
    assert b.reserve(100, 0.0) == pytest.approx(1.0)
    assert b.reserve(50, 0.5) == pytest.approx(1.5)   # queued behind the first message
    assert b.reserve(10, 3.0) == pytest.approx(3.1)   # link idle again
    burst = TokenBucket(100.0, depth_bytes=100)
    assert burst.reserve(100, 0.0) == 0.0             # the full bucket absorbs a burst
    assert burst.reserve(100, 0.0) == pytest.approx(1.0)
    assert burst.reserve(50, 10.0) == 10.0            # refilled (capped at depth) after idling


def test_emulated_clock_by_hand():
    c = EmulatedClock([None, WanLink(8, 10)])   # rank 0; link to rank 1: 1e6 B/s, 10 ms
    c.advance(0.5)
    assert c.send(1, 10_000) == pytest.approx(0.52)   # 0.5 + 0.01 + 0.01
    assert c.send(1, 20_000) == pytest.approx(0.54)   # waits for the link: 0.51 + 0.02 + 0.01
    assert c.now_s == 0.5                             # sending does not move the sender's clock
    c.receive(0.3)
    assert c.now_s == 0.5
    c.receive(0.7)
    assert c.now_s == 0.7
    c.collective(0.9, 0.25)
    assert c.now_s == pytest.approx(1.15)


def test_bsp_equivalent_wan_bytes_by_hand():
    """numel 10, K=3, chunks [4, 3, 3]. Rank 0 sends chunks 0,2 then 1,0 = 14 elements, rank 1
    sends 1,0,2,1 = 13, rank 2 sends 2,1,0,2 = 13 (40 = 2(K-1) x 10 in all). With regions
    [a, a, b] the link 0->1 stays in region a, so the WAN carries (13 + 13) x 4 B = 104 B."""
    from geodml.comm.collectives import ring_allreduce_wan_bytes
    assert [sum(ring_allreduce_sent_elements(10, 3, r)) for r in range(3)] == [14, 13, 13]
    assert ring_allreduce_wan_bytes(10, 4, ["a", "a", "b"]) == 104
    assert ring_allreduce_wan_bytes(10, 4, ["a", "b", "c"]) == 160
    assert ring_allreduce_wan_bytes(10, 4, ["a", "a", "a"]) == 0 and ring_allreduce_wan_bytes(10, 4, ["a"]) == 0
