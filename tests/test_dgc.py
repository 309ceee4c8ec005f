"""DeepGradientCompression (Quagmire Algorithm 3): schedule, selection, hand-worked steps, the
s = 0 reduction to plain SGD on the summed gradients, sent counts against the ledger, identical
weights on every partition -- single-process with K in-process partitions, then real processes
(gloo + ZeroMQ) and one end-to-end torchrun."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.dgc import DGC, WARMUP_SPARSITIES, warmup_sparsity
from geodml.algorithms.topk import TopSelector, target_count
from geodml.comm import InProcessGroup
from geodml.comm.wire import envelope_nbytes
from geodml.config import DGCConfig
from tests.support.procs import run_torchrun, run_workers

# ---------------------------------------------------------------------------------------------
# K partitions in one process (InProcessComm: what the real Comm charges for a point-to-point
# message, envelope + payload, per peer): before_step of every partition sends, then
# local_update of every partition receives (the driver interleaves the two phases).


def _ctx(rank, k, spe=1000, seed=0):
    return AlgoContext(rank=rank, world_size=k, seed=seed, steps_per_epoch=spe, total_steps=10 * spe, batch_size=1,
                       label_counts=np.ones((k, 2), dtype=np.int64))


def _make(k, numel, w0, *, spe=1000, momentum=0.9, **kw):
    group = InProcessGroup(k)
    algos = []
    for r in range(k):
        flat = FlatParams(nn.Linear(numel, 1, bias=False))
        flat.data.copy_(torch.as_tensor(w0, dtype=torch.float32))
        algos.append(DGC(flat=flat, comm=group.comm(r), momentum=momentum, ctx=_ctx(r, k, spe), **kw))
    return algos


def _step(algos, step, lr, grads):
    """One lock-step step of all partitions with the given per-partition gradients."""
    for a, g in zip(algos, grads):
        a.flat.grad.copy_(torch.as_tensor(g, dtype=torch.float32))
    for a in algos:
        a.before_step(step, lr)
    for a in algos:
        a.local_update(step, lr)
        a.after_step(step, lr)


# ---------------------------------------------------------------------------------------------
# Warm-up schedule (Quagmire §3: "if E_warm=4, s is 75% in epochs 1-4, 93.75% in epochs 5-8, ...")

STAGES = [0.75, 0.9375, 0.984375, 0.99609375]


@pytest.mark.parametrize("e_warm", [1, 2, 4, 8])
def test_warmup_schedule_per_epoch(e_warm):
    spe = 7
    for epoch in range(5 * e_warm + 3):
        want = STAGES[epoch // e_warm] if epoch < 4 * e_warm else 0.999
        for step in (epoch * spe, epoch * spe + spe - 1):  # first and last step of the epoch
            assert warmup_sparsity(step, spe, e_warm, 0.999) == want, (e_warm, epoch, step)


def test_warmup_hand_table_e_warm_2():
    # epochs 0-1: 75%, 2-3: 93.75%, 4-5: 98.4375%, 6-7: 99.609375%, 8+: 99.9%
    got = [warmup_sparsity(e * 10, 10, 2, 0.999) for e in range(10)]
    assert got == [0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.984375, 0.99609375, 0.99609375, 0.999, 0.999]
    assert tuple(STAGES) == WARMUP_SPARSITIES
    assert [round(1 - 4.0 ** -i, 10) for i in range(1, 5)] == STAGES


def test_warmup_final_override_zero_and_fractional():
    assert warmup_sparsity(0, 10, 4, 0.99) == 0.75  # --sparsity overrides only the final value
    assert warmup_sparsity(400, 10, 4, 0.99) == 0.99
    assert warmup_sparsity(0, 10, 4, 0.5) == 0.5  # a stage above the final value is capped
    assert warmup_sparsity(0, 10, 4, 0.0) == 0.0 and warmup_sparsity(10**6, 10, 4, 0.0) == 0.0
    assert warmup_sparsity(0, 10, 0, 0.999) == 0.999  # e_warm = 0: no warm-up
    # fractional stages: e_warm 0.3 epochs of 60 steps = 18 steps per stage, exact at the edges
    assert [warmup_sparsity(s, 60, 0.3, 0.999) for s in (17, 18, 35, 36, 71, 72)] == \
        [0.75, 0.9375, 0.9375, 0.984375, 0.99609375, 0.999]


def test_target_count_hand_numbers():
    assert target_count(0.999, 188_810) == 189  # ceil(188.81)
    assert target_count(0.999, 1000) == 1  # not 2: (1 - 0.999) * 1000 = 1.0000000000000009
    assert target_count(0.75, 10) == 3  # ceil(2.5)
    assert target_count(0.0, 10) == 10
    assert target_count(0.9999999, 10) == 1


# ---------------------------------------------------------------------------------------------
# Threshold selection


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("numel,sparsity", [(200_000, 0.75), (200_000, 0.99), (50_000, 0.999), (1000, 0.9)])
def test_selection_contains_exact_topk_within_bounds(backend, numel, sparsity):
    gen = torch.Generator().manual_seed(1)
    sel = TopSelector(numel, sample_ratio=0.01, sparsities=(sparsity,), generator=torch.Generator().manual_seed(2),
                      backend=backend)
    k = target_count(sparsity, numel)
    paths = set()
    for _ in range(20 if k < 5000 else 6):
        v = torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen) ** 4  # heavy-tailed
        idx = sel.select(v, sparsity)
        paths.add(sel.path)
        c = idx.numel()
        assert k <= c <= math.floor(TopSelector.UPPER * k), (sel.path, c, k)
        hit = torch.zeros(numel, dtype=torch.int32).index_add_(0, idx, torch.ones(c, dtype=torch.int32))
        assert int(hit.max()) == 1  # no index twice
        assert bool(hit[torch.topk(v.abs(), k).indices].all())  # contains the exact top-k
    if numel == 1000 or (numel == 50_000 and sparsity == 0.999):
        assert paths == {"exact"}  # a sample of >= N/4 does not pay
    else:
        assert paths <= {"sampled", "refined", "fallback"} and "sampled" in paths | {"refined"}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_selection_refine_and_fallback_paths(backend, monkeypatch):
    numel, s = 100_000, 0.99
    k = target_count(s, numel)
    v = torch.randn(numel, generator=torch.Generator().manual_seed(3))
    exact = set(torch.topk(v.abs(), k).indices.tolist())
    sel = TopSelector(numel, sample_ratio=0.01, sparsities=(s,), generator=torch.Generator().manual_seed(4),
                      backend=backend)
    monkeypatch.setattr(TopSelector, "MARGIN_SD", 40.0)  # threshold far too low: many candidates
    idx = sel.select(v, s)
    assert sel.path == "refined" and set(idx.tolist()) == exact
    monkeypatch.setattr(TopSelector, "MARGIN_SD", -40.0)  # far too high: the sample misses
    idx = sel.select(v, s)
    assert sel.path == "fallback" and set(idx.tolist()) == exact


def test_selection_ties_and_zeros():
    """All-zero accumulator (dead units): still exactly k entries, never an empty message."""
    sel = TopSelector(100_000, sample_ratio=0.01, sparsities=(0.99,), generator=torch.Generator().manual_seed(0))
    idx = sel.select(torch.zeros(100_000), 0.99)
    assert idx.numel() == 1000 and sel.path == "refined"
    small = TopSelector(1000, sample_ratio=0.01, sparsities=(0.9,), generator=torch.Generator().manual_seed(0))
    v = torch.tensor([1.0, -1.0] * 500)  # all tied: the exact path cuts the ties down to k
    idx = small.select(v, 0.9)
    assert idx.numel() == 100 and small.path == "exact" and torch.unique(idx).numel() == 100
    v[7] = -3.0
    assert 7 in small.select(v, 0.9).tolist()


# ---------------------------------------------------------------------------------------------
# Algorithm 3 by hand: K=2, N=4, m=0.5, lr=1, s=0.75 (k=1), no warm-up


def test_two_steps_by_hand():
    a0, a1 = _make(2, 4, [1, 1, 1, 1], spe=2, momentum=0.5, sparsity=0.75, e_warm=0)
    _step([a0, a1], 0, 1.0, [[-1, 0.5, 0.2, 0], [0.1, -0.3, 2, 0]])
    # rank 0: u = v = [1, -.5, -.2, 0] -> sends index 0 (1.0); rank 1: u = v = [-.1, .3, -2, 0] -> index 2
    for a in (a0, a1):
        torch.testing.assert_close(a.flat.data, torch.tensor([2.0, 1.0, -1.0, 1.0]))
    torch.testing.assert_close(a0.v, torch.tensor([0.0, -0.5, -0.2, 0.0]))
    torch.testing.assert_close(a0.u, torch.tensor([0.0, -0.5, -0.2, 0.0]))  # masked at index 0
    torch.testing.assert_close(a1.v, torch.tensor([-0.1, 0.3, 0.0, 0.0]))
    torch.testing.assert_close(a1.u, torch.tensor([-0.1, 0.3, 0.0, 0.0]))
    _step([a0, a1], 1, 1.0, [[0, 0.4, 0, 0], [0, 0, 0, 0.05]])
    # rank 0: u = .5*u - g = [0, -.65, -.1, 0]; v = [0, -1.15, -.3, 0] -> sends index 1 (-1.15)
    # rank 1: u = [-.05, .15, 0, -.05]; v = [-.15, .45, 0, -.05] -> sends index 1 (.45)
    for a in (a0, a1):
        torch.testing.assert_close(a.flat.data, torch.tensor([2.0, 0.3, -1.0, 1.0]))
    torch.testing.assert_close(a0.v, torch.tensor([0.0, 0.0, -0.3, 0.0]))
    torch.testing.assert_close(a0.u, torch.tensor([0.0, 0.0, -0.1, 0.0]))
    torch.testing.assert_close(a1.v, torch.tensor([-0.15, 0.0, 0.0, -0.05]))
    torch.testing.assert_close(a1.u, torch.tensor([-0.05, 0.0, 0.0, -0.05]))
    assert a0.total_sent == a1.total_sent == 2 and a0.last_sent == 1
    # Appendix G on rank 0: step 0 mean|v/w| = (.5/1 + .2/1)/4 = .175; step 1: (.3/1)/4 = .075
    st = a0.stats()
    assert st["dgc_residual_delta"] == pytest.approx((0.175 + 0.075) / 2)
    assert st["dgc_residual_norm_ratio"] == pytest.approx(
        (math.hypot(0.5, 0.2) / math.sqrt(4 + 1 + 1 + 1) + 0.3 / math.sqrt(4 + 0.09 + 1 + 1)) / 2, rel=1e-6)
    assert st["dgc_sparsity"] == 0.75 and st["dgc_sent_entries"] == 1 and "dgc_residual_delta_last_epoch" not in st
    _step([a0, a1], 2, 1.0, [[0, 0, 0, 0], [0, 0, 0, 0]])  # epoch 1 starts: epoch 0 is complete
    assert a0.stats()["dgc_residual_delta_last_epoch"] == pytest.approx(0.125)
    # ledger: each step one sparse message of 1 entry (int32 + float32) + envelope to the one peer
    led = a0.comm.ledger.rows()
    env = sum(envelope_nbytes("gradient", s, 0, [np.zeros(1, np.int32), np.zeros(1, np.float32)]) for s in range(3))
    assert [(r["kind"], r["bytes"], r["messages"]) for r in led] == [("gradient", env + 3 * 8, 3)]


def test_residual_delta_excludes_zero_weights():
    """K=1, m=0, lr=1, s=0.75 (k=1), w = [0, 1, 1, 1], grad [.3, .5, .2, .1]: v = [-.3, -.5, -.2, -.1],
    index 1 is sent; w = [0, .5, 1, 1], v = [-.3, 0, -.2, -.1]. w_0 = 0 is excluded (v_0/w_0 = inf):
    delta = (0/.5 + .2/1 + .1/1) / 3 = .1."""
    (a,) = _make(1, 4, [0, 1, 1, 1], momentum=0.0, sparsity=0.75, e_warm=0)
    _step([a], 0, 1.0, [[0.3, 0.5, 0.2, 0.1]])
    torch.testing.assert_close(a.flat.data, torch.tensor([0.0, 0.5, 1.0, 1.0]))
    assert a.stats()["dgc_residual_delta"] == pytest.approx(0.1)
    assert a.stats()["dgc_residual_norm_ratio"] == pytest.approx(math.sqrt(0.14) / 1.5)


def test_residual_delta_measured_every_stride_steps(monkeypatch):
    """DIAG_ELEMENTS = 2 with N = 4 -> measured every 2nd step. m=0, lr=1, s=.75 (k=1):
    step 0: v = -[.1, .2, .4, 10] sends index 3 -> w = [1, 2, 4, -2], v = [-.1, -.2, -.4, 0]:
    delta (.1 + .1 + .1 + 0)/4 = .075, norm ratio sqrt(.21)/5. Step 1 (not measured) sends index 2,
    step 2 sends index 1 -> w = [1, 1.8, 3.6, -2], v = [-.1, 0, 0, 0]: delta .1/4 = .025,
    norm ratio .1/sqrt(1 + 3.24 + 12.96 + 4)."""
    monkeypatch.setattr(DGC, "DIAG_ELEMENTS", 2)
    (a,) = _make(1, 4, [1, 2, 4, 8], momentum=0.0, sparsity=0.75, e_warm=0)
    _step([a], 0, 1.0, [[0.1, 0.2, 0.4, 10]])
    _step([a], 1, 1.0, [[0, 0, 0, 0]])
    assert a.stats()["dgc_residual_delta"] == pytest.approx(0.075)
    _step([a], 2, 1.0, [[0, 0, 0, 0]])
    torch.testing.assert_close(a.flat.data, torch.tensor([1.0, 1.8, 3.6, -2.0]))
    st = a.stats()
    assert st["dgc_residual_delta"] == pytest.approx(0.05)
    assert st["dgc_residual_norm_ratio"] == pytest.approx((math.sqrt(0.21) / 5 + 0.1 / math.sqrt(21.2)) / 2)


def test_local_clipping_scales_threshold_by_sqrt_k():
    """K=4, --clip-norm 2 -> local threshold 2/sqrt(4) = 1; grad [3, 4] (norm 5) becomes [.6, .8]."""
    algos = _make(4, 2, [0, 0], momentum=0.9, sparsity=0.0, e_warm=0, clip_norm=2.0)
    _step(algos, 0, 0.5, [[3, 4], [0.3, 0.4], [0, 0], [0, 0]])  # rank 1's norm .5 < 1: untouched
    # w = 0 - .5 * ([.6, .8] + [.3, .4]) = [-.45, -.6]
    for a in algos:
        torch.testing.assert_close(a.flat.data, torch.tensor([-0.45, -0.6]))


# ---------------------------------------------------------------------------------------------
# s = 0: every entry sent every step, u always cleared -> plain SGD (no momentum) on the SUM


def _softmax_grads_reference(w, x, y, wd):
    """Gradient of mean softmax cross-entropy of a bias-free linear model, by hand (float64)."""
    logits = x @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y) + wd * w


def test_sparsity_zero_is_sgd_without_momentum_on_the_sum():
    k, d, c, steps, wd = 3, 6, 4, 12, 1e-3
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(steps, 5, d)) for _ in range(k)]
    ys = [rng.integers(0, c, size=(steps, 5)) for _ in range(k)]
    models = [nn.Linear(d, c, bias=False) for _ in range(k)]
    w0 = rng.normal(size=(c, d)) * 0.3
    group = InProcessGroup(k)
    algos = []
    for r, m in enumerate(models):
        flat = FlatParams(m)
        flat.data.copy_(torch.as_tensor(w0.reshape(-1), dtype=torch.float32))
        algos.append(DGC(flat=flat, comm=group.comm(r), momentum=0.9, ctx=_ctx(r, k), sparsity=0.0, e_warm=4))
    ref = w0.copy()
    for t in range(steps):
        lr = 0.1 if t < 6 else 0.01
        for r, (m, a) in enumerate(zip(models, algos)):
            a.flat.zero_grad()
            logits = m(torch.as_tensor(xs[r][t], dtype=torch.float32))
            loss = nn.functional.cross_entropy(logits, torch.as_tensor(ys[r][t]))
            loss.backward()
            a.flat.grad.add_(a.flat.data, alpha=wd)  # what the trainer does
        for a in algos:
            a.before_step(t, lr)
            assert a.u.abs().max() == 0 and a.v.abs().max() == 0 and a.last_sent == d * c
        for a in algos:
            a.local_update(t, lr)
        ref = ref - lr * sum(_softmax_grads_reference(ref, xs[r][t], ys[r][t], wd) for r in range(k))
    for a in algos:
        np.testing.assert_allclose(a.flat.data.numpy().reshape(c, d), ref, rtol=1e-5, atol=1e-6)
        assert torch.equal(a.flat.data, algos[0].flat.data)
        assert a.paths["dense"] == steps and a.stats()["dgc_dense_wire"] == 1.0
        # dense wire (more than half of the entries): 4 B per parameter + envelope, to each peer
        env = sum(envelope_nbytes("gradient", t, a.ctx.rank, [np.zeros(d * c, np.float32)]) for t in range(steps))
        assert a.comm.ledger.total_bytes == (k - 1) * (env + steps * 4 * d * c)
    assert np.abs(ref - w0).max() > 0.05  # the reference moved


# ---------------------------------------------------------------------------------------------
# sparsity s: per-partition counts within tolerance, exactly what the ledger says, identical weights


def _synthetic_grad(rank, step, numel):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(numel, generator=g) * torch.rand(numel, generator=g) ** 3 + 0.01 * (rank - 1)


def _simulate(k, numel, steps, spe, **kw):
    algos = _make(k, numel, np.linspace(-1, 1, numel), spe=spe, **kw)
    counts = []
    for t in range(steps):
        _step(algos, t, 0.05, [_synthetic_grad(r, t, numel) for r in range(k)])
        counts.append([a.last_sent for a in algos])
    return algos, counts


def _expected_bytes(k, rank, numel, sent):
    """Ledger bytes of one partition: per step, to each of the K-1 peers, one envelope plus
    8 B per sent entry (or 4 B per parameter when more than half of the entries are sent)."""
    total = 0
    for t, c in enumerate(sent):
        dense = 2 * c > numel
        arrays = [np.zeros(numel, np.float32)] if dense else [np.zeros(c, np.int32), np.zeros(c, np.float32)]
        total += (k - 1) * (envelope_nbytes("gradient", t, rank, arrays) + sum(a.nbytes for a in arrays))
    return total


def test_dense_wire_when_more_than_half_is_sent():
    """N=4, K=2, m=0, lr=1, --sparsity 0.25 (k=3 > N/2): dense wire, 16 B + envelope per step.
    Rank 0 v = -[4, 3, 2, 1] sends indices 0-2, rank 1 v = -[1, 1, 1, 5] sends 3 and two of the tied
    1s; both add [-4, -3, -2, 0] + rank 1's block."""
    a0, a1 = _make(2, 4, [0, 0, 0, 0], momentum=0.0, sparsity=0.25, e_warm=0)
    _step([a0, a1], 0, 1.0, [[4, 3, 2, 1], [1, 1, 1, 5]])
    assert a0.stats()["dgc_dense_wire"] == 1.0 and a0.last_sent == a1.last_sent == 3
    torch.testing.assert_close(a0.v, torch.tensor([0.0, 0.0, 0.0, -1.0]))
    assert torch.equal(a0.flat.data, a1.flat.data)
    assert float(a0.flat.data.sum()) == pytest.approx(-(4 + 3 + 2) - (5 + 1 + 1))
    assert a0.flat.data[3] == -5.0 and a0.flat.data[0] <= -4.0
    env = envelope_nbytes("gradient", 0, 0, [np.zeros(4, np.float32)])
    assert a0.comm.ledger.total_bytes == env + 16


