"""FedNova (Wang et al. 2020, normalized averaging with momentum) and --local-epochs: the normalizer
a_i and tau_eff by hand for unequal local steps, the reduction to FedAvg at equal steps, the bytes,
and the configuration. Same in-process harness as tests/test_fedavg.py (K threads, InProcessComm)."""

from __future__ import annotations

import warnings

import pytest
import torch

from geodml.algorithms.fedavg import FedAvg
from geodml.algorithms.federated import variant_class
from geodml.algorithms.fednova import FedNova
from geodml.algorithms.fedprox import FedProx
from geodml.config import AlgoConfig, FedAvgConfig, RunConfig, SkewScoutConfig
from tests.support.inprocess import kind_bytes, run_threads
from tests.test_fedavg import _build, _cfg, _ctx, _drive, _flat, _quadratic_grad, _run_synthetic, _train


# ---- by hand -----------------------------------------------------------------------------------
def test_unequal_local_steps_a_i_and_tau_eff_by_hand():
    """K=2, --local-epochs 1, B = 2, sizes 2 and 6 -> tau = (1, 3) local steps, p = (1/4, 3/4);
    momentum m = 0.5, lr 1, w_t = 0, constant gradients 1 (rank 0) and 2 (rank 1).
    ||a_i||_1 = sum_{k=1..tau} (1 - m^k)/(1 - m): rank 0: 0.5/0.5 = 1; rank 1: (0.5 + 0.75 + 0.875)/0.5
    = 4.25 (a_1 = (1.75, 1.5, 1): the first gradient also moves the two later steps through momentum).
    Local runs: rank 0: u = -1, w = -1 (then waits two steps, not moving); rank 1: u = -2, -3, -3.5,
    w = -2, -5, -8.5 = -2 * 4.25. d = (1/1, 8.5/4.25) = (1, 2); tau_eff = 1/4 * 1 + 3/4 * 4.25 = 3.4375;
    w_1 = -3.4375 * (1/4 * 1 + 3/4 * 2) = -6.015625. FedAvg on the same steps: -(1/4 * 1 + 3/4 * 8.5)
    = -6.625. All dyadic: exact in float64. Bytes: FedNova's message is the model (1 float64) plus
    p_i A_i (1 float64): a ring over 2 ranks sends 2(K-1) = 2 copies of 16 B; FedAvg 2 of 8 B."""
    counts = [[2], [6]]

    def run(cls):
        def fn(rank, comm):
            algo = cls(flat=_flat([0.0]), comm=comm, momentum=0.5, ctx=_ctx(rank, counts, total_steps=3, batch=2),
                       iter_local=7, local_epochs=1.0)
            assert algo.round_len == 3 and algo.my_local_steps == (1, 3)[rank]
            computed = []
            for s in range(3):
                computed.append(algo.computes(s))
                algo.flat.grad.fill_((1.0, 2.0)[rank] if computed[-1] else 0.0)
                algo.step(s, 1.0)
            algo.finish()
            return algo.flat.data.item(), computed, algo.stats(), kind_bytes(comm, "model")
        return run_threads(2, fn)

    nova, avg = run(FedNova), run(FedAvg)
    assert [c for _, c, _, _ in nova] == [[True, False, False], [True, True, True]]
    for w, _, stats, _ in nova:
        assert w == -6.015625
        assert stats["fednova_tau_eff"] == 3.4375 and stats["fedavg_round_steps"] == 3
    assert [(s["fednova_norm_a"], s["fednova_local_steps"]) for _, _, s, _ in nova] == [(1.0, 1.0), (4.25, 3.0)]
    assert [w for w, *_ in avg] == [-6.625, -6.625]
    assert sum(b for *_, b in nova) == 2 * 16 and sum(b for *_, b in avg) == 2 * 8


def test_norm_a_with_the_proximal_term_by_hand():
    """FedNova + FedProx, momentum 0, lr 0.5, mu 0.5 (lr mu = 1/4), 3 steps: the paper's FedProx vector
    a = ((1 - lr mu)^2, 1 - lr mu, 1) = (0.5625, 0.75, 1), ||a||_1 = 2.3125. With momentum 0.5 as well
    the linear response of u <- m u - lr (g + mu s'), w <- w + u to unit gradients (s: displacement):
    v = 0.5, s = 0.5; v = 0.25 + 0.5 (1 - 0.25) = 0.625, s = 1.125; v = 0.3125 + 0.5 (1 - 0.5625)
    = 0.53125, s = 1.65625 -> ||a||_1 = s / lr = 3.3125."""
    klass = variant_class(fedprox=True, fednova=True)

    def norm_a(momentum):
        def fn(rank, comm):
            algo = klass(flat=_flat([0.0]), comm=comm, momentum=momentum, ctx=_ctx(0, [[1]], total_steps=3),
                         iter_local=3, prox_mu=0.5)
            _drive(algo, 3, lambda r, w: torch.ones_like(w), lr=0.5)
            return algo.stats()
        return run_threads(1, fn)[0]

    assert norm_a(0.0)["fednova_norm_a"] == 2.3125
    assert norm_a(0.5)["fednova_norm_a"] == 3.3125
    assert norm_a(0.5)["fednova_tau_eff"] == 3.3125        # one participant: tau_eff = ||a||_1


