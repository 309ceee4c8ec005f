"""Gaia (Quagmire Appendix A, Algorithm 1): selection by hand, threshold schedule, and the
two limits that reduce it to known algorithms (T0 = 0: one model moved by the sum of all
momentum updates; T0 huge: K independent local runs with no update bytes)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.gaia import Gaia
from tests.support.procs import run_torchrun

COMMON = ["--dataset", "digits", "--model", "cnn", "--norm", "none", "--no-progress", "--wan", "off"]


def _ctx(k=1):
    return AlgoContext(rank=0, world_size=k, seed=0, steps_per_epoch=10, total_steps=100, batch_size=4,
                       label_counts=np.ones((k, 10), dtype=np.int64))


def _gaia(w, t0=0.1, lr0=0.1):
    model = torch.nn.Linear(len(w), 1, bias=False)
    flat = FlatParams(model)
    flat.data.copy_(torch.tensor(w))
    return Gaia(flat=flat, comm=None, momentum=0.9, ctx=_ctx(), t0=t0, lr0=lr0)


def test_selection_by_hand():
    # |v| > T*|w| with T = 0.1:  0.5 > 0.1 yes;  0.01 > 0.1 no;  0.2 > 0.01 yes;  0 > 0 no
    g = _gaia([1.0, 1.0, -0.1, 0.0])
    g.v.copy_(torch.tensor([0.5, -0.01, 0.2, 0.0]))
    n, dense = g.select(0.1)
    assert (n, dense) == (2, False)
    assert g.idx32[:2].tolist() == [0, 2]
    assert g.vals[:2].tolist() == pytest.approx([0.5, 0.2])
    assert g.v.tolist() == pytest.approx([0.0, -0.01, 0.0, 0.0])  # cleared where sent, kept elsewhere


def test_zero_weight_is_significant_without_division():
    # w = 0: any nonzero accumulated update is significant (|v| > T*0), no division by zero
    g = _gaia([0.0, 0.0, 3.0])
    g.v.copy_(torch.tensor([1e-8, 0.0, 0.1]))
    n, dense = g.select(0.1)
    assert n == 1 and not dense and g.idx32[:1].tolist() == [0]


def test_dense_when_more_than_half_significant():
    # 3 of 4 significant: sparse would cost 3*8 = 24 B > dense 4*4 = 16 B
    g = _gaia([1.0, 1.0, 1.0, 1.0])
    g.v.copy_(torch.tensor([0.5, 0.5, 0.5, 0.01]))
    n, dense = g.select(0.1)
    assert (n, dense) == (3, True)
    assert g.vals.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert g.v.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.01])


def test_local_update_accumulates_momentum_update():
    # u = m*u - lr*g; w += u; v += u  (Algorithm 1 lines 5-7)
    g = _gaia([1.0, 2.0], t0=1e9)
    g.flat.grad.copy_(torch.tensor([1.0, -2.0]))
    g.local_update(0, 0.1)
    assert g.u.tolist() == pytest.approx([-0.1, 0.2])
    assert g.flat.data.tolist() == pytest.approx([0.9, 2.2])
    g.local_update(1, 0.1)  # u = 0.9*[-0.1, 0.2] - 0.1*[1, -2] = [-0.19, 0.38]
    assert g.u.tolist() == pytest.approx([-0.19, 0.38])
    assert g.v.tolist() == pytest.approx([-0.29, 0.58])


def test_threshold_follows_learning_rate():
    # T_t = T0 * lr_t / lr_0: T0 = 0.1, lr0 = 0.1 -> 0.1, then 0.01 after lr/10, 0.001 after lr/100
    g = _gaia([1.0, 1.0], t0=0.1, lr0=0.1)
    for lr, expected in [(0.1, 0.1), (0.01, 0.01), (0.001, 0.001)]:
        g.after_step(0, lr)
        assert g.threshold == pytest.approx(expected)


def _reference_sum_of_updates(k, seed, steps, lr, momentum, wd, batch):
    """One model; every step each of the K partitions computes its momentum update u_k on
    its own minibatch at the shared weights, and the model moves by sum_k u_k."""
    from geodml.config import DataConfig
    from geodml.data.datasets import load_dataset
    from geodml.data.partition import make_partitioner
    from geodml.models import build_model
    from geodml.trainer import BatchSampler

    ds = load_dataset("digits", None, seed=seed)
    parts = make_partitioner(DataConfig(partition="iid")).split(ds.train_y.numpy(), k, np.random.default_rng([seed, 0xDA7A]))
    samplers = [BatchSampler(parts[r], batch, seed, r) for r in range(k)]
    model = build_model("cnn", "none", ds.input_shape, ds.num_classes, generator_seed=seed).double()
    params = list(model.parameters())
    u = [[torch.zeros_like(p) for p in params] for _ in range(k)]
    x = ds.train_x.double()
    for _ in range(steps):
        total = [torch.zeros_like(p) for p in params]
        for r in range(k):
            idx = torch.from_numpy(samplers[r].next().copy())
            grads = torch.autograd.grad(F.cross_entropy(model(x[idx]), ds.train_y[idx]), params)
            with torch.no_grad():
                for j, (p, g) in enumerate(zip(params, grads)):
                    u[r][j].mul_(momentum).add_(g + wd * p, alpha=-lr)
                    total[j].add_(u[r][j])
        with torch.no_grad():
            for p, t in zip(params, total):
                p.add_(t)
    return {n: p.detach().float() for n, p in model.named_parameters()}


def _models(out, k):
    return [torch.load(out / f"rank{i}" / "model.pt", weights_only=True) for i in range(k)]


@pytest.mark.integration
def test_t0_zero_is_one_model_moved_by_sum_of_updates(tmp_path):
    k, seed, batch, out = 3, 5, 8, tmp_path / "run"
    r = run_torchrun(k, [*COMMON, "--algo", "gaia", "--t0", "0", "--epochs", "0.25", "--batch-size", str(batch),
                         "--lr", "0.01", "--weight-decay", "0.0005", "--seed", str(seed), "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert steps == 15  # ceil(1438 / 24) = 60 steps/epoch
    ref = _reference_sum_of_updates(k, seed, steps, 0.01, 0.9, 0.0005, batch)
    for sd in _models(out, k):
        for name, p in ref.items():
            torch.testing.assert_close(sd[name], p, rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_huge_threshold_is_independent_local_training(tmp_path):
    k, seed, out = 3, 2, tmp_path / "run"
    r = run_torchrun(k, [*COMMON, "--algo", "gaia", "--t0", "1e9", "--epochs", "0.25", "--seed", str(seed),
                         "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["wan_bytes_total"] == 0 and s["wan_bytes_by_kind"].get("update", 0) == 0
    # each partition equals plain local momentum SGD on its own data from the same init
    from geodml.config import DataConfig
    from geodml.data.datasets import load_dataset
    from geodml.data.partition import make_partitioner
    from geodml.models import build_model
    from geodml.trainer import BatchSampler
    ds = load_dataset("digits", None, seed=seed)
    parts = make_partitioner(DataConfig(partition="iid")).split(ds.train_y.numpy(), k, np.random.default_rng([seed, 0xDA7A]))
    models = _models(out, k)
    for r_ in range(k):
        model = build_model("cnn", "none", ds.input_shape, ds.num_classes, generator_seed=seed)
        opt_u = [torch.zeros_like(p) for p in model.parameters()]
        sampler = BatchSampler(parts[r_], 20, seed, r_)
        for _ in range(s["steps"]):
            idx = torch.from_numpy(sampler.next().copy())
            loss = F.cross_entropy(model(ds.train_x[idx]), ds.train_y[idx])
            grads = torch.autograd.grad(loss, list(model.parameters()))
            with torch.no_grad():
                for p, g, u in zip(model.parameters(), grads, opt_u):
                    u.mul_(0.9).add_(g + 0.0005 * p, alpha=-0.02)
                    p.add_(u)
        for name, p in model.named_parameters():
            torch.testing.assert_close(models[r_][name], p.detach(), rtol=1e-4, atol=1e-5)
    # the partitions really did diverge
    assert not torch.equal(models[0]["fc2.weight"], models[1]["fc2.weight"])


def _gaia_bytes_worker(rank, world, steps):
    import msgpack

    from geodml.comm import build_comm
    from geodml.comm.wire import PROTOCOL_VERSION
    from geodml.config import CommConfig

    comm = build_comm(CommConfig(wan="off"), rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(50, 4)  # 204 parameters
        flat = FlatParams(model)
        ctx = AlgoContext(rank=rank, world_size=world, seed=0, steps_per_epoch=10, total_steps=steps, batch_size=4,
                          label_counts=np.ones((world, 4), dtype=np.int64))
        g = Gaia(flat=flat, comm=comm, momentum=0.9, ctx=ctx, t0=0.05, lr0=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        expected = 0
        sent = []
        for step in range(steps):
            # dense early (many significant), two quiet steps (markers only), then sparse
            g.t0 = 1e9 if step in (3, 4) else (0.05 if step < 3 else 3.0)
            flat.grad.copy_(torch.randn(flat.numel, generator=gen))
            g.step(step, 0.1)
            n, dense = g.sent_entries, g.sent_dense
            sent.append((n, dense))
            if n:
                descs = [["<f4", [flat.numel]]] if dense else [["<i4", [n]], ["<f4", [n]]]
                envelope = len(msgpack.packb([PROTOCOL_VERSION, "update", step, rank, 0.0, descs]))
                payload = 4 * flat.numel if dense else 8 * n
                expected += (world - 1) * (envelope + payload)
        charged = sum(r["bytes"] for r in comm.ledger.rows() if r["kind"] == "update")
        return {"expected": expected, "charged": charged, "sent": sent}
    finally:
        comm.close()


@pytest.mark.integration
def test_update_bytes_are_entries_times_8_plus_envelope():
    from tests.support.procs import run_workers
    res = run_workers("tests.test_gaia:_gaia_bytes_worker", 3, timeout_s=90, steps=10)
    for r in res:
        assert r["charged"] == r["expected"]
        assert r["sent"][3][0] == 0 and r["sent"][4][0] == 0       # forced quiet steps: nothing charged
        assert any(n for n, _ in r["sent"]) and r["charged"] > 0
        assert any(d for _, d in r["sent"]) and any(n and not d for n, d in r["sent"])  # both wire formats used