def test_sent_counts_ledger_and_identical_weights():
    k, numel, steps, spe = 4, 60_000, 24, 4
    algos, counts = _simulate(k, numel, steps, spe, sparsity=0.99, e_warm=1)
    for t, row in enumerate(counts):
        s = warmup_sparsity(t, spe, 1, 0.99)
        kk = target_count(s, numel)
        for c in row:
            assert kk <= c <= TopSelector.UPPER * kk, (t, s, c, kk)
    for a in algos:
        r = a.ctx.rank
        assert a.comm.ledger.total_bytes == _expected_bytes(k, r, numel, [counts[t][r] for t in range(steps)])
        assert {row["kind"] for row in a.comm.ledger.rows()} == {"gradient"}
        assert torch.equal(a.flat.data, algos[0].flat.data)
    assert algos[0].stats()["dgc_sparsity"] == 0.99
    assert sum(algos[0].paths.values()) == steps


def test_numpy_and_torch_selection_backends_agree():
    """The torch path (used on accelerators) picks the same entries as the NumPy path: same
    seeded sample, same order statistic, same exact top-k -> bit-identical weights."""
    k, numel, steps, spe = 2, 30_000, 10, 2
    np_algos, np_counts = _simulate(k, numel, steps, spe, sparsity=0.99, e_warm=1, selection_backend="numpy")
    t_algos, t_counts = _simulate(k, numel, steps, spe, sparsity=0.99, e_warm=1, selection_backend="torch")
    assert np_counts == t_counts
    for a, b in zip(np_algos, t_algos):
        assert a.selector.backend == "numpy" and b.selector.backend == "torch"
        assert torch.equal(a.flat.data, b.flat.data) and torch.equal(a.v, b.v) and a.paths == b.paths


