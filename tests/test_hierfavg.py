"""HierFAVG (issue 67 item 5, geodml/algorithms/hierfavg.py): two cloud rounds against an independent numpy
Algorithm 1, one region and kappa_2 = 1 against FedAvg, bytes per level and per link by hand, hosting,
checkpoints and flags."""

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
from geodml.algorithms.hierfavg import HierFAVG
from geodml.cli import parse_config
from geodml.comm.wire import envelope_nbytes
from tests.support.inprocess import run_threads
from tests.support.procs import run_command

N = 188_810          # the digits cnn's parameters (no float buffers)
BASE = ["--dataset", "digits", "--no-progress", "--eval-every", "20"]
CYCLIC = ["--topology", "five-continents-cyclic"]   # partition r on continent r mod 5


def _model(out):
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def _env(tag, src):
    return envelope_nbytes("model", tag, src, [np.zeros(N, np.float32)])


# ---- Algorithm 1 by hand ----------------------------------------------------------------------
def _ctx(rank, sizes, total):
    return AlgoContext(rank=rank, world_size=len(sizes), seed=0, steps_per_epoch=10, total_steps=total, batch_size=4,
                       label_counts=np.asarray(sizes, dtype=np.int64)[:, None])


def test_two_cloud_rounds_against_a_numpy_algorithm_1():
    """Liu et al.'s Algorithm 1 replayed in numpy: 6 partitions on five-continents-cyclic (africa holds 0 and 5,
    the others one each), sizes 1..6, w in R^3, gradient g_i(w) = w - a_i (a quadratic per partition), lr 0.1,
    no momentum, kappa_1 = 2, kappa_2 = 3, 12 steps: size-weighted edge averages at steps 2, 4, 8, 10, cloud
    averages at 6 and 12."""
    sizes, lr, k1, k2, steps = [1, 2, 3, 4, 5, 6], 0.1, 2, 3, 12
    rng = np.random.default_rng(7)
    a = rng.normal(size=(6, 3))
    w0 = rng.normal(size=3)
    regions = [[0, 5], [1], [2], [3], [4]]

    w = np.tile(w0, (6, 1))
    for k in range(1, steps + 1):
        w = w - lr * (w - a)
        if k % k1 == 0:
            edge = {tuple(m): sum(sizes[i] * w[i] for i in m) / sum(sizes[i] for i in m) for m in regions}
            if k % (k1 * k2) != 0:
                for m in regions:
                    w[m] = edge[tuple(m)]
            else:
                cloud = sum(sum(sizes[i] for i in m) * edge[tuple(m)] for m in regions) / sum(sizes)
                w[:] = cloud

    def fn(rank, comm):
        model = nn.Sequential(nn.Linear(3, 1, bias=False)).double()
        flat = FlatParams(model)
        flat.data.copy_(torch.from_numpy(w0))
        algo = HierFAVG(edge_every=k1, cloud_every=k2, flat=flat, comm=comm, momentum=0.0,
                        ctx=_ctx(rank, sizes, steps))
        target = torch.from_numpy(a[rank])
        for step in range(steps):
            torch.sub(flat.data, target, out=flat.grad)
            algo.step(step, lr)
        return flat.data.numpy().copy(), algo.edge_rounds, algo.syncs

    got = run_threads(6, fn, topology="five-continents-cyclic")
    for rank, (x, edges, clouds) in enumerate(got):
        np.testing.assert_allclose(x, w[rank], rtol=1e-12, atol=1e-12)
        assert (edges, clouds) == (4, 2)
    assert all(np.array_equal(got[0][0], g[0]) for g in got)        # the same bits everywhere


# ---- runs -------------------------------------------------------------------------------------
def test_bytes_per_level_by_hand(tmp_path):
    """10 partitions on 5 continents (rank r on continent r mod 5: the edges are ranks 0-4, the cloud rank 0 on
    africa), kappa_1 = 5, kappa_2 = 2, 40 steps: 4 cloud rounds (tags 0, 2, 4, 6), each with one edge average
    before it (after steps 4, 14, 24, 34: tags -5, -15, -25, -35). An edge average: in each region partition
    r + 5 sends its contribution to its edge r and gets the average back (2 LAN messages). A cloud average: the
    same 2 per region on the LAN, and each of the 4 other edges to the cloud and back (8 WAN messages, one each
    way per link). Every message is the model, 4 N bytes, plus its envelope."""
    r = geodml.run(["--algo", "hierfavg", "--edge-every", "5", "--cloud-every", "2", "--partitions", "10", *CYCLIC,
                    "--steps", "40", *BASE, "--out", str(tmp_path / "h")])
    clouds, edges = (0, 2, 4, 6), (-5, -15, -25, -35)
    up = {e: sum(4 * N + _env(t, e) for t in clouds) for e in (1, 2, 3, 4)}
    down = {e: sum(4 * N + _env(t, 0) for t in clouds) for e in (1, 2, 3, 4)}
    assert r.summary["wan_bytes_total"] == sum(up.values()) + sum(down.values())
    lan = sum(4 * N + _env(t, m) + 4 * N + _env(t, m - 5) for t in clouds + edges for m in range(5, 10))
    assert r.summary["lan_bytes_total"] == lan
    names = ["africa", "americas", "asia", "europe", "oceania"]
    assert r.summary["wan_bytes_by_link"] == {**{f"{names[e]}->africa": up[e] for e in up},
                                              **{f"africa->{names[e]}": down[e] for e in down}}
    last = r.metrics[-1]
    assert last["hierfavg_edge_rounds"] == 4 and last["fedavg_round"] == 4


