"""InProcessComm (geodml.comm.inprocess): the Comm contract, and the same charges as DistComm.

* both Comms satisfy the Protocols of geodml.comm.api;
* the scripted exchange of tests/test_comm_wan.py, run by three threads, gives the hand-worked
  numbers that test checks for DistComm in real processes: clocks, ledger bytes, messages and
  emulated link seconds (p2p FIFO sharing, ring all-reduce over K = 3, star broadcast, ring
  all-gather), under --wan virtual and off, and BSP's ring all-reduce on the default topology;
* --wan real: wall time follows the emulated time (paced delivery, held collectives);
* messages: tags, order, read-only arrays, hand-over; every wait times out naming the peer;
  a failing or mismatched rank breaks the group at once; close; checkpoint state.
"""

from __future__ import annotations

import textwrap
import threading
import time

import numpy as np
import pytest
import torch

from geodml.comm import Comm, CommError, CommTimeoutError, DistComm, InProcessComm, InProcessGroup, Ledger, RunComm
from geodml.comm.topology import topology_from_dict
from tests.support.inprocess import TWO_REGIONS, paced_exchange, run_threads, scripted_exchange

# Message sizes (msgpack envelope + payload, see tests/test_ledger.py::test_envelope_size_by_hand):
# update uint8[10000]: 30 B envelope -> 10,030 B; uint8[20000] -> 20,030 B; control int64[1]: 37 B.


def test_both_comms_satisfy_the_protocols():
    group = InProcessGroup(2)
    dist_comm = DistComm(rank=0, world_size=1, region_of_rank=["x"])  # no process group needed
    try:
        for comm in (group.comm(0), dist_comm):
            assert isinstance(comm, Comm) and isinstance(comm, RunComm)
        assert isinstance(group.comm(1), InProcessComm) and group.comm(1).rank == 1
        assert not isinstance(object(), Comm)
    finally:
        group.close()
        dist_comm.close()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    path = tmp_path_factory.mktemp("topo") / "two-regions.toml"
    path.write_text(textwrap.dedent(TWO_REGIONS))
    out = {}
    for mode in ("virtual", "off"):
        out[mode] = run_threads(3, lambda rank, comm: (scripted_exchange(comm, rank), comm.ledger.rows()),
                                topology=str(path), wan=mode, timeout_s=20)
    return out


def test_virtual_clock_equals_the_hand_computation_of_test_comm_wan(scripted):
    p2p = [0.5, 0.54006, 0.1]            # rank 1 receives both updates (FIFO on a->b) at 0.54006
    ar = 0.54006 + 4 * 0.02002           # ring all-reduce of 30 float32, K = 3: 4 steps of 0.02002 s
    bc = ar + 0.0205                     # 1000 B from region b to a: 0.02 + 1000/2e6
    ag = bc + 2 * 0.020004               # all-gather of 8 B pieces: 2 steps
    for rank, (clocks, _) in enumerate(scripted["virtual"]):
        assert clocks == pytest.approx([p2p[rank], ar, bc, ag], rel=1e-12, abs=1e-12)


def test_ledger_rows_equal_the_hand_computation_of_test_comm_wan(scripted):
    for mode in ("virtual", "off"):
        s = Ledger.summarize([row for _, rows in scripted[mode] for row in rows])
        assert s["wan_bytes_total"] == 30_236 + 2_176
        assert s["lan_bytes_total"] == 213
        assert s["wan_bytes_by_link"] == {"a->b": 30_236, "b->a": 2_176}
        assert s["wan_bytes_by_kind"] == {"gradient": 320, "model": 2_000, "travel": 32, "update": 30_060}
        assert s["wan_messages_total"] == 16 and s["messages_total"] == 23
    emu = Ledger.summarize([row for _, rows in scripted["virtual"] for row in rows])["wan_emulated_seconds_by_link"]
    assert emu == pytest.approx({"a->b": 0.110236, "b->a": 0.161088}, rel=1e-12)
    off = Ledger.summarize([row for _, rows in scripted["off"] for row in rows])
    assert off["wan_emulated_seconds_by_link"] == {"a->b": 0.0, "b->a": 0.0}
    for rank, (clocks, _) in enumerate(scripted["off"]):
        assert clocks == [[0.5, 0.2, 0.1][rank]] * 4  # compute only
    # rank 0's own rows: both updates (10,030 + 20,030 B) and its ring share on a->b; nothing else
    rows0 = {(r["dst_region"], r["kind"]): (r["bytes"], r["messages"]) for r in scripted["off"][0][1]}
    assert rows0 == {("b", "update"): (30_060, 2), ("b", "gradient"): (160, 4), ("b", "travel"): (16, 2)}