def test_theta_knob_is_e_warm():
    (a,) = _make(1, 10, np.ones(10), spe=10, sparsity=0.999, e_warm=4)
    assert DGC.KNOB.name == "e_warm" and DGC.KNOB.grid == (8.0, 4.0, 3.0, 2.0, 1.0)
    assert a.knob.name == "e_warm" and a.knob.grid == DGC.KNOB.grid
    assert a.knob.get() == 4.0 and a.sparsity_at(35) == 0.75
    a.knob.set(1)
    assert a.e_warm == 1.0  # epoch 2 -> third stage, epoch 3 -> fourth, epoch 4 -> final
    assert [a.sparsity_at(s) for s in (25, 35, 45)] == [0.984375, 0.99609375, 0.999]
    a.knob.set(np.int64(2))  # the controller may hand over NumPy numbers
    assert a.knob.get() == 2.0 and isinstance(a.knob.get(), float)
    with pytest.raises(ValueError, match="e-warm"):
        a.knob.set(-1)
    with pytest.raises(ValueError, match="e-warm"):
        a.knob.set(float("nan"))
    with pytest.raises(ValueError):
        a.knob.set(None)


def test_invalid_hyper_parameters():
    """Validated once, by the config (DGC's constructor no longer repeats these checks)."""
    bad = [({"sparsity": 1.0}, "sparsity"), ({"clip_norm": 0.0}, "clip-norm"), ({"dgc_sample_ratio": 0.0}, "sample-ratio")]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            DGCConfig(**kw)


