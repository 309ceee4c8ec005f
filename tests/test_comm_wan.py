"""WAN emulation and the ledger in real processes, against numbers worked out by hand.

Topology for the scripted exchange (tests/harness.py; two regions, directed links, three ranks):
ranks 0 and 2 in region a, rank 1 in region b;
a->b 8 Mbit/s = 1e6 B/s, 10 ms; b->a 16 Mbit/s = 2e6 B/s, 20 ms; LAN 800 Mbit/s = 1e8 B/s, 1 ms.
"""

import textwrap

import pytest

from tests.support.inprocess import TWO_REGIONS
from tests.support.inprocess import scripted_exchange as _script
from tests.support.procs import run_workers


def _scripted_exchange(rank, world, topology):
    import types

    import torch

    from geodml.algorithms.bsp import BSP
    from geodml.comm import build_comm
    from geodml.config import CommConfig

    out = {}
    for mode in ("virtual", "off"):
        comm = build_comm(CommConfig(topology=topology, wan=mode, timeout_s=20), rank=rank, world_size=world)
        out[mode] = {"clocks": _script(comm, rank), "rows": comm.ledger.rows()}
        comm.close()
    # BSP's all-reduce, as BSP calls it, on the default topology (one region per rank).
    comm = build_comm(CommConfig(wan="virtual", timeout_s=20), rank=rank, world_size=world)
    grad = torch.full((33,), float(rank))
    bsp = types.SimpleNamespace(comm=comm, flat=types.SimpleNamespace(grad=grad), compressor=None)
    for step in range(3):
        grad.fill_(float(rank))
        BSP.before_step(bsp, step, 0.1)
        assert torch.allclose(grad, torch.ones(33))  # (0 + 1 + 2) / 3
    out["bsp"] = {"clock": comm.emulated_s, "rows": comm.ledger.rows(), "regions": comm.region_of_rank}
    comm.close()
    return out


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    path = tmp_path_factory.mktemp("topo") / "two-regions.toml"
    path.write_text(textwrap.dedent(TWO_REGIONS))
    return run_workers("tests.test_comm_wan:_scripted_exchange", 3, timeout_s=120, topology=str(path))


# Message sizes (msgpack envelope + payload, see tests/test_ledger.py::test_envelope_size_by_hand):
# update uint8[10000]: envelope 1+1+7+1+1+9 + (1 + 1+4+1+3) = 30 B -> 10,030 B; uint8[20000] -> 20,030 B
# control int64[1]: envelope 1+1+8+1+1+9 + (1 + 1+4+1+1) = 29 B -> 37 B
UPDATE1, UPDATE2, CONTROL = 10_030, 20_030, 37


@pytest.mark.integration
def test_virtual_clock_equals_hand_computation(scripted):
    # p2p. Rank 0 (clock 0.5) sends both updates at once on a->b (1e6 B/s, 10 ms):
    #   first:  link busy 0.5 .. 0.51003, arrives 0.52003
    #   second: waits for the link, busy 0.51003 .. 0.53006, arrives 0.54006
    # Rank 1 (clock 0.2) receives both: 0.54006. Rank 2 (0.1) sends control to rank 0 over the
    # LAN, arriving at 0.1 + 0.001 + 37/1e8, earlier than rank 0's own 0.5.
    p2p = [0.5, 0.54006, 0.1]
    # all-reduce of 30 float32, K = 3: chunks of 10 elements = 40 B, 4 ring steps, each the max of
    # 0->1 (0.01 + 40/1e6), 1->2 (0.02 + 40/2e6), 2->0 (0.001 + 40/1e8) = 0.02002 s;
    # it starts when the last rank arrives (0.54006): 0.54006 + 0.08008 = 0.62014.
    ar = 0.54006 + 4 * 0.02002
    # broadcast of 1000 B from rank 1 (region b) to ranks 0 and 2 (region a): 0.02 + 1000/2e6.
    bc = ar + 0.0205
    # all-gather of 8 B pieces: 2 steps x max(0.01 + 8/1e6, 0.02 + 8/2e6, 0.001 + 8/1e8).
    ag = bc + 2 * 0.020004
    for rank, out in enumerate(scripted):
        assert out["virtual"]["clocks"] == pytest.approx([p2p[rank], ar, bc, ag], rel=1e-12, abs=1e-12)


def _summary(results, mode):
    from geodml.comm.ledger import Ledger

    return Ledger.summarize([row for out in results for row in out[mode]["rows"]])


@pytest.mark.integration
def test_ledger_totals_equal_hand_computed_numbers(scripted):
    # Bytes each rank sends (regions: rank 0 a, rank 1 b, rank 2 a):
    #   a->b: updates 10,030 + 20,030; all-reduce by rank 0: 4 chunks x 40 B = 160; all-gather
    #         by rank 0: 2 pieces x 8 B = 16                                  -> 30,236 B, 8 msgs
    #   b->a: all-reduce by rank 1: 160; broadcast 2 x 1000; all-gather 16    -> 2,176 B, 8 msgs
    #   a->a: control 37; all-reduce by rank 2: 160; all-gather 16            -> 213 B, 7 msgs
    for mode in ("virtual", "off"):
        s = _summary(scripted, mode)
        assert s["wan_bytes_total"] == 30_236 + 2_176
        assert s["lan_bytes_total"] == 213
        assert s["wan_bytes_by_link"] == {"a->b": 30_236, "b->a": 2_176}
        assert s["wan_bytes_by_kind"] == {"gradient": 320, "model": 2_000, "travel": 32, "update": 30_060}
        assert s["wan_messages_total"] == 16 and s["messages_total"] == 23
    # Emulated link seconds (transfer_s of each message alone):
    #   a->b: 0.01 + 0.01003, 0.01 + 0.02003, 4 x 0.01004, 2 x 0.010008 = 0.110236
    #   b->a: 4 x 0.02002, 2 x 0.0205, 2 x 0.020004                        = 0.161088
    emu = _summary(scripted, "virtual")["wan_emulated_seconds_by_link"]
    assert emu == pytest.approx({"a->b": 0.110236, "b->a": 0.161088}, rel=1e-12)
    assert _summary(scripted, "off")["wan_emulated_seconds_by_link"] == {"a->b": 0.0, "b->a": 0.0}