def test_bsp_ring_all_reduce_on_the_default_topology():
    """tests/test_comm_wan.py::test_bsp_all_reduce_charged_by_the_ring_model: 33 float32, K = 3,
    3 steps -> 528 B per ring link, each step 4 x (0.05 + 44*8/1e8) s."""
    import types

    from geodml.algorithms.bsp import BSP

    def fn(rank, comm):
        grad = torch.full((33,), float(rank))
        bsp = types.SimpleNamespace(comm=comm, flat=types.SimpleNamespace(grad=grad), compressor=None)
        for step in range(3):
            grad.fill_(float(rank))
            BSP.before_step(bsp, step, 0.1)
            assert torch.allclose(grad, torch.ones(33))
        return comm.emulated_s, comm.ledger.rows()

    out = run_threads(3, fn, wan="virtual")
    s = Ledger.summarize([r for _, rows in out for r in rows])
    assert s["wan_bytes_by_link"] == {"dc0->dc1": 528, "dc1->dc2": 528, "dc2->dc0": 528}
    assert s["wan_messages_total"] == 3 * 3 * 4
    for clock, _ in out:
        assert clock == pytest.approx(3 * 4 * (0.05 + 44 * 8 / 1e8), rel=1e-12)


def test_real_mode_wall_time_follows_emulated_time():
    """tests/test_comm_wan.py::test_real_mode_wall_time_follows_emulated_time, in one process."""
    topo = topology_from_dict({"source": "illustrative (test)", "regions": ["a", "b"], "placement": ["a", "b"],
                               "default": {"bandwidth_mbps": 40, "latency_ms": 30}})

    def fn(rank, comm):
        comm.meta_all_reduce(torch.zeros(1))  # start together
        return paced_exchange(comm, rank)

    ack = 5 * 50_030 / 5e6 + 0.03 + 0.03 + 37 / 5e6
    expect = ack + 2 * (0.03 + 200_000 / 5e6)
    out = run_threads(2, fn, topology=topo, wan="real", timeout_s=20)
    for wall, emulated, _, _ in out:
        assert emulated == pytest.approx(expect, rel=1e-12)
        assert 0.9 * emulated <= wall <= 1.5 * emulated + 0.25, (wall, emulated)
    assert out[1][2] - out[0][3] >= 0.03 + 50_030 / 5e6 - 0.002  # from rank 0's start (test_comm_wan.py)
    assert not [t for t in threading.enumerate() if t.name.startswith("geodml-inprocess")]  # pacers stopped


def test_messages_tags_order_hand_over_and_read_only():
    def fn(rank, comm):
        if rank == 0:
            buf = np.arange(4, dtype=np.float32)
            comm.send(1, "update", [buf], step=1)                       # a later step first
            buf[:] = -1                                                  # ours again once send returned
            comm.send(1, "control", [np.array([7])], step=0)
            comm.send(1, "control", [np.array([8])], step=0)            # same tag: arrives in order
            comm.send(1, "update", [], step=2)                           # a marker: not charged
            comm.send_to_all("model", [torch.ones(2)], step=0, wait=False)
            comm.flush()
            return comm.ledger.rows()
        got = [comm.recv(0, "control", step=0)[0].item(), comm.recv(0, "control", step=0)[0].item()]
        upd = comm.recv(0, "update", step=1)[0]
        assert upd.tolist() == [0, 1, 2, 3] and not upd.flags.writeable
        assert comm.recv(0, "update", step=2) == []
        assert comm.recv_from_all("model", step=0)[0][0].tolist() == [1.0, 1.0]
        return got

    rows, got = run_threads(2, fn)
    assert got == [7, 8]
    assert sum(r["messages"] for r in rows) == 4  # the marker is not charged


def test_a_send_to_all_is_shared_yet_each_receiver_gets_its_own_list():
    """One in-process send to all is one message object in every mailbox (--wan off): a receiver
    that changes the list it got changes nobody else's, and two sends under one tag still arrive
    in order at every destination."""
    group = InProcessGroup(3, timeout_s=5.0)
    c0, c1, c2 = group.comms
    c0.send_to_all("update", [np.arange(3, dtype=np.int32), np.ones(3, dtype=np.float32)], step=4)
    c0.send_to_all("update", [np.full(2, 9, dtype=np.int32)], step=4)           # same tag again
    first = c1.recv(0, "update", step=4)
    first.clear()                                                              # rank 1's own list
    got = c2.recv(0, "update", step=4)
    assert [a.tolist() for a in got] == [[0, 1, 2], [1.0, 1.0, 1.0]]
    assert [a.tolist() for a in c1.recv(0, "update", step=4)] == [[9, 9]]
    assert [a.tolist() for a in c2.recv(0, "update", step=4)] == [[9, 9]]
    assert sum(r["messages"] for r in c0.ledger.rows()) == 4
    group.close()