def test_one_region_is_fedavg_and_kappa2_1_is_fedavg_through_the_edges(tmp_path):
    """One region (--topology lan): HierFAVG(kappa_1 = 10, kappa_2 = 2) is FedAvg with Iter_Local = 10, no WAN
    byte. Five regions with kappa_2 = 1: FedAvg with Iter_Local = 10 whose average runs through the edges. The
    same models up to float rounding: the averages are taken in another order (HierFAVG's edge average on the
    change since the cloud round's start), which differs by 1-4 ulp (max |diff| 1.5e-8 to 6e-8 at weights of
    0.2-0.3, measured at 10-51 steps); past ~50 steps one ReLU flips on such a difference and the runs part by
    ~1e-4 (measured at 52-60 steps), so the comparison stops at 40."""
    f = geodml.run(["--algo", "fedavg", "--iter-local", "10", "--partitions", "4", "--topology", "lan", "--steps", "40",
                    *BASE, "--out", str(tmp_path / "f")])
    h = geodml.run(["--algo", "hierfavg", "--edge-every", "10", "--cloud-every", "2", "--partitions", "4",
                    "--topology", "lan", "--steps", "40", *BASE, "--out", str(tmp_path / "h")])
    mh, mf = _model(h.out), _model(f.out)
    for k in mf:
        torch.testing.assert_close(mh[k], mf[k], rtol=0, atol=1e-7)
    assert h.summary["wan_bytes_total"] == 0 and h.metrics[-1]["hierfavg_edge_rounds"] == 2
    f10 = geodml.run(["--algo", "fedavg", "--iter-local", "10", "--partitions", "10", *CYCLIC, "--steps", "30", *BASE,
                      "--out", str(tmp_path / "f10")])
    h10 = geodml.run(["--algo", "hierfavg", "--edge-every", "10", "--cloud-every", "1", "--partitions", "10", *CYCLIC,
                      "--steps", "30", *BASE, "--out", str(tmp_path / "h10")])
    mh, mf = _model(h10.out), _model(f10.out)
    for k in mf:
        torch.testing.assert_close(mh[k], mf[k], rtol=0, atol=1e-7)
    assert h10.summary["wan_bytes_total"] < f10.summary["wan_bytes_total"]   # 8 models a round, not a ring of 10


def test_hosted_partitions_poisoned_scratch_and_skewscout(tmp_path, monkeypatch):
    """10 partitions hosted in one process with the shared scratch poisoned at every switch: the same run; and
    SkewScout moves kappa_2 on its grid."""
    args = ["--algo", "hierfavg", "--edge-every", "5", "--cloud-every", "2", "--partitions", "10", *CYCLIC,
            "--steps", "40", *BASE]
    a = geodml.run([*args, "--out", str(tmp_path / "a")])
    monkeypatch.setenv("GEODML_POISON_SCRATCH", "1")
    b = geodml.run([*args, "--out", str(tmp_path / "b")])
    ma, mb = _model(a.out), _model(b.out)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    monkeypatch.delenv("GEODML_POISON_SCRATCH")
    s = geodml.run(["--algo", "hierfavg", "--edge-every", "5", "--partitions", "5", "--steps", "80", "--skewscout",
                    "--travel-every", "20", *BASE, "--out", str(tmp_path / "sk")])
    traj = s.summary["theta_trajectory"]
    assert traj[0]["theta"] == 4.0 and all(t["theta"] in HierFAVG.KNOB.grid for t in traj) and len(traj) >= 2


def test_checkpoint_resume_is_bit_identical(tmp_path):
    args = ["--algo", "hierfavg", "--edge-every", "5", "--cloud-every", "3", "--partitions", "10", *CYCLIC,
            "--steps", "45", "--checkpoint-every", "20", *BASE]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    a, b = _model(full.out), _model(resumed.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]
    assert resumed.summary["lan_bytes_total"] == full.summary["lan_bytes_total"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    cmd = [sys.executable, "-m", "geodml", "--algo", "hierfavg", "--edge-every", "5", "--cloud-every", "2",
           "--partitions", "10", *CYCLIC, "--steps", "40", *BASE]
    env = {"OMP_NUM_THREADS": "1"}
    for procs in ("1", "2"):
        r = run_command([*cmd, "--processes", procs, "--out", str(tmp_path / procs)], timeout_s=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    a, b = _model(tmp_path / "1"), _model(tmp_path / "2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("1", "2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["lan_bytes_total"] == s2["lan_bytes_total"]


@pytest.mark.parametrize(("args", "message"), [
    (["--edge-every", "0"], r"--edge-every must be an integer >= 1, got 0"),
    (["--cloud-every", "0"], r"--cloud-every must be an integer >= 1, got 0"),
    (["--client-fraction", "0.5"], r"--client-fraction: HierFAVG averages every partition"),
    (["--local-epochs", "1"], r"--local-epochs: HierFAVG's rounds"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--algo", "hierfavg", *args])