def test_state_dict_round_trip_continues_identically():
    numel = 5000
    a, _ = _simulate(2, numel, 5, 2, sparsity=0.99, e_warm=1)
    b = _make(2, numel, np.zeros(numel), spe=2, sparsity=0.99, e_warm=1)
    for x, y in zip(a, b):
        y.flat.data.copy_(x.flat.data)
        y.load_state_dict(x.state_dict())
    for t in range(5, 8):
        grads = [_synthetic_grad(r, t, numel) for r in range(2)]
        _step(a, t, 0.05, grads)
        _step(b, t, 0.05, grads)
    for x, y in zip(a, b):
        assert torch.equal(x.flat.data, y.flat.data) and torch.equal(x.v, y.v)


# ---------------------------------------------------------------------------------------------
# Real processes: gloo process group + ZeroMQ transport through build_comm


def dgc_worker(rank, world, numel, steps, spe, sparsity, e_warm):
    from geodml.comm import build_comm
    from geodml.config import CommConfig

    comm = build_comm(CommConfig(wan="off", timeout_s=30), rank=rank, world_size=world)
    try:
        flat = FlatParams(nn.Linear(numel, 1, bias=False))
        flat.data.copy_(torch.as_tensor(np.linspace(-1, 1, numel), dtype=torch.float32))
        a = DGC(flat=flat, comm=comm, momentum=0.9, ctx=_ctx(rank, world, spe), sparsity=sparsity, e_warm=e_warm)
        counts = []
        for t in range(steps):
            flat.grad.copy_(_synthetic_grad(rank, t, numel))
            a.step(t, 0.05)
            counts.append(a.last_sent)
        return {"w": flat.data.clone(), "counts": counts, "bytes": comm.ledger.total_bytes, "rows": comm.ledger.rows()}
    finally:
        comm.close()