@pytest.mark.integration
def test_off_mode_counts_bytes_only(scripted):
    for rank, out in enumerate(scripted):
        assert out["off"]["clocks"] == [[0.5, 0.2, 0.1][rank]] * 4  # compute only


@pytest.mark.integration
def test_bsp_all_reduce_charged_by_the_ring_model(scripted):
    # 33 float32 gradients, K = 3, default topology (dc0, dc1, dc2; 100 Mbit/s, 50 ms):
    # chunks of 11 elements = 44 B; each rank sends 2(K-1) = 4 chunks = 176 B per step to its
    # successor; 3 steps -> 528 B per ring link, 1,584 B in all. Each step takes
    # 4 x (0.05 + 44*8/1e8) = 0.20001408 s of emulated time.
    from geodml.comm.ledger import Ledger

    rows = [r for out in scripted for r in out["bsp"]["rows"]]
    s = Ledger.summarize(rows)
    assert s["wan_bytes_total"] == 1_584
    assert s["wan_bytes_by_kind"] == {"gradient": 1_584}
    assert s["wan_bytes_by_link"] == {"dc0->dc1": 528, "dc1->dc2": 528, "dc2->dc0": 528}
    assert s["wan_messages_total"] == 3 * 3 * 4
    for out in scripted:
        assert out["bsp"]["clock"] == pytest.approx(3 * 4 * (0.05 + 44 * 8 / 1e8), rel=1e-12)


def _real_mode(rank, world, topology):
    import torch.distributed as dist

    from geodml.comm import build_comm
    from geodml.config import CommConfig
    from tests.support.inprocess import paced_exchange

    comm = build_comm(CommConfig(topology=topology, wan="real", timeout_s=20), rank=rank, world_size=world)
    dist.barrier()
    out = paced_exchange(comm, rank)
    comm.close()
    return out


@pytest.mark.integration
def test_real_mode_wall_time_follows_emulated_time(tmp_path):
    topo = tmp_path / "real.toml"
    topo.write_text(textwrap.dedent("""
        source = "illustrative (test)"
        regions = ["a", "b"]
        placement = ["a", "b"]
        [default]
        bandwidth_mbps = 40
        latency_ms = 30
    """))
    # Emulated (5e6 B/s, 30 ms): 5 updates of 50,030 B back to back -> the last arrives at
    # 5 x 0.010006 + 0.03 = 0.08003; the 37 B ack arrives back at 0.08003 + 0.03 + 37/5e6;
    # the all-reduce of 100,000 float32 (K = 2: 2 steps of 200,000 B) adds 2 x (0.03 + 0.04).
    ack = 5 * 50_030 / 5e6 + 0.03 + 0.03 + 37 / 5e6
    expect = ack + 2 * (0.03 + 200_000 / 5e6)
    out = run_workers("tests.test_comm_wan:_real_mode", 2, timeout_s=90, topology=str(topo))
    for wall, emulated, _, _ in out:
        assert emulated == pytest.approx(expect, rel=1e-12)
        assert 0.9 * emulated <= wall <= 1.5 * emulated + 0.25, (wall, emulated)
    # rank 1's first update not before latency + serialization after rank 0 started sending (one
    # host clock; from rank 1's own start it could look early when rank 1 left the barrier late)
    assert out[1][2] - out[0][3] >= 0.03 + 50_030 / 5e6 - 0.002


def test_compute_s_per_step_makes_the_emulated_clock_a_function_of_the_traffic(tmp_path):
    """--compute-s-per-step S replaces the measured compute: two runs agree on every emulated second, and
    BSP (synchronous every step) at S = 0.25 is exactly 30 x 0.25 = 7.5 s later than at S = 0 after 30 steps."""
    import geodml
    args = ["--algo", "bsp", "--dataset", "digits", "--partitions", "2", "--steps", "30", "--no-progress"]
    a, b, zero = (geodml.run([*args, "--compute-s-per-step", s, "--out", str(tmp_path / name)])
                  for s, name in (("0.25", "a"), ("0.25", "b"), ("0", "zero")))
    assert [m["emulated_s"] for m in a.metrics] == [m["emulated_s"] for m in b.metrics]
    assert a.summary["emulated_seconds"] == pytest.approx(zero.summary["emulated_seconds"] + 7.5, abs=1e-9)
    with pytest.raises(geodml.InputError, match=r"--compute-s-per-step must be >= 0 seconds, got -1.0"):
        geodml.run([*args, "--compute-s-per-step", "-1"])
