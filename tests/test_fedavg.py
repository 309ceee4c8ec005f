"""FederatedAveraging (Quagmire Appendix A, Algorithm 2) and its variants (FedAvgM, FedProx,
FedIR, FedVC, IWDS): the math against numbers worked out by hand, equivalences that must hold
(Iter_Local = 1 is BSP; beta = 0 is FedAvg; mu = 0 is FedAvg), client sampling, and runs.

Most tests run K partitions as K threads of one process, each with its own model and an
InProcessComm (tests/harness.py): the real Comm contract and charges; every rank sums the same
contributions in rank order, so results are bit-identical across ranks, as with gloo's ring.
"""

from __future__ import annotations

import json
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from geodml.algorithms import algorithm_factory, build_algorithm
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.bsp import BSP
from geodml.algorithms.fedavg import FedAvg, num_participants
from geodml.algorithms.fedavgm import FedAvgM
from geodml.algorithms.federated import FedAvgFamily, variant_class
from geodml.algorithms.fedir import FedIR, importance_ratios
from geodml.algorithms.fedprox import FedProx
from geodml.algorithms.fedvc import FedVC, pps_inclusion_probabilities, systematic_pps_sample
from geodml.algorithms.iwds import IWDS, iwds_beta, iwds_class_weights
from geodml.comm.wire import envelope_nbytes
from geodml.config import AlgoConfig, FedAvgConfig, OptimConfig, RunConfig
from tests.support.inprocess import kind_bytes, record_calls, run_threads


def _ctx(rank, counts, *, seed=0, total_steps=10_000, batch=4):
    counts = np.asarray(counts, dtype=np.int64)
    return AlgoContext(rank=rank, world_size=len(counts), seed=seed, steps_per_epoch=10, total_steps=total_steps,
                       batch_size=batch, label_counts=counts)


def _flat(w, *, bn=False):
    layers = [nn.Linear(len(w), 1, bias=False)]
    if bn:
        layers = [nn.Linear(len(w), 2, bias=False), nn.BatchNorm1d(2)]
    model = nn.Sequential(*layers).double()
    flat = FlatParams(model)
    flat.data[:len(w)].copy_(torch.tensor(w, dtype=torch.float64))
    return flat


def _drive(algo, steps, grad, lr):
    """Trainer-like loop on synthetic gradients: grad(rank, w) when the partition computes."""
    for s in range(steps):
        if algo.computes(s):
            algo.flat.grad.copy_(grad(algo.ctx.rank, algo.flat.data))
        else:
            algo.flat.grad.zero_()
        algo.step(s, lr)
    algo.finish()