def test_recv_times_out_naming_the_silent_peer_and_keeps_what_came():
    def fn(rank, comm):
        if rank == 0:
            comm.send(1, "update", [np.arange(3)], step=7)
        if rank == 1:
            t0 = time.monotonic()
            with pytest.raises(CommTimeoutError, match=r"within 0.3 s from rank 2 \(region dc2, in-process\)"):
                comm.recv_from_all("update", step=7, timeout_s=0.3)
            assert 0.3 <= time.monotonic() - t0 < 3
            assert comm.recv(0, "update", step=7, timeout_s=1)[0].tolist() == [0, 1, 2]   # kept
            with pytest.raises(CommTimeoutError, match="nothing else queued from it"):
                comm.recv(2, "model", step=3, timeout_s=0.1)
        comm.meta_all_reduce(torch.zeros(1))  # rank 2 stays until the others are done
        return True

    assert run_threads(3, fn) == [True] * 3


def test_a_collective_not_joined_times_out_and_breaks_the_group():
    group = InProcessGroup(2, timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"not joined within 0.3 s by rank 1 \(region dc1"):
        group.comm(0).all_reduce(torch.ones(2), "gradient")
    assert time.monotonic() - t0 < 3
    with pytest.raises(CommError, match="not joined"):      # the group stays broken
        group.comm(1).meta_all_reduce(torch.ones(2))


def test_failing_rank_and_mismatched_collectives_fail_every_rank_at_once():
    def fails(rank, comm):
        if rank == 1:
            raise RuntimeError("boom")
        comm.recv(1, "update", step=0)                 # would wait 60 s without the abort

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="boom"):
        run_threads(2, fails)
    assert time.monotonic() - t0 < 10

    def mismatched(rank, comm):
        if rank == 0:
            comm.all_reduce(torch.ones(2), "gradient")
        else:
            comm.meta_all_gather_object(rank)

    with pytest.raises(CommError, match="different collectives"):
        run_threads(2, mismatched)


def test_collectives_bit_identical_and_meta_uncharged():
    def fn(rank, comm):
        t = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64) * (rank + 1)
        comm.all_reduce(t, "gradient", average=True)
        m = torch.full((2,), float(rank))
        comm.meta_broadcast(m, 2)
        comm.meta_all_reduce(m)
        objs = comm.meta_all_gather_object({"rank": rank})
        g = comm.all_gather(torch.tensor([rank]), "control")
        return t, m.tolist(), objs, [x.item() for x in g], comm.ledger.rows()

    out = run_threads(3, fn)
    for t, m, objs, g, rows in out:
        assert torch.equal(t, out[0][0])
        assert m == [6.0, 6.0] and objs == [{"rank": 0}, {"rank": 1}, {"rank": 2}] and g == [0, 1, 2]
        assert {r["kind"] for r in rows} == {"gradient", "control"}   # nothing for the meta calls
    assert out[0][2] is not out[1][2]                                # every rank gets its own copies


def test_bad_arguments_close_and_state_round_trip():
    group = InProcessGroup(2, wan="virtual")
    a, b = group.comm(0), group.comm(1)
    for call in (lambda: a.send(0, "update", [np.zeros(1)], step=0),
                 lambda: a.send(2, "update", [np.zeros(1)], step=0),
                 lambda: a.send(1, "gradients", [np.zeros(1)], step=0),
                 lambda: a.send(1, "update", [np.zeros(1)], step=1.5),
                 lambda: a.recv(0, "update", step=0),
                 lambda: a.advance_compute(-1.0)):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(TypeError, match="sequence of tensors"):
        a.send(1, "update", np.zeros(1), step=0)
    a.advance_compute(0.5)
    a.send(1, "update", [np.zeros(1000, np.uint8)], step=0)
    state = a.state_dict()
    fresh = InProcessGroup(2, wan="virtual").comm(0)
    fresh.load_state_dict(state)
    assert fresh.emulated_s == 0.5 and fresh.ledger.rows() == a.ledger.rows()
    assert a.link(0, 1).bandwidth_mbps == 100.0 and a.wire_rejected() == {}
    group.close()
    group.close()  # idempotent
    with pytest.raises(CommError, match="closed"):
        b.recv(0, "update", step=0)