@pytest.mark.integration
def test_multiprocess_matches_in_process_simulation():
    """K=4 real processes (gloo + ZeroMQ) against the single-process simulation: bit for bit."""
    k, numel, steps, spe = 4, 40_000, 10, 2
    res = run_workers("tests.test_dgc:dgc_worker", k, timeout_s=90, numel=numel, steps=steps, spe=spe, sparsity=0.99,
                      e_warm=1)
    sim, counts = _simulate(k, numel, steps, spe, sparsity=0.99, e_warm=1)
    for r, out in enumerate(res):
        assert torch.equal(out["w"], res[0]["w"])  # one global model, bit for bit
        assert torch.equal(out["w"], sim[r].flat.data)  # same seeded selection, same arithmetic
        assert out["counts"] == [counts[t][r] for t in range(steps)]
        assert out["bytes"] == sim[r].comm.ledger.total_bytes == _expected_bytes(k, r, numel, out["counts"])
        assert {row["kind"] for row in out["rows"]} == {"gradient"}


# ---------------------------------------------------------------------------------------------
# End to end: torchrun -m geodml --algo dgc


@pytest.mark.integration
def test_torchrun_dgc_end_to_end(tmp_path):
    k, out = 3, tmp_path / "run"
    r = run_torchrun(k, ["--algo", "dgc", "--dataset", "digits", "--model", "cnn", "--no-progress", "--wan", "off",
                         "--epochs", "2", "--e-warm", "0.5", "--log-every", "5", "--eval-every", "1000",
                         "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    sds = [torch.load(out / f"rank{i}" / "model.pt", weights_only=True) for i in range(k)]
    for sd in sds[1:]:
        for name in sds[0]:
            assert torch.equal(sds[0][name], sd[name]), name
    s = json.loads((out / "summary.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    spe, n = cfg["steps_per_epoch"], cfg["parameters"]
    assert s["algo"] == "dgc" and s["theta_final"] == 0.5 and set(s["wan_bytes_by_kind"]) == {"gradient"}
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        # the logged sparsity is that of the last step taken (step - 1)
        assert rec["dgc_sparsity"] == warmup_sparsity(rec["step"] - 1, spe, 0.5, 0.999), rec
        assert rec["dgc_residual_delta"] > 0 and rec["dgc_residual_norm_ratio"] > 0
    # Every partition sends k..1.3k entries of 8 B plus an envelope (< 200 B) to each of its K-1
    # peers every step. 24 steps/epoch, 12-step
    # stages: 12 * (47,203 + 11,801 + 2,951 + 738) * 8 B * 3 * 2 = 36.1 MB at least, against
    # BSP's 48 * 2 * 2 * 188,810 * 4 B = 145 MB for the same 48 steps.
    assert spe == 24 and s["steps"] == 48 and n == 188_810
    min_bytes = sum(8 * target_count(warmup_sparsity(t, spe, 0.5, 0.999), n) for t in range(s["steps"])) * k * (k - 1)
    assert min_bytes == 12 * (47_203 + 11_801 + 2_951 + 738) * 8 * 3 * 2
    assert min_bytes <= s["wan_bytes_total"] <= 1.3 * min_bytes + 200 * s["steps"] * k * (k - 1)


# ---------------------------------------------------------------------------------------------
# Selection scope (--dgc-scope) and where clipping happens (--dgc-clip-at)

def _make_model(model_fn, k, **kw):
    group = InProcessGroup(k)
    algos = []
    for r in range(k):
        flat = FlatParams(model_fn())
        flat.data.zero_()
        algos.append(DGC(flat=flat, comm=group.comm(r), momentum=0.9, ctx=_ctx(r, k), **kw))
    return algos


def test_scopes_agree_on_a_one_layer_model():
    """A Linear layer's weight and bias are one layer: per-layer top-k is the global top-k."""
    runs = {}
    for scope in ("global", "layer"):
        algos = _make_model(lambda: nn.Linear(300, 4), 2, sparsity=0.99, e_warm=0.0, sample_ratio=0.05, scope=scope)
        assert algos[0].flat.layers == [(0, 1204)]
        g = torch.Generator().manual_seed(7)
        for step in range(6):
            _step(algos, step, 0.1, [torch.randn(1204, generator=g) for _ in algos])
        runs[scope] = [(a.flat.data.clone(), a.v.clone(), a.total_sent) for a in algos]
    for (wg, vg, ng), (wl, vl, nl) in zip(runs["global"], runs["layer"]):
        assert torch.equal(wg, wl) and torch.equal(vg, vl) and ng == nl > 0


def _two_layers() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False))  # 4 + 2 entries


def test_layer_scope_selects_per_layer_by_hand():
    """K=1, lr 1, momentum 0, s = 50%: v = -grad = [1, 5, 2, 0.5 | 4, 3].

    layer: ceil(0.5 * 4) = 2 of layer 1 (5 and 2, entries 1 and 2) and ceil(0.5 * 2) = 1 of layer 2
    (4, entry 4) -> w = [0, 5, 2, 0, 4, 0]. global: ceil(0.5 * 6) = 3 of all (5, 4, 3) -> w = [0, 5, 0, 0, 4, 3].
    """
    grad = torch.tensor([-1.0, -5.0, -2.0, -0.5, -4.0, -3.0])
    want = {"layer": [0.0, 5.0, 2.0, 0.0, 4.0, 0.0], "global": [0.0, 5.0, 0.0, 0.0, 4.0, 3.0]}
    for scope, w in want.items():
        group = InProcessGroup(1)
        flat = FlatParams(_two_layers())
        flat.data.zero_()
        assert flat.layers == [(0, 4), (4, 2)]
        a = DGC(flat=flat, comm=group.comm(0), momentum=0.0, ctx=_ctx(0, 1), sparsity=0.5, e_warm=0.0, scope=scope)
        _step([a], 0, 1.0, [grad])
        assert flat.data.tolist() == w, scope
        assert a.last_sent == 3
        torch.testing.assert_close(a.v, torch.tensor([1.0, 5.0, 2.0, 0.5, 4.0, 3.0]) - torch.tensor(w))


@pytest.mark.parametrize("clip_at, w1", [("gradient", 1.5), ("update", 1.26896)])
def test_clip_at_gradient_or_update_by_hand(clip_at, w1):
    """K=1, lr 1, momentum 0.5, clip_norm 1, s = 50% of 2 entries (one sent a step).

    step 0, grad [-3, -4] (norm 5): both ways u = [0.6, 0.8]; v = u; send entry 1 -> w = [0, 0.8];
      u = [0.6, 0] (momentum masking), v = [0.6, 0].
    step 1, grad [-1.5, -2] (norm 2.5):
      gradient: g clipped to [0.6, 0.8]; u = 0.5 [0.6, 0] + [0.6, 0.8] = [0.9, 0.8]; v = [1.5, 0.8] -> w0 = 1.5.
      update: u = [0.3, 0] + [1.5, 2] = [1.8, 2] (norm 2.69072) -> [0.66896, 0.74329];
        v = [1.26896, 0.74329] -> w0 = 1.26896.
    """
    group = InProcessGroup(1)
    flat = FlatParams(nn.Linear(2, 1, bias=False))
    flat.data.zero_()
    a = DGC(flat=flat, comm=group.comm(0), momentum=0.5, ctx=_ctx(0, 1), sparsity=0.5, e_warm=0.0, clip_norm=1.0,
            clip_at=clip_at)
    _step([a], 0, 1.0, [torch.tensor([-3.0, -4.0])])
    torch.testing.assert_close(flat.data, torch.tensor([0.0, 0.8]))
    _step([a], 1, 1.0, [torch.tensor([-1.5, -2.0])])
    torch.testing.assert_close(flat.data, torch.tensor([w1, 0.8]), atol=1e-5, rtol=0)
