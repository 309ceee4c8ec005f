"""SCAFFOLD option II (issue 67 item 6, geodml/algorithms/scaffold.py): two rounds by hand, six
against an independent numpy version of Karimireddy et al.'s Algorithm 1 with client sampling, its
bytes (twice FedAvg's upload) by hand, hosting, checkpoints and flags."""

from __future__ import annotations

import json
import math
import shutil
import sys

import numpy as np
import pytest
import torch
from torch import nn

import geodml
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.scaffold import Scaffold
from geodml.cli import parse_config
from tests.support.inprocess import run_threads
from tests.support.procs import run_command


def _ctx(rank, counts, *, total_steps):
    return AlgoContext(rank=rank, world_size=len(counts), seed=0, steps_per_epoch=10, total_steps=total_steps,
                       batch_size=4, label_counts=np.asarray(counts, dtype=np.int64))


def _flat(w):
    model = nn.Sequential(nn.Linear(len(w), 1, bias=False)).double()
    flat = FlatParams(model)
    flat.data.copy_(torch.tensor(w, dtype=torch.float64))
    return flat


def _model(out):
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def _same_weights(a, b):
    ma, mb = _model(a), _model(b)
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


def test_two_rounds_by_hand():
    """K = 2, x0 = 1, eta_l 1, no momentum, one local step, eta_g 1; gradients (2, 1) on partition 0 and (4, 3)
    on partition 1 (constants). Round 1 (c = c_i = 0): y = -1, -3; c_i+ = (1 - y) / 1 = 2, 4; x = 1 + mean(-2, -4)
    = -2; c = 0 + (2/2) mean(2, 4) = 3. Round 2: y_0 = -2 - (1 - 2 + 3) = -4, y_1 = -2 - (3 - 4 + 3) = -4;
    c_0+ = 2 - 3 + (-2 + 4) = 1, c_1+ = 4 - 3 + 2 = 3; x = -4; c = 3 + mean(1 - 2, 3 - 4) = 2."""
    g = {0: [2.0, 1.0], 1: [4.0, 3.0]}

    def fn(rank, comm):
        algo = Scaffold(flat=_flat([1.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, [[1], [5]], total_steps=2),
                        iter_local=1)
        for s in range(2):
            algo.flat.grad.fill_(g[rank][s])
            algo.step(s, 1.0)
        return algo.flat.data.item(), algo.c_i.item(), algo.c.item()

    assert run_threads(2, fn) == [(-4.0, 1.0, 2.0), (-4.0, 3.0, 2.0)]


def _quadratic_grad():
    g = torch.Generator().manual_seed(11)
    a = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(4, 3, generator=g, dtype=torch.float64)
    return lambda r, w: a[r] * w + b[r]


def _reference(*, k, rounds, local, lr, fraction, eta_g):
    """Algorithm 1, option II, written from the paper in numpy (plain local SGD, uniform averages)."""
    grad = _quadratic_grad()
    x, c = np.array([0.3, -0.2, 0.1]), np.zeros(3)
    ci = [np.zeros(3) for _ in range(k)]
    num = max(1, math.floor(fraction * k + 1e-9))
    for t in range(rounds):
        sel = list(range(k)) if num == k else sorted(
            np.random.default_rng([0, t, 0xFEDA]).choice(k, size=num, replace=False).tolist())
        dy, dc = np.zeros(3), np.zeros(3)
        for i in sel:
            y = x.copy()
            for _ in range(local):
                y = y - lr * (grad(i, torch.from_numpy(y)).numpy() - ci[i] + c)
            plus = ci[i] - c + (x - y) / (local * lr)
            dy += (y - x) / len(sel)
            dc += (plus - ci[i]) / len(sel)
            ci[i] = plus
        x = x + eta_g * dy
        c = c + len(sel) / k * dc
    return x, c


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_matches_an_independent_reference_with_client_sampling(fraction):
    counts, rounds, local = [[3, 1], [1, 1], [5, 5], [2, 0]], 6, 3

    grad = _quadratic_grad()

    def fn(rank, comm):
        algo = Scaffold(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=0.0,
                        ctx=_ctx(rank, counts, total_steps=rounds * local), iter_local=local,
                        client_fraction=fraction, global_lr=0.8)
        for s in range(rounds * local):
            algo.flat.grad.copy_(grad(rank, algo.flat.data) if algo.computes(s) else torch.zeros(3, dtype=torch.float64))
            algo.step(s, 0.1)
        algo.finish()
        return algo.flat.data.clone(), algo.c.clone(), algo.global_model_rank

    out = run_threads(4, fn)
    x, c = _reference(k=4, rounds=rounds, local=local, lr=0.1, fraction=fraction, eta_g=0.8)
    holder = out[0][2]
    np.testing.assert_allclose(out[holder][0].numpy(), x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[holder][1].numpy(), c, rtol=1e-10, atol=1e-12)
    assert np.linalg.norm(c) > 1e-3                      # the control variates really moved


SMALL = ["--algo", "scaffold", "--momentum", "0", "--lr", "0.05", "--dataset", "digits", "--partitions", "4",
         "--iter-local", "10", "--no-progress"]


def test_bytes_are_twice_fedavgs_upload_by_hand_and_it_learns_under_label_skew(tmp_path):
    """K = 4, all take part, 50 steps of Iter_Local 10 = 5 rounds; a ring all-reduce of [Delta y | Delta c]
    (2n float32, n = 188,810, the cnn has no buffers) charges 2 (K-1)/K x 2n x 4 bytes per rank: over 4 ranks
    and 5 rounds 5 x 2 x 3 x 2 x 188,810 x 4 = 45,314,400 B. Under 100% label skew it learns."""
    r = geodml.run([*SMALL, "--steps", "50", "--partition", "label", "--skew", "1.0", "--out", str(tmp_path / "r")])
    assert r.summary["wan_bytes_total"] == 5 * 2 * 3 * 2 * 188_810 * 4 == 45_314_400
    assert r.summary["final_val_accuracy"] > 0.3


def test_checkpoint_resume_is_bit_identical(tmp_path):
    args = [*SMALL, "--client-fraction", "0.5", "--steps", "45", "--checkpoint-every", "25"]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    assert sorted(p.name for p in cut.glob("rank*/ckpt-*.pt")) == ["ckpt-00000025.pt"] * 4
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    _same_weights(full.out, resumed.out)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    cmd = [sys.executable, "-m", "geodml", *SMALL, "--client-fraction", "0.5", "--epochs", "1"]
    env = {"OMP_NUM_THREADS": "1"}
    for procs in ("1", "2"):
        r = run_command([*cmd, "--processes", procs, "--out", str(tmp_path / procs)], timeout_s=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    _same_weights(tmp_path / "1", tmp_path / "2")
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("1", "2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["wan_bytes_total"] > 0


def test_flags():
    with pytest.raises(ValueError, match=r"--global-lr must be > 0, got 0.0"):
        parse_config(["--algo", "scaffold", "--global-lr", "0"])
    assert parse_config(["--algo", "scaffold", "--global-lr", "0.5"]).plugin.global_lr == 0.5
    with pytest.warns(UserWarning, match="SCAFFOLD's local solver is plain SGD"):
        Scaffold.from_config(parse_config(["--algo", "scaffold"]), flat=_flat([1.0]), comm=_one_comm(),
                             ctx=_ctx(0, [[1]], total_steps=2))


def _one_comm():
    from geodml.comm.inprocess import InProcessGroup
    return InProcessGroup(1).comm(0)