# ---- equivalence with FedAvg at equal local steps -------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("fraction", [1.0, 0.67])
def test_equal_local_steps_reduce_fednova_to_fedavg(momentum, fraction):
    """Every participant takes Iter_Local = 3 steps (and 1 in the partial last round of 13): all
    ||a_i||_1 = A, tau_eff = A sum p_i = A, and FedNova's A * sum p_i (w_t - w_i) / A is FedAvg's
    sum p_i (w_t - w_i) -- with a reset momentum buffer, which FedNova always has. Not bit for bit:
    dividing by A, multiplying by tau_eff and sum_i p_i = 1 round (a few ulp per element), so
    float64 agrees to rtol 1e-12 after 5 rounds; sizes 4, 2, 10 weigh the partitions unequally."""
    counts = [[3, 1], [1, 1], [5, 5]]
    kw = dict(counts=counts, momentum=momentum, client_fraction=fraction)
    nova = _run_synthetic(3, FedNova, **kw)
    avg = _run_synthetic(3, FedAvg, reset_momentum=True, **kw)
    kept = _run_synthetic(3, FedAvg, **kw)
    for a, b in zip(nova, avg):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    if momentum:   # Algorithm 2 keeps the momentum across rounds; FedNova's a_i needs it reset
        assert not torch.allclose(nova[0], kept[0])
    else:
        torch.testing.assert_close(nova[0], kept[0], rtol=1e-12, atol=1e-14)


def test_fednova_equals_fedavg_with_the_trainer():
    """The CNN on digits, K=2 of unequal label-skewed sizes, float32, Iter_Local 4 for both, 12 steps:
    FedNova and FedAvg with --reset-momentum agree to float32 rounding (tau_eff travels as a float32)."""
    nova = _train(2, lambda **kw: FedNova(momentum=0.9, iter_local=4, **kw), steps=12, partition="label")
    avg = _train(2, lambda **kw: FedAvg(momentum=0.9, iter_local=4, reset_momentum=True, **kw), steps=12,
                 partition="label")
    assert torch.equal(nova[0][0], nova[1][0])
    torch.testing.assert_close(nova[0][0], avg[0][0], rtol=1e-4, atol=1e-6)


def test_fednova_with_fedprox_at_equal_steps_is_fedprox_with_reset_momentum():
    nova = _run_synthetic(2, variant_class(fedprox=True, fednova=True), prox_mu=0.5)
    prox = _run_synthetic(2, FedProx, prox_mu=0.5, reset_momentum=True)
    torch.testing.assert_close(nova[0], prox[0], rtol=1e-12, atol=1e-14)


def test_local_epochs_fedavg_matches_independent_reference():
    """--local-epochs 1, B = 4, sizes 4, 8, 10 -> 1, 2, 3 local steps a round (round of 3 trainer
    steps), momentum kept across rounds, the idle steps moving nothing: an independent loop."""
    counts = [[3, 1], [4, 4], [5, 5]]
    taus = [1, 2, 3]
    grad = _quadratic_grad()
    steps, lr, m = 9, 0.05, 0.9

    def fn(rank, comm):
        algo = FedAvg(flat=_flat([0.3, -0.2, 0.1]), comm=comm, momentum=m, ctx=_ctx(rank, counts, total_steps=steps),
                      local_epochs=1.0)
        _drive(algo, steps, grad, lr)
        return algo.flat.data.clone(), algo.syncs

    out = run_threads(3, fn)
    w = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    u = [torch.zeros(3, dtype=torch.float64) for _ in range(3)]
    p = [4 / 22, 8 / 22, 10 / 22]
    for _ in range(3):
        new = []
        for r in range(3):
            wk = w.clone()
            for _ in range(taus[r]):
                u[r] = m * u[r] - lr * grad(r, wk)
                wk = wk + u[r]
            new.append(wk)
        w = w - sum(p[r] * (w - new[r]) for r in range(3))
    for got, syncs in out:
        assert syncs == 3
        torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-14)


# ---- configuration ----------------------------------------------------------------------------
def test_from_config_builds_fednova_and_warns_about_reset_momentum():
    algo = _build(_cfg(fednova=True))
    assert type(algo) is FedNova and algo.reset_momentum and algo.wire.numel() == algo.flat.numel + 1
    both = _build(_cfg(fednova=True, server_momentum=0.9, prox_mu=0.1, local_epochs=2.0))
    assert both.name == "fedprox+fednova+fedavgm" and both.local_epochs == 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(_cfg(fednova=True, reset_momentum=True))
        _build(_cfg(local_epochs=1.0, iter_local=5))
    text = " ".join(str(w.message) for w in caught)
    assert "--reset-momentum does nothing with --fednova" in text and "--iter-local 5 is ignored" in text


@pytest.mark.parametrize("kw,match", [
    (dict(local_epochs=-1.0), "--local-epochs must be >= 0"),
    (dict(local_epochs=float("nan")), "--local-epochs must be >= 0"),
    (dict(local_epochs=1.0, virtual_client_size=8), "--local-epochs and --virtual-client-size"),
])
def test_bad_settings_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        FedAvgConfig(**kw)


def test_skewscout_rejects_local_epochs():
    with pytest.raises(ValueError, match="--local-epochs"):
        RunConfig(algo=AlgoConfig(algo="fedavg"), fedavg=FedAvgConfig(local_epochs=1.0), skewscout=SkewScoutConfig(enabled=True))
