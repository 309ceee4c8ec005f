"""FedAdagrad / FedAdam / FedYogi (issue 67 item 6, geodml/algorithms/fedopt.py): Reddi et al. 2021's
Algorithm 2 server steps by hand and against an independent reference, the degenerate FedAvg
setting, the extra bytes of a download worked out by hand, hosting, checkpoints and the flags."""

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
from geodml.algorithms.fedavg import select_round
from geodml.algorithms.federated import FedAvgFamily
from geodml.algorithms.fedopt import FedOpt
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
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


# ---- the server step by hand ------------------------------------------------------------------
@pytest.mark.parametrize(("opt", "betas", "tau", "grads", "expected"), [
    # FedAdagrad, beta1 0, tau 4 (v starts at 16), eta 3. Round 1: Delta = -mean(2, 4) = -3, v = 16 + 9 = 25,
    # w = 1 + 3 (-3) / (5 + 4) = 0. Round 2: Delta = -12, v = 25 + 144 = 169, w = 0 + 3 (-12) / (13 + 4) = -36/17.
    ("adagrad", (0.0, 0.99), 4.0, {0: [2.0, 10.0], 1: [4.0, 14.0]}, [0.0, -36 / 17]),
    # FedAdam, betas 0.5, 0.75, tau 4, eta 4. Round 1: Delta = -4, m = -2, v = 0.75*16 + 0.25*16 = 16,
    # w = 1 + 4 (-2) / (4 + 4) = 0. Round 2: Delta = -4, m = -1 - 2 = -3, v = 16, w = 4 (-3) / 8 = -1.5.
    ("adam", (0.5, 0.75), 4.0, {0: [3.0, 3.0], 1: [5.0, 5.0]}, [0.0, -1.5]),
    # FedYogi, same. Round 1: Delta^2 = 16 = v, sign 0: v = 16, w = 0. Round 2: Delta = -6, Delta^2 = 36 > v:
    # v = 16 + 0.25*36 = 25, m = -1 - 3 = -4, w = 4 (-4) / (5 + 4) = -16/9.
    ("yogi", (0.5, 0.75), 4.0, {0: [3.0, 5.0], 1: [5.0, 7.0]}, [0.0, -16 / 9]),
])
def test_server_step_by_hand(opt, betas, tau, grads, expected):
    """K = 2, w0 = 1, local lr 1, no local momentum, Iter_Local 1: w^k = w_t - g_k, so Delta = -mean g."""
    eta = {"adagrad": 3.0, "adam": 4.0, "yogi": 4.0}[opt]

    def fn(rank, comm):
        algo = FedOpt(flat=_flat([1.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, [[1], [1]], total_steps=2),
                      iter_local=1, server_optimizer=opt, server_lr=eta, server_betas=betas, server_tau=tau)
        seen = []
        for s in range(2):
            algo.flat.grad.fill_(grads[rank][s])
            algo.step(s, 1.0)
            seen.append(algo.flat.data.item())
        return seen

    for got in run_threads(2, fn):
        assert got == pytest.approx(expected, abs=1e-12)


def _quadratic_grad():
    g = torch.Generator().manual_seed(7)
    a = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(4, 3, generator=g, dtype=torch.float64)
    return lambda r, w: a[r] * w + b[r]


def _reference(opt, *, k, steps, iter_local, lr, momentum, sizes, fraction, eta, b1, b2, tau):
    """Reddi et al. Algorithm 2 in numpy, written from the paper (not from fedopt.py): clients run FedAvg's
    local momentum SGD from x_t; Delta = sum p_k (x^k - x_t); server m, v, x as in the paper."""
    grad = _quadratic_grad()
    x = np.array([0.3, -0.2, 0.1])
    u = [np.zeros(3) for _ in range(k)]
    m, v = np.zeros(3), np.full(3, tau * tau)
    num = max(1, math.floor(fraction * k + 1e-9))
    for t in range(steps // iter_local):
        sel = list(range(k)) if num == k else sorted(
            np.random.default_rng([0, t, 0xFEDA]).choice(k, size=num, replace=False).tolist())
        p = np.array([sizes[r] for r in sel], dtype=float)
        p /= p.sum()
        big_delta = np.zeros(3)
        for pk, r in zip(p, sel):
            xk = x.copy()
            for _ in range(iter_local):
                u[r] = momentum * u[r] - lr * grad(r, torch.from_numpy(xk)).numpy()
                xk = xk + u[r]
            big_delta += pk * (xk - x)
        m = b1 * m + (1 - b1) * big_delta
        if opt == "adagrad":
            v = v + big_delta ** 2
        elif opt == "adam":
            v = b2 * v + (1 - b2) * big_delta ** 2
        else:
            v = v - (1 - b2) * big_delta ** 2 * np.sign(v - big_delta ** 2)
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("opt", ["adagrad", "adam", "yogi"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_matches_an_independent_reference_with_client_sampling(opt, fraction):
    """Four partitions of unequal size, 6 rounds of 3 local steps; with C = 0.5 stale participants
    download w_t, m and v (so the server state must travel whole)."""
    counts, steps = [[3, 1], [1, 1], [5, 5], [2, 0]], 18
    grad = _quadratic_grad()

    def fn(rank, comm):
        algo = FedOpt(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=0.9, ctx=_ctx(rank, counts, total_steps=steps),
                      iter_local=3, client_fraction=fraction, server_optimizer=opt, server_lr=0.1,
                      server_betas=(0.9, 0.99), server_tau=1e-3)
        for s in range(steps):
            algo.flat.grad.copy_(grad(rank, algo.flat.data) if algo.computes(s) else torch.zeros(3, dtype=torch.float64))
            algo.step(s, 0.05)
        algo.finish()
        return algo.flat.data.clone(), algo.global_model_rank

    out = run_threads(4, fn)
    ref = _reference(opt, k=4, steps=steps, iter_local=3, lr=0.05, momentum=0.9, sizes=[4, 2, 10, 2],
                     fraction=fraction, eta=0.1, b1=0.9, b2=0.99, tau=1e-3)
    holder = out[0][1]
    np.testing.assert_allclose(out[holder][0].numpy(), ref, rtol=1e-10, atol=1e-12)
    assert not np.allclose(ref, [0.3, -0.2, 0.1])


# ---- runs -------------------------------------------------------------------------------------
SMALL = ["--algo", "fedavg", "--dataset", "digits", "--partitions", "4", "--iter-local", "10", "--no-progress"]


def test_sgd_at_server_lr_1_is_fedavg_and_adam_learns(tmp_path):
    """Reddi et al.: FedAvg is FedOpt with SERVEROPT = SGD at server lr 1 (bit for bit, through the flags);
    FedAdam at eta 0.01 trains digits (4 partitions, 100 steps) to well above chance."""
    plain = geodml.run([*SMALL, "--steps", "60", "--out", str(tmp_path / "plain")])
    sgd = geodml.run([*SMALL, "--steps", "60", "--server-optimizer", "sgd", "--server-lr", "1",
                      "--out", str(tmp_path / "sgd")])
    _same_weights(plain.out, sgd.out)
    adam = geodml.run([*SMALL, "--steps", "100", "--server-optimizer", "adam", "--server-lr", "0.01",
                       "--out", str(tmp_path / "adam")])
    assert adam.summary["final_val_accuracy"] > 0.6
    assert adam.summary["wan_bytes_total"] == geodml.run(
        [*SMALL, "--steps", "100", "--out", str(tmp_path / "plain100")]).summary["wan_bytes_total"]


def test_a_download_carries_m_and_v_two_models_more_bytes_by_hand(tmp_path):
    """C = 0.5 of K = 4: a participant of round t not in round t-1 downloads the server state, FedAvg's w_t
    (+ no BN buffers: the cnn has none); FedYogi's w_t, m and v. The rounds' participants are the seeded
    draw; the extra bytes are 2 x n x 4 per download (float32; the envelope is the same one message)."""
    args = [*SMALL, "--steps", "60", "--client-fraction", "0.5"]
    plain = geodml.run([*args, "--out", str(tmp_path / "plain")])
    yogi = geodml.run([*args, "--server-optimizer", "yogi", "--server-lr", "0.01", "--out", str(tmp_path / "yogi")])
    n = sum(t.numel() for t in _model(plain.out).values())
    sel = [set(select_round(0, t, 4, 2)) for t in range(6)]
    downloads = sum(len(sel[t] - sel[t - 1]) for t in range(1, 6))
    assert downloads > 0
    assert yogi.summary["wan_bytes_total"] - plain.summary["wan_bytes_total"] == downloads * 2 * n * 4


def test_checkpoint_resume_is_bit_identical(tmp_path):
    args = [*SMALL, "--client-fraction", "0.5", "--server-optimizer", "adam", "--server-lr", "0.01",
            "--steps", "45", "--checkpoint-every", "25"]
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
    cmd = [sys.executable, "-m", "geodml", *SMALL, "--server-optimizer", "yogi", "--server-lr", "0.01",
           "--client-fraction", "0.5", "--epochs", "1"]
    env = {"OMP_NUM_THREADS": "1"}
    for procs in ("1", "2"):
        r = run_command([*cmd, "--processes", procs, "--out", str(tmp_path / procs)], timeout_s=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    _same_weights(tmp_path / "1", tmp_path / "2")
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("1", "2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["wan_bytes_total"] > 0


# ---- flags ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--server-optimizer", "rmsprop"], r"--server-optimizer: choose one of sgd, adagrad, adam, yogi|invalid choice"),
    (["--server-optimizer", "adam", "--server-momentum", "0.9"], r"--server-optimizer adam has its own momentum"),
    (["--server-betas", "0.9,1.0"], r"--server-betas takes two numbers in \[0, 1\)"),
    (["--server-tau", "0"], r"--server-tau must be > 0, got 0.0"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--algo", "fedavg", *args])


def test_built_class_and_warnings():
    from geodml.comm.inprocess import InProcessGroup
    cfg = parse_config(["--algo", "fedavg", "--server-optimizer", "yogi", "--server-betas", "0.8,0.9",
                        "--server-tau", "0.01", "--server-lr", "0.5"])
    comm = InProcessGroup(1).comm(0)
    algo = FedAvgFamily.from_config(cfg, flat=_flat([1.0, 2.0]), comm=comm, ctx=_ctx(0, [[1]], total_steps=5))
    assert isinstance(algo, FedOpt) and (algo.beta1, algo.beta2, algo.tau, algo.server_lr) == (0.8, 0.9, 0.01, 0.5)
    assert torch.equal(algo.v, torch.full((2,), 1e-4, dtype=torch.float64))
    with pytest.warns(UserWarning, match="--server-betas and --server-tau do nothing with --server-optimizer sgd"):
        FedAvgFamily.from_config(parse_config(["--algo", "fedavg", "--server-tau", "0.1"]), flat=_flat([1.0]),
                                 comm=InProcessGroup(1).comm(0), ctx=_ctx(0, [[1]], total_steps=5))