# ---- FedAvg: averaging by hand ------------------------------------------------------------------
def test_weighted_average_and_update_delta_by_hand():
    """K=3 with sizes 1, 2, 5 (p = 1/8, 2/8, 5/8); w0 = (1, 2); momentum 0, lr 1, Iter_Local 1;
    gradients g0 = (8, 0), g1 = (0, 8), g2 = (8, 8) so w^k = w0 - g_k and
    w1 = w0 - sum p_k g_k = (1, 2) - (1 + 0 + 5, 0 + 2 + 5) = (-5, -5).
    Appendix G: mean ||w^k - w0|| = (8 + 8 + 8*sqrt2)/3; ||w1|| = 5*sqrt2 -> ratio 1.287580.
    Bytes: 2 float64 = 16 B, ring over 3 ranks: 2(K-1) = 4 sends of each element -> 64 B total."""
    counts = [[1, 0], [0, 2], [3, 2]]
    grads = {0: [8.0, 0.0], 1: [0.0, 8.0], 2: [8.0, 8.0]}

    def fn(rank, comm):
        algo = FedAvg(flat=_flat([1.0, 2.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, counts, total_steps=1),
                      iter_local=1)
        assert algo.models_agree
        _drive(algo, 1, lambda r, w: torch.tensor(grads[r], dtype=torch.float64), lr=1.0)
        return algo.flat.data.tolist(), algo.last_delta, kind_bytes(comm, "model"), algo.models_agree

    out = run_threads(3, fn)
    for w, delta, _, agree in out:
        assert w == [-5.0, -5.0] and agree
        assert delta == pytest.approx((16 + 8 * math.sqrt(2)) / 3 / (5 * math.sqrt(2)), rel=1e-12)
        assert delta == pytest.approx(1.287580, abs=1e-6)
    assert sum(b for *_, b, _ in out) == 64


def test_batchnorm_buffers_averaged_with_the_same_weights():
    """Sizes 1 and 3 (p = 1/4, 3/4): running means (0, 4) and (4, 8) -> (3, 7)."""
    def fn(rank, comm):
        flat = _flat([0.0, 0.0], bn=True)
        flat.float_buffers[0].copy_(torch.tensor([[0.0, 4.0], [4.0, 8.0]][rank], dtype=torch.float64))
        algo = FedAvg(flat=flat, comm=comm, momentum=0.0, ctx=_ctx(rank, [[1], [3]], total_steps=1), iter_local=1)
        _drive(algo, 1, lambda r, w: torch.zeros_like(w), lr=0.1)
        return flat.float_buffers[0].tolist()

    assert run_threads(2, fn) == [[3.0, 7.0], [3.0, 7.0]]


def test_momentum_kept_across_rounds_unless_reset():
    """K=1, Iter_Local 2, m = 0.5, lr 1, gradient 1, w0 = 0: u = -1, -1.5 (w = -2.5); third step
    keeps u: u = -1.75, w = -4.25; with --reset-momentum u restarts: u = -1, w = -3.5."""
    def run(reset):
        def fn(rank, comm):
            algo = FedAvg(flat=_flat([0.0]), comm=comm, momentum=0.5, ctx=_ctx(0, [[1]], total_steps=3),
                          iter_local=2, reset_momentum=reset)
            _drive(algo, 3, lambda r, w: torch.ones_like(w), lr=1.0)
            return algo.flat.data.item()
        return run_threads(1, fn)[0]

    assert run(False) == -4.25
    assert run(True) == -3.5


def _quadratic_grad(k_seed=7):
    """g_k(w) = a_k * w + b_k: partition-specific, depends on w (so ordering mistakes show)."""
    g = torch.Generator().manual_seed(k_seed)
    a = torch.rand(5, 3, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(5, 3, generator=g, dtype=torch.float64)
    return lambda r, w: a[r] * w + b[r]


def _run_synthetic(k, cls, *, steps=13, iter_local=3, momentum=0.9, lr=0.05, counts=None, **kw):
    counts = counts if counts is not None else [[3, 1]] * k
    grad = _quadratic_grad()

    def fn(rank, comm):
        algo = cls(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=momentum,
                   ctx=_ctx(rank, counts, total_steps=steps), iter_local=iter_local, **kw)
        _drive(algo, steps, grad, lr)
        return algo.flat.data.clone()

    return run_threads(k, fn)


def _reference_fedavg(k, steps, iter_local, momentum, lr, sizes, *, beta=0.0, server_lr=1.0, nesterov=False, mu=0.0,
                      fraction=1.0, seed=0):
    """Independent single-process FedAvg(M)/FedProx with client sampling on the same quadratic."""
    grad = _quadratic_grad()
    w = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    u = [torch.zeros(3, dtype=torch.float64) for _ in range(k)]
    v = torch.zeros(3, dtype=torch.float64)
    m = max(1, math.floor(fraction * k + 1e-9))
    step, t = 0, 0
    while step < steps:
        if m == k:
            sel = list(range(k))
        else:
            sel = sorted(np.random.default_rng([seed, t, 0xFEDA]).choice(k, size=m, replace=False).tolist())
        n_steps = min(iter_local, steps - step)
        locals_ = {}
        for r in sel:
            wk = w.clone()
            for _ in range(n_steps):
                g = grad(r, wk) + mu * (wk - w)
                u[r] = momentum * u[r] - lr * g
                wk = wk + u[r]
            locals_[r] = wk
        p = np.array([sizes[r] for r in sel], dtype=np.float64)
        p /= p.sum()
        delta = sum(float(pk) * (w - locals_[r]) for pk, r in zip(p, sel))
        v = beta * v + delta
        w = w - server_lr * ((delta + beta * v) if nesterov else v)
        step += n_steps
        t += 1
    return w


def test_fedavg_matches_independent_reference_with_partial_last_round():
    """13 steps of Iter_Local 3: four full rounds and one partial round of 1 step averaged in finish()."""
    counts = [[3, 1], [1, 1], [5, 5]]
    got = _run_synthetic(3, FedAvg, counts=counts)
    ref = _reference_fedavg(3, 13, 3, 0.9, 0.05, [4, 2, 10])
    for w in got:
        assert torch.equal(w, got[0])
        torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)


def test_every_participant_identical_after_each_round_and_differ_within():
    counts = [[3, 1], [1, 1], [5, 5]]
    grad = _quadratic_grad()

    def fn(rank, comm):
        algo = FedAvg(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=0.9, ctx=_ctx(rank, counts, total_steps=12),
                      iter_local=4)
        after_round, mid_round, agree = [], [], []
        for s in range(12):
            algo.flat.grad.copy_(grad(rank, algo.flat.data))
            algo.step(s, 0.05)
            (after_round if (s + 1) % 4 == 0 else mid_round).append(algo.flat.data.clone())
            agree.append(algo.models_agree)
        return after_round, mid_round, agree

    out = run_threads(3, fn)
    for r in range(3):
        assert out[r][2] == [False, False, False, True] * 3
        for i in range(3):
            assert torch.equal(out[r][0][i], out[0][0][i])        # bit-identical after every round
    assert not torch.equal(out[1][1][0], out[0][1][0])            # and really different within a round


# ---- equivalences -----------------------------------------------------------------------------
def test_fedavgm_beta0_lr1_equals_fedavg_bit_for_bit_and_hand_numbers():
    plain = _run_synthetic(2, FedAvg)
    m0 = _run_synthetic(2, FedAvgM, server_momentum=0.0, server_lr=1.0)
    for a, b in zip(plain, m0):
        assert torch.equal(a, b)
    # with momentum it must differ and match the reference
    m9 = _run_synthetic(2, FedAvgM, server_momentum=0.9, server_lr=1.0)
    assert not torch.allclose(m9[0], plain[0])
    torch.testing.assert_close(m9[0], _reference_fedavg(2, 13, 3, 0.9, 0.05, [4, 4], beta=0.9), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nesterov,expected", [(False, [-5.0, -12.0]), (True, [-8.0, -15.5])])
def test_fedavgm_server_step_by_hand(nesterov, expected):
    """K=2, w0 = 1, local lr 1, no local momentum, Iter_Local 1; round gradients (2, 4) then (1, 3),
    so delta = 3 then 2; beta 0.5, server lr 2.
    plain:    v = 3,   w = 1 - 2*3 = -5;   v = 0.5*3 + 2 = 3.5, w = -5 - 2*3.5 = -12.
    Nesterov: w = 1 - 2*(3 + 0.5*3) = -8;  w = -8 - 2*(2 + 0.5*3.5) = -15.5."""
    g = {0: [2.0, 1.0], 1: [4.0, 3.0]}

    def fn(rank, comm):
        algo = FedAvgM(flat=_flat([1.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, [[1], [1]], total_steps=2),
                       iter_local=1, server_momentum=0.5, server_lr=2.0, nesterov=nesterov)
        seen = []
        for s in range(2):
            algo.flat.grad.fill_(g[rank][s])
            algo.step(s, 1.0)
            seen.append(algo.flat.data.item())
        return seen

    assert run_threads(2, fn) == [expected, expected]


def test_fedprox_mu0_equals_fedavg_and_hand_numbers():
    plain = _run_synthetic(2, FedAvg)
    p0 = _run_synthetic(2, FedProx, prox_mu=0.0)
    for a, b in zip(plain, p0):
        assert torch.equal(a, b)
    p1 = _run_synthetic(2, FedProx, prox_mu=0.5)
    assert not torch.allclose(p1[0], plain[0])
    torch.testing.assert_close(p1[0], _reference_fedavg(2, 13, 3, 0.9, 0.05, [4, 4], mu=0.5), rtol=1e-12, atol=1e-12)

    # By hand: K=2, w_t = 1, lr 0.5, mu 0.1, no momentum, Iter_Local 2, gradients 2 and 4.
    # rank 0: w = 1 - 1 = 0; grad 2 + 0.1*(0 - 1) = 1.9 -> w = 0 - 0.95 = -0.95
    # rank 1: w = 1 - 2 = -1; grad 4 + 0.1*(-1 - 1) = 3.8 -> w = -1 - 1.9 = -2.9;  average -1.925
    def fn(rank, comm):
        algo = FedProx(flat=_flat([1.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, [[1], [1]], total_steps=2),
                       iter_local=2, prox_mu=0.1)
        _drive(algo, 2, lambda r, w: torch.full_like(w, [2.0, 4.0][r]), lr=0.5)
        return algo.flat.data.item()

    assert run_threads(2, fn) == [pytest.approx(-1.925, abs=1e-15)] * 2


# ---- FedIR ------------------------------------------------------------------------------------
def test_fedir_importance_weights_by_hand():
    """Counts [[6,3,1],[2,2,6]]: N = 20, p = (8, 5, 7)/20 = (.4, .25, .35);
    q_0 = (.6, .3, .1) -> p/q_0 = (2/3, 5/6, 7/2); q_1 = (.2, .2, .6) -> p/q_1 = (2, 5/4, 7/12).
    Minibatch labels (0, 2, 2, 1) on rank 0: r = (2/3, 7/2, 7/2, 5/6), sum 8.5, w_i = 4 r_i / 8.5."""
    counts = [[6, 3, 1], [2, 2, 6]]
    np.testing.assert_allclose(importance_ratios(np.array(counts), 0), [2 / 3, 5 / 6, 7 / 2], rtol=1e-14)
    np.testing.assert_allclose(importance_ratios(np.array(counts), 1), [2, 5 / 4, 7 / 12], rtol=1e-14)
    np.testing.assert_array_equal(importance_ratios(np.array([[2, 0], [1, 1]]), 0), [0.75 / 1.0, 0.0])

    def fn(rank, comm):
        calls = record_calls(comm)
        algo = FedIR(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(rank, counts), iter_local=1)
        w = algo.sample_weights(torch.tensor([0, 2, 2, 1]), 0).clone()
        return algo.importance.tolist(), w, calls

    out = run_threads(2, fn)
    assert out[0][0] == pytest.approx([2 / 3, 5 / 6, 3.5], rel=1e-14)
    assert out[1][0] == pytest.approx([2.0, 1.25, 7 / 12], rel=1e-14)
    r = torch.tensor([2 / 3, 3.5, 3.5, 5 / 6], dtype=torch.float64)
    torch.testing.assert_close(out[0][1], 4 * r / 8.5)
    losses = torch.tensor([0.3, 1.2, 0.7, 2.0], dtype=torch.float64)
    assert float((out[0][1] * losses).mean()) == pytest.approx(float((r * losses).sum() / r.sum()), rel=1e-14)
    # p travels as K*C = 6 scalars (C per rank, all-gathered), charged as control, once
    assert [c for c in out[0][2] if c[0] == "all_gather"] == [("all_gather", "control", 3)]


# ---- IWDS -------------------------------------------------------------------------------------
def test_iwds_weights_and_schedule_by_hand():
    """beta_t = beta_m + (beta0 - beta_m) rho^t: (0.9, 0.1, 0.5) -> 0.9, 0.5, 0.3.
    Counts (100, 10, 1, 0), beta 0.9: raw (1-b)/(1-b^N) = 0.1/(1-0.9^100) = 0.1000026563,
    0.1/(1-0.3486784401) = 0.1535340, 0.1/0.1 = 1, and 0 for the absent class; scaled by
    n / sum N_c w_c = 111 / (10.00026563 + 1.53534 + 1) = 111 / 12.53560 = 8.854778."""
    assert [iwds_beta(t, 0.9, 0.1, 0.5) for t in range(3)] == pytest.approx([0.9, 0.5, 0.3])
    w = iwds_class_weights(np.array([100, 10, 1, 0]), 0.9)
    np.testing.assert_allclose(w, [0.1000026563 * 8.854778, 0.1535340 * 8.854778, 8.854778, 0.0], rtol=2e-6)
    assert float(np.dot(w, [100, 10, 1, 0])) == pytest.approx(111.0)        # mean weight 1 over the partition
    np.testing.assert_allclose(iwds_class_weights(np.array([5, 3]), 0.0), [1.0, 1.0])  # beta 0: uniform

    def fn(rank, comm):
        algo = IWDS(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [[3, 1]], total_steps=3), iter_local=1,
                    iwds=(0.9, 0.1, 0.5))
        seen = []
        for s in range(3):
            seen.append((algo.beta, algo.sample_weights(torch.tensor([0, 1, 1, 0]), s).tolist()))
            algo.flat.grad.zero_()
            algo.step(s, 0.1)
        return seen

    seen = run_threads(1, fn)[0]
    assert [b for b, _ in seen] == pytest.approx([0.9, 0.5, 0.3])
    # beta 0.5, counts (3, 1): raw (0.5/0.875, 1) = (4/7, 1); scale 4/(12/7 + 1) = 28/19 -> (16/19, 28/19)
    assert seen[1][1] == pytest.approx([16 / 19, 28 / 19, 28 / 19, 16 / 19])


# ---- FedVC ------------------------------------------------------------------------------------
def test_pps_inclusion_probabilities_by_hand():
    np.testing.assert_allclose(pps_inclusion_probabilities(np.array([100, 200, 300, 400, 1000]), 2),
                               [0.1, 0.2, 0.3, 0.4, 1.0])
    # 2*(1,1,1,10)/13 puts 1.54 on the big one: capped at 1, the other unit of m spread evenly
    np.testing.assert_allclose(pps_inclusion_probabilities(np.array([1, 1, 1, 10]), 2), [1 / 3, 1 / 3, 1 / 3, 1.0])


@pytest.mark.parametrize("sizes,m", [([1, 2, 3, 4], 1), ([100, 200, 300, 400, 1000], 2), ([50, 50, 100, 300, 500], 3)])
def test_fedvc_selection_frequencies_follow_sizes(sizes, m):
    """4000 seeded rounds: each partition's selection frequency within 4 standard errors of
    pi_k = m n_k / N (capped); uniform selection would miss by >= 0.1 here."""
    counts = [[s] for s in sizes]
    rounds = 4000
    hits = np.zeros(len(sizes))

    def fn(rank, comm):
        algo = FedVC(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, counts, batch=10),
                     client_fraction=m / len(sizes), virtual_client_size=10)
        return [algo.select_partitions(t) for t in range(rounds)]

    draws = run_threads(1, fn)[0]
    for d in draws:
        assert len(d) == m and len(set(d)) == m
        hits[list(d)] += 1
    pi = pps_inclusion_probabilities(np.array(sizes), m)
    freq = hits / rounds
    se = np.sqrt(np.maximum(pi * (1 - pi), 1e-12) / rounds)
    assert np.all(np.abs(freq - pi) <= 4 * se + 1e-12), (freq, pi)
    assert np.max(np.abs(pi - m / len(sizes))) >= 0.1


@pytest.mark.parametrize("n_k,replace", [(30, True), (100, False)])
def test_fedvc_trains_on_exactly_nvc_examples_per_round(n_k, replace):
    """N_VC = 50, B = 20: a round is ceil(50/20) = 3 steps; the last minibatch has 10 valid
    examples and 10 zero-weight fillers; 50 examples count, drawn with replacement iff n_k < 50."""
    indices = np.arange(1000, 1000 + n_k)
    sampler = SimpleNamespace(indices=indices)

    def fn(rank, comm):
        algo = FedVC(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [[n_k]], total_steps=6, batch=20),
                     virtual_client_size=50)
        rounds = []
        for t in range(2):
            used, weights = [], []
            for j in range(3):
                s = 3 * t + j
                idx = algo.batch_indices(s, sampler).copy()
                w = algo.sample_weights(torch.zeros(20, dtype=torch.int64), s)
                w = torch.ones(20, dtype=torch.float64) if w is None else w.clone()
                used.append(idx[w > 0])
                weights.append(w)
                algo.flat.grad.zero_()
                algo.step(s, 0.1)
            rounds.append((np.concatenate(used), weights))
        return algo.round_length(), rounds

    steps, rounds = run_threads(1, fn)[0]
    assert steps == 3
    for used, weights in rounds:
        assert len(used) == 50 and set(used) <= set(indices)
        assert (len(set(used)) < 50) == replace
        assert weights[0].tolist() == [1.0] * 20
        assert weights[2].tolist() == [2.0] * 10 + [0.0] * 10        # mean over the 10 valid examples
    assert not np.array_equal(rounds[0][0], rounds[1][0])              # a fresh draw every round


def test_client_sampling_identical_on_every_rank_and_nonparticipants_charged_nothing():
    """K=5, C=0.4 -> m = 2 per round, seeded; checked against an independent reference that
    keeps the global model in one process (stale participants must download it to match)."""
    k, steps, iter_local = 5, 60, 3
    counts = [[3, 1], [1, 1], [5, 5], [2, 2], [1, 3]]
    grad = _quadratic_grad()
    assert num_participants(0.4, 5) == 2 and num_participants(0.6, 5) == 3 and num_participants(0.01, 5) == 1

    def fn(rank, comm):
        algo = FedAvg(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=0.9,
                      ctx=_ctx(rank, counts, total_steps=steps), iter_local=iter_local, client_fraction=0.4)
        log = []
        for s in range(steps):
            if s % iter_local == 0:
                before_w, before_b = algo.flat.data.clone(), comm.ledger.wan_bytes
                sel = algo.selected
            algo.flat.grad.copy_(grad(rank, algo.flat.data)) if algo.computes(s) else algo.flat.grad.zero_()
            algo.step(s, 0.05)
            if (s + 1) % iter_local == 0:
                moved = not torch.equal(before_w, algo.flat.data)
                log.append((sel, moved, comm.ledger.wan_bytes - before_b, algo.flat.data.clone(),
                            algo.models_agree, algo.global_model_rank))
        return log, algo.download_count

    out = run_threads(k, fn)
    rounds = steps // iter_local
    sels = [[entry[0] for entry in out[r][0]] for r in range(k)]
    assert all(s == sels[0] for s in sels)                               # identical choice on every rank
    assert len(set(sels[0])) > 5                                         # and it varies by round
    freq = np.bincount(np.concatenate(sels[0]), minlength=k) / rounds
    assert np.all(np.abs(freq - 0.4) < 0.25)
    for t in range(rounds):
        sel = sels[0][t]
        for r in range(k):
            _, moved, spent, w, agree, holder = out[r][0][t]
            if r in sel:
                assert torch.equal(w, out[sel[0]][0][t][3])
            else:
                assert spent == 0                                        # waits, charged nothing
                # untouched -- unless it is chosen for the next round: then it downloads w_{t+1}
                # right after this round's average (the receiver is not charged; the sender is)
                nxt = sels[0][t + 1] if t + 1 < rounds else ()
                assert moved == (r in nxt)
                if moved:
                    assert torch.equal(w, out[sel[0]][0][t][3])
            assert not agree and torch.equal(out[holder][0][t][3], out[sel[0]][0][t][3])   # holds the global
    downloads = sum(d for _, d in out)
    assert downloads > 0                                                 # some stale participant downloaded
    # bytes by hand: the model is 3 float64 = 24 B, and every message carries its 27 B envelope (as
    # DistComm charges it: msgpack of kind "model", a step < 128, src and one float64[3] descriptor);
    # a round of m = 2 is one message to the leader and one back (2 x 51 B); a download is one
    # 51 B message (no server momentum, no buffers)
    assert envelope_nbytes("model", 59, 4, [np.zeros(3)]) == 27
    total = sum(sum(entry[2] for entry in out[r][0]) for r in range(k))
    assert total == 2 * (24 + 27) * rounds + (24 + 27) * downloads
    ref = _reference_fedavg(k, steps, iter_local, 0.9, 0.05, [4, 2, 10, 4, 4], fraction=0.4)
    last = sels[0][-1][0]
    torch.testing.assert_close(out[last][0][-1][3], ref, rtol=1e-12, atol=1e-12)


# ---- composition and configuration --------------------------------------------------------------
def _cfg(**algo):
    return RunConfig(algo=AlgoConfig(algo="fedavg"), fedavg=FedAvgConfig(**algo), optim=OptimConfig(batch_size=4))


def _build(cfg, counts=((3, 1),)):
    def fn(rank, comm):
        return build_algorithm(cfg, flat=_flat([0.0]), comm=comm, ctx=_ctx(0, [list(c) for c in counts]))
    return run_threads(1, fn)[0]


def test_from_config_composes_variants_and_rejects_conflicts():
    assert algorithm_factory("fedavg") is FedAvgFamily
    assert type(_build(_cfg())) is FedAvg
    assert type(_build(_cfg(server_momentum=0.9))) is FedAvgM
    algo = _build(_cfg(server_momentum=0.9, prox_mu=0.01, fedir=True, virtual_client_size=8))
    assert isinstance(algo, FedAvgM) and isinstance(algo, FedProx) and isinstance(algo, FedIR)
    assert isinstance(algo, FedVC) and algo.prox_mu == 0.01 and algo.server_momentum == 0.9
    assert algo.round_length() == 2 and algo.name == "fedvc+fedir+fedprox+fedavgm"
    assert isinstance(_build(_cfg(iwds=(0.9, 0.1, 0.9))), IWDS)
    with pytest.raises(ValueError, match="--fedir and --iwds"):
        _build(_cfg(fedir=True, iwds=(0.9, 0.1, 0.9)))
    with pytest.raises(ValueError):
        variant_class(fedir=True, iwds=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(_cfg(server_nesterov=True))
    assert any("--server-nesterov does nothing" in str(w.message) for w in caught)


def test_theta_is_iter_local_and_changes_at_the_next_round():
    def fn(rank, comm):
        algo = FedAvg(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [[1]], total_steps=100), iter_local=5)
        assert algo.knob.get() == 5 and algo.knob.name == "iter_local" and algo.knob.grid[0] == 5
        algo.knob.set(4)                    # between rounds: at once
        syncs = []
        for s in range(17):
            if s == 1:
                algo.knob.set(3)            # mid-round: from the next round on
                assert algo.knob.get() == 3 and algo.round_len == 4
            algo.flat.grad.zero_()
            algo.step(s, 0.1)
            syncs.append(algo.syncs)
        with pytest.raises(ValueError):
            algo.knob.set(0)
        with pytest.raises(ValueError):
            algo.knob.set(2.5)
        return syncs

    syncs = run_threads(1, fn)[0]
    assert [s + 1 for s in range(17) if syncs[s] != (syncs[s - 1] if s else 0)] == [4, 7, 10, 13, 16]


# ---- with the real trainer on digits (threads) -------------------------------------------------
_DIGITS: dict = {}


def _digits():
    if not _DIGITS:
        from geodml.data.datasets import load_dataset
        _DIGITS["ds"] = load_dataset("digits", None, seed=3)
    return _DIGITS["ds"]


def _train(k, make_algo, *, steps, partition="iid", seed=3, batch=8):
    from geodml.config import DataConfig
    from geodml.data.partition import make_partitioner, partition_report
    from geodml.metrics.sinks import Sink
    from geodml.models import build_model
    from geodml.trainer import Schedule, TrainData, Trainer, steps_per_epoch

    ds = _digits()
    labels = ds.train_y.numpy()
    parts = make_partitioner(DataConfig(partition=partition)).split(labels, k, np.random.default_rng([seed, 0xDA7A]))
    counts = np.asarray(partition_report(labels, parts, ds.num_classes)["label_counts"], dtype=np.int64)
    optim = OptimConfig(batch_size=batch, lr=0.05, lr_milestones=(0.2,), momentum=0.9, weight_decay=1e-3)
    spe = steps_per_epoch(len(labels), k, batch)

    # built here, not in the threads: build_model seeds the process-wide generator
    models = [build_model("cnn", "none", ds.input_shape, ds.num_classes, generator_seed=seed) for _ in range(k)]

    def fn(rank, comm):
        model = models[rank]
        flat = FlatParams(model)
        ctx = AlgoContext(rank=rank, world_size=k, seed=seed, steps_per_epoch=spe, total_steps=steps, batch_size=batch,
                          label_counts=counts)
        algo = make_algo(flat=flat, comm=comm, ctx=ctx)
        data = TrainData(train_x=ds.train_x, train_y=ds.train_y, test_x=ds.test_x, test_y=ds.test_y,
                         local_indices=parts[rank])
        schedule = Schedule(optim=optim, total_steps=steps, steps_per_epoch=spe, eval_every=10**9, log_every=10**9,
                            seed=seed)
        trainer = Trainer(model=model, flat=flat, algo=algo, comm=comm, data=data, schedule=schedule, sink=Sink())
        trainer.run()
        return flat.data.clone(), comm.ledger.rows(), algo

    return run_threads(k, fn)


def test_iter_local_1_with_momentum_equals_bsp_step_for_step():
    """Why: with Iter_Local = 1 every partition starts each step from the same w_t, so all compute
    their gradient at w_t; u^k = m u^k - lr g^k and w_{t+1} = mean_k (w_t + u^k) = w_t + ubar with
    ubar = m ubar - lr gbar (linearity; all u^k start at 0) -- exactly BSP's momentum step on the
    mean gradient. Needs equal partition sizes (digits iid, K=2: 719 + 719), since FedAvg weighs
    by size and BSP does not. Resetting the momentum every round breaks it (that is plain SGD)."""
    steps = 30   # lr drops by 10 at epoch 0.2 = step 18 (90 steps/epoch)
    bsp = _train(2, lambda **kw: BSP(momentum=0.9, **kw), steps=steps)
    fed = _train(2, lambda **kw: FedAvg(momentum=0.9, iter_local=1, **kw), steps=steps)
    reset = _train(2, lambda **kw: FedAvg(momentum=0.9, iter_local=1, reset_momentum=True, **kw), steps=steps)
    assert torch.equal(fed[0][0], fed[1][0]) and torch.equal(bsp[0][0], bsp[1][0])
    torch.testing.assert_close(fed[0][0], bsp[0][0], rtol=1e-5, atol=2e-6)
    assert float((reset[0][0] - bsp[0][0]).abs().max()) > 1e-3
    # bytes: one model all-reduce per step vs one gradient all-reduce per step -- the same size
    fed_bytes = sum(r["bytes"] for rows in (fed[0][1], fed[1][1]) for r in rows)
    bsp_bytes = sum(r["bytes"] for rows in (bsp[0][1], bsp[1][1]) for r in rows)
    assert fed_bytes == bsp_bytes == steps * 2 * 188_810 * 4


def test_fedvc_and_fedir_with_the_trainer_label_skew():
    """The trainer calls batch_indices / sample_weights / computes: a composed FedVC+FedIR+FedAvgM
    run on a label-skewed partition keeps the participants identical after the last round."""
    def make(**kw):
        klass = variant_class(fedavgm=True, fedir=True, fedvc=True)
        return klass(momentum=0.9, virtual_client_size=20, client_fraction=0.67, server_momentum=0.5, **kw)

    out = _train(3, make, steps=9, partition="label")
    algos = [o[2] for o in out]
    assert all(a.syncs == 3 and a.round_len == 3 for a in algos)        # 9 steps of ceil(20/8) = 3
    last = algos[0].selected
    assert len(last) == 2 and all(a.selected == last for a in algos)
    assert torch.equal(out[last[0]][0], out[last[1]][0])
    assert all(a.drawn_last_round == 20 for a in algos if a.drawn_last_round)
    kinds = {r["kind"] for rows in (o[1] for o in out) for r in rows}
    assert kinds == {"model", "control"}


# ---- end to end: torchrun, gloo, the real Comm ----------------------------------------------------
COMMON = ["--dataset", "digits", "--model", "cnn", "--norm", "none", "--no-progress", "--wan", "off"]
NUMEL = 188_810            # the CNN on 8x8 digits (tests/test_models.py)


def _sd(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.integration
def test_torchrun_fedavg_identical_models_ring_bytes_and_diagnostic(tmp_path):
    """K=3, 0.5 epoch of ceil(1438/(3*20)) = 24 steps = 12 steps, Iter_Local 5: averages after
    steps 5 and 10 and (partial round) in finish() -> 3 ring all-reduces of 188,810 float32:
    3 * 2(K-1) * 188,810 * 4 B = 9,062,880 B, all kind model."""
    from tests.support.procs import run_torchrun

    out = tmp_path / "run"
    r = run_torchrun(3, [*COMMON, "--algo", "fedavg", "--iter-local", "5", "--partition", "label", "--epochs", "0.5",
                         "--log-every", "5", "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 12 and s["final_model"] == "global" and (s["algo"], s["algo_variant"]) == ("fedavg", "fedavg")
    assert s["wan_bytes_by_kind"] == {"model": 3 * 2 * 2 * NUMEL * 4}
    # BSP would all-reduce the same 188,810 float32 at each of the 12 steps instead of 3 times: 4.0x
    assert s["bsp_equivalent_wan_bytes"] == 12 * 2 * 2 * NUMEL * 4 and s["wan_savings_vs_bsp"] == 4.0
    assert "-> 4.0x fewer WAN bytes than BSP" in r.stdout
    sds = [_sd(out / f"rank{i}" / "model.pt") for i in range(3)]
    for sd in [*sds[1:], _sd(out / "model.pt")]:
        assert all(torch.equal(sds[0][n], sd[n]) for n in sds[0])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    deltas = [x["fedavg_local_update_delta"] for x in lines if "fedavg_local_update_delta" in x]
    assert deltas and all(0 < d < 1 for d in deltas)
    assert lines[-1]["fedavg_round"] == 3


@pytest.mark.integration
def test_torchrun_composed_variants_with_client_sampling(tmp_path):
    """K=3, --client-fraction 0.67 (m = 2), FedVC N_VC = 50 with B = 20 (rounds of 3 steps),
    FedIR, FedProx, Nesterov FedAvgM: 12 steps = 4 rounds. Bytes: FedIR's label counts once,
    3 ranks x 2 pieces x 10 int64 = 480 B control; per round 2 point-to-point model messages
    (to the leader and back) of 188,810 float32, and per stale participant one download of
    w and v (2 x 188,810 float32); every message also carries a small envelope."""
    from tests.support.procs import run_torchrun

    out = tmp_path / "run"
    r = run_torchrun(3, [*COMMON, "--algo", "fedavg", "--partition", "label", "--epochs", "0.5", "--client-fraction",
                         "0.67", "--virtual-client-size", "50", "--fedir", "--prox-mu", "0.01", "--server-momentum",
                         "0.9", "--server-nesterov", "--log-every", "3", "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["wan_bytes_by_kind"]["control"] == 480
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["fedavg_round"] == 4 and lines[-1]["fedavg_participants"] == 2
    model_msgs = s["messages_total"] - 6                  # all-gather: 3 ranks x 2 messages
    downloads = model_msgs - 2 * 4
    assert 0 <= downloads <= 4
    payload = 2 * 4 * NUMEL * 4 + downloads * 2 * NUMEL * 4
    assert payload <= s["wan_bytes_by_kind"]["model"] <= payload + 200 * model_msgs
    # the last round (t = 3): FedVC's size-proportional draw, recomputed from the partition sizes
    sizes = np.array(json.loads((out / "partitions.json").read_text())["sizes"])
    sel = systematic_pps_sample(pps_inclusion_probabilities(sizes, 2), np.random.default_rng([0, 3, 0xFEDB]))
    (a, b), (c,) = sel, sorted(set(range(3)) - set(sel))
    sds = [_sd(out / f"rank{i}" / "model.pt") for i in range(3)]
    assert all(torch.equal(sds[a][n], sds[b][n]) for n in sds[a])           # participants agree
    assert not all(torch.equal(sds[a][n], sds[c][n]) for n in sds[a])       # the one that waited is stale
