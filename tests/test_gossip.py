"""Gossip / D-PSGD (issue 67 item 4, geodml/algorithms/gossip.py, graphs.py): the graphs and their
Metropolis-Hastings weights by hand, one mixing by hand, the complete graph against FedAvg, bytes per
link by hand, hosting, checkpoints and flags."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from torch import nn

import geodml
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.gossip import Gossip
from geodml.algorithms.graphs import build_graph, metropolis_hastings
from geodml.cli import parse_config
from geodml.comm.wire import envelope_nbytes
from tests.support.inprocess import run_threads
from tests.support.procs import run_command

N = 188_810          # the digits cnn's parameters (no float buffers)


def _model(out):
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


# ---- graphs -----------------------------------------------------------------------------------
def test_graphs_by_hand():
    assert build_graph("ring", 4) == ((1, 3), (0, 2), (1, 3), (0, 2))
    assert build_graph("ring", 2) == ((1,), (0,))
    # 6 = 2 x 3: rank 0 at (0, 0): down is 3 (up is the same edge), right 1, left 2
    assert build_graph("torus", 6)[0] == (1, 2, 3) and build_graph("torus", 9)[4] == (1, 3, 5, 7)
    assert build_graph("exponential", 8)[0] == (1, 2, 4, 6, 7)
    assert build_graph("complete", 3) == ((1, 2), (0, 2), (0, 1))
    # regions a, b, c with listed links a-b and c->b only: a path 0 - 1 - 2, plus 3 beside 0 in region a
    g = build_graph("topology", 4, regions=["a", "b", "c", "a"], links={("a", "b"): 0, ("c", "b"): 0})
    assert g == ((1, 3), (0, 2, 3), (1,), (0, 1))
    with pytest.raises(ValueError, match="--graph torus: 5 partitions have no r x c grid"):
        build_graph("torus", 5)


def test_metropolis_hastings_weights_by_hand():
    # path 0 - 1 - 2: degrees 1, 2, 1: W01 = W12 = 1/(1+2), W00 = W22 = 2/3, W11 = 1/3
    w = metropolis_hastings(((1,), (0, 2), (1,)))
    assert w[0] == pytest.approx({1: 1 / 3, 0: 2 / 3}) and w[1] == pytest.approx({0: 1 / 3, 2: 1 / 3, 1: 1 / 3})
    assert all(v == pytest.approx(0.25) for row in metropolis_hastings(build_graph("complete", 4)) for v in row.values())


# ---- one mixing by hand -----------------------------------------------------------------------
def _ctx(rank, k, total):
    return AlgoContext(rank=rank, world_size=k, seed=0, steps_per_epoch=10, total_steps=total, batch_size=4,
                       label_counts=np.ones((k, 1), dtype=np.int64))


def _flat(value):
    model = nn.Sequential(nn.Linear(1, 1, bias=False)).double()
    flat = FlatParams(model)
    flat.data.fill_(value)
    return flat


@pytest.mark.parametrize("mix", ["before", "after"])
def test_one_mixing_on_a_ring_by_hand(mix):
    """Ring of 4, W = 1/3 on each neighbour and self; x = 1, 2, 3, 4; gradient g_i = i, lr 0.5, no momentum.
    before: x_i <- (x_{i-1} + x_i + x_{i+1}) / 3 - 0.5 g_i = 7/3, 2 - 0.5, 3 - 1, 8/3 - 1.5.
    after:  x_i <- mean over the same three of (x_j - 0.5 j) = 1, 1.5, 2, 2.5 mixed: 5/3, 3/2, 2, 11/6."""
    def fn(rank, comm):
        algo = Gossip(flat=_flat(rank + 1.0), comm=comm, momentum=0.0, ctx=_ctx(rank, 4, 1), graph="ring",
                      gossip_mix=mix)
        algo.flat.grad.fill_(float(rank))
        algo.step(0, 0.5)
        return algo.flat.data.item()

    expected = {"before": [7 / 3, 1.5, 2.0, 8 / 3 - 1.5], "after": [5 / 3, 1.5, 2.0, 11 / 6]}[mix]
    assert run_threads(4, fn) == pytest.approx(expected, abs=1e-12)


# ---- runs -------------------------------------------------------------------------------------
BASE = ["--dataset", "digits", "--no-progress"]


def test_complete_graph_mixing_after_is_fedavg(tmp_path):
    """K = 2 equal partitions (719 each), complete graph (W = 1/2), --gossip-mix after, period 10 is FedAvg with
    Iter_Local 10: the same models up to float rounding (FedAvg computes w_t - sum p (w_t - w^k), gossip
    sum W x), both partitions bit-identical; bytes: FedAvg's ring all-reduce of K = 2 sends n floats per rank,
    gossip one message of n floats plus its envelope per rank, so 4 mixings differ by 2 envelopes each."""
    g = geodml.run(["--algo", "gossip", "--graph", "complete", "--gossip-mix", "after", "--gossip-every", "10",
                    "--partitions", "2", "--steps", "40", *BASE, "--partition-scores", "all", "--out", str(tmp_path / "g")])
    f = geodml.run(["--algo", "fedavg", "--iter-local", "10", "--partitions", "2", "--steps", "40", *BASE,
                    "--out", str(tmp_path / "f")])
    mg, mf = _model(g.out), _model(f.out)
    for k in mf:
        torch.testing.assert_close(mg[k], mf[k], rtol=1e-4, atol=1e-6)
    per_rank = g.summary["per_rank_val_accuracy"]
    assert len(set(per_rank)) == 1 and g.summary["final_val_accuracy"] == pytest.approx(f.summary["final_val_accuracy"],
                                                                                       abs=0.002)
    envelopes = sum(envelope_nbytes("model", s, r, [np.zeros(N, np.float32)]) for s in (9, 19, 29, 39) for r in (0, 1))
    assert g.summary["wan_bytes_total"] - f.summary["wan_bytes_total"] == envelopes


def test_bytes_on_a_ring_and_per_link_on_the_topology_graph_by_hand(tmp_path):
    """Ring of 4, 20 steps, every step: 20 x 8 messages of 4n bytes plus their envelopes. five-continents with
    --graph topology (every pair of continents is a listed link: complete), period 10, 20 steps: every one of the
    20 directed links carries 2 messages (steps 9 and 19)."""
    r = geodml.run(["--algo", "gossip", "--graph", "ring", "--partitions", "4", "--steps", "20", *BASE,
                    "--out", str(tmp_path / "ring")])
    env = sum(envelope_nbytes("model", s, src, [np.zeros(N, np.float32)]) for s in range(20) for src in range(4)) * 2
    assert r.summary["wan_bytes_total"] == 20 * 8 * 4 * N + env
    t = geodml.run(["--algo", "gossip", "--graph", "topology", "--topology", "five-continents", "--gossip-every", "10",
                    "--partitions", "5", "--steps", "20", *BASE, "--out", str(tmp_path / "topo")])
    links = t.summary["wan_bytes_by_link"]
    assert len(links) == 20
    for name, nbytes in links.items():
        src = ["africa", "americas", "asia", "europe", "oceania"].index(name.split("->")[0])
        assert nbytes == sum(4 * N + envelope_nbytes("model", s, src, [np.zeros(N, np.float32)]) for s in (9, 19)), name


def test_it_learns_and_skewscout_tunes_the_period(tmp_path):
    r = geodml.run(["--algo", "gossip", "--graph", "ring", "--gossip-every", "5", "--partitions", "4", "--steps", "60",
                    *BASE, "--out", str(tmp_path / "r")])
    assert r.summary["final_val_accuracy"] > 0.6 and r.metrics[-1]["gossip_mixings"] == 12
    s = geodml.run(["--algo", "gossip", "--partitions", "4", "--steps", "60", "--skewscout", "--travel-every", "20", *BASE,
                    "--out", str(tmp_path / "sk")])
    traj = s.summary["theta_trajectory"]
    assert traj[0]["theta"] == 1.0 and all(t["theta"] in Gossip.KNOB.grid for t in traj) and len(traj) >= 2


def test_checkpoint_resume_is_bit_identical(tmp_path):
    args = ["--algo", "gossip", "--graph", "exponential", "--gossip-every", "3", "--partitions", "4", "--steps", "45",
            "--checkpoint-every", "25", *BASE]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    assert sorted(p.name for p in cut.glob("rank*/ckpt-*.pt")) == ["ckpt-00000025.pt"] * 4
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    a, b = _model(full.out), _model(resumed.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]
    assert resumed.summary["per_rank_val_accuracy"] == full.summary["per_rank_val_accuracy"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    cmd = [sys.executable, "-m", "geodml", "--algo", "gossip", "--graph", "ring", "--gossip-every", "2",
           "--partitions", "4", "--epochs", "1", *BASE]
    env = {"OMP_NUM_THREADS": "1"}
    for procs in ("1", "2"):
        r = run_command([*cmd, "--processes", procs, "--out", str(tmp_path / procs)], timeout_s=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    a, b = _model(tmp_path / "1"), _model(tmp_path / "2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("1", "2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["per_rank_val_accuracy"] == s2["per_rank_val_accuracy"]


@pytest.mark.parametrize(("args", "message"), [
    (["--graph", "star"], r"--graph: choose one of ring, torus, exponential, complete, topology|invalid choice"),
    (["--gossip-every", "0"], r"--gossip-every must be an integer >= 1, got 0"),
    (["--graph", "torus", "--partitions", "7"], r"--graph torus: 7 partitions have no r x c grid"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--algo", "gossip", *args])
