"""IWDS as the paper states it (--iwds-mode resample): minibatch examples drawn i.i.d. with
p(k, i) = w_{k,i,t} / sum_j w_{k,j,t}. An exact draw on a tiny partition, determinism per
(partition, round, step), the empirical frequencies against w normalized, and a run with the trainer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from geodml.algorithms.iwds import IWDS, iwds_class_probabilities, iwds_raw_weights, iwds_resample
from geodml.config import FedAvgConfig
from tests.support.inprocess import run_threads
from tests.test_fedavg import _build, _cfg, _ctx, _flat, _train


class _FixedUniforms:
    """A stand-in generator whose random(n) returns given uniforms (the exact test controls u)."""

    def __init__(self, u):
        self.u = np.asarray(u, dtype=np.float64)

    def random(self, n):
        assert n == len(self.u)
        return self.u.copy()


def test_resample_exact_tiny_case():
    """Partition: examples 10, 11 of class 0 and 12 of class 1 (N = 2, 1), beta 0.5:
    w = (1 - b)/(1 - b^N) = 0.5/0.75 = 2/3 for class 0 and 0.5/0.5 = 1 for class 1, so
    p = (2/7, 2/7, 3/7) and the cumulative weights are (2/3, 4/3, 7/3). A uniform u maps to the
    example whose interval holds u * 7/3: u < 2/7 -> 10; 2/7 <= u < 4/7 -> 11; u >= 4/7 -> 12."""
    w = iwds_raw_weights(np.array([2, 1]), 0.5)
    np.testing.assert_allclose(w, [2 / 3, 1.0], rtol=1e-15)
    np.testing.assert_allclose(iwds_class_probabilities(np.array([2, 1]), 0.5), [4 / 7, 3 / 7], rtol=1e-15)
    cdf = np.cumsum(w[np.array([0, 0, 1])])
    u = [0.0, 0.2857, 0.2858, 0.5714, 0.5715, 0.999999]
    out = np.empty(6, dtype=np.int64)
    iwds_resample(np.array([10, 11, 12]), cdf, _FixedUniforms(u), out)
    assert out.tolist() == [10, 10, 11, 11, 12, 12]
    # beta 0: w = 1 for every example (uniform); absent classes have weight 0 and are never drawn
    np.testing.assert_array_equal(iwds_raw_weights(np.array([3, 0, 2]), 0.0), [1.0, 0.0, 1.0])


def _algo_draws(labels, counts, *, steps, batch, iwds=(0.9, 0.1, 0.5), seed=0, rank=0, iter_local=1000):
    indices = np.arange(100, 100 + len(labels))
    sampler = SimpleNamespace(indices=indices, labels=np.asarray(labels))

    def fn(r, comm):
        algo = IWDS(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [counts], seed=seed, batch=batch,
                                                                        total_steps=steps),
                    iter_local=iter_local, iwds=iwds, iwds_mode="resample")
        draws = []
        for s in range(steps):
            draws.append(algo.batch_indices(s, sampler).copy())
            assert algo.sample_weights(torch.zeros(batch, dtype=torch.int64), s) is None   # plain mean loss
            algo.flat.grad.zero_()
            algo.step(s, 0.1)
        return np.stack(draws) - 100, algo

    return run_threads(1, fn)[0]


def test_resample_is_deterministic_per_partition_round_and_step():
    labels = [0] * 6 + [1] * 3 + [2]
    a, _ = _algo_draws(labels, [6, 3, 1], steps=6, batch=8, iter_local=3)
    b, _ = _algo_draws(labels, [6, 3, 1], steps=6, batch=8, iter_local=3)
    c, _ = _algo_draws(labels, [6, 3, 1], steps=6, batch=8, iter_local=3, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len({row.tobytes() for row in a}) == 6                 # a fresh draw at every step and round


def test_resample_frequencies_follow_w_normalized():
    """10 examples, classes of 6, 3 and 1, beta_0 = 0.9 held for 2,000 steps of 50 draws
    (n = 100,000, one round, seed 0). Per example p_i = w_i / sum w: classes 0, 1, 2 get
    w = (1-b)/(1-b^N) = 0.1/0.468559 = 0.213420, 0.1/0.271 = 0.369004, 1; sum w = 3.387530 ->
    p = 0.063002, 0.108930, 0.295200 per example (class shares 0.378, 0.327, 0.295 against the
    uniform sampler's 0.6, 0.3, 0.1).
    Bound: every example's and every class's frequency within 4.5 standard errors sqrt(p(1-p)/n) of
    p; for a correct sampler the chance of any of the 13 falling outside is below 13 * 6.8e-6 < 1e-4,
    and the seed is fixed, so the test is deterministic. Uniform sampling misses class 2 by 135 SE."""
    labels = np.array([0] * 6 + [1] * 3 + [2])
    counts = np.array([6, 3, 1])
    draws, algo = _algo_draws(labels, counts, steps=2000, batch=50, iwds=(0.9, 0.9, 1.0), iter_local=2000)
    assert algo.beta == 0.9 and algo.syncs == 1
    n = draws.size
    w = iwds_raw_weights(counts, 0.9)[labels]
    p_example = w / w.sum()
    np.testing.assert_allclose(p_example[[0, 6, 9]], [0.063002, 0.108930, 0.295200], atol=1e-6)
    freq = np.bincount(draws.ravel(), minlength=10) / n
    se = np.sqrt(p_example * (1 - p_example) / n)
    assert np.all(np.abs(freq - p_example) <= 4.5 * se), (freq, p_example)
    q = iwds_class_probabilities(counts, 0.9)
    np.testing.assert_allclose(q, [p_example[:6].sum(), p_example[6:9].sum(), p_example[9]], rtol=1e-12)
    class_freq = np.bincount(labels[draws.ravel()], minlength=3) / n
    assert np.all(np.abs(class_freq - q) <= 4.5 * np.sqrt(q * (1 - q) / n)), (class_freq, q)
    uniform = counts / counts.sum()
    assert abs(uniform[2] - q[2]) > 100 * np.sqrt(q[2] * (1 - q[2]) / n)


def test_resample_follows_the_decaying_beta_each_round():
    """beta_t = 0.1 + 0.8 * 0.5^t: 0.9, 0.5, 0.3, ...; the draw's weights are rebuilt every round."""
    labels = [0] * 6 + [1] * 3 + [2]
    _, algo = _algo_draws(labels, [6, 3, 1], steps=4, batch=4, iter_local=2)
    # two rounds of 2 steps ran (no third round is set up after the run's last step): round 1 drew with beta 0.5
    assert algo.round == 2 and algo.beta == pytest.approx(0.5) and algo._cdf_round == 1
    np.testing.assert_allclose(algo._cdf, np.cumsum(iwds_raw_weights(np.array([6, 3, 1]), 0.5)[labels]), rtol=1e-15)


def test_resample_needs_labels_and_is_rejected_with_fedvc():
    def fn(rank, comm):
        algo = IWDS(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [[3, 1]]), iter_local=2,
                    iwds=(0.9, 0.1, 0.5), iwds_mode="resample")
        with pytest.raises(ValueError, match="needs the labels"):
            algo.batch_indices(0, SimpleNamespace(indices=np.arange(4), labels=None))
        with pytest.raises(ValueError, match="reweight or resample"):
            IWDS(flat=_flat([0.0]), comm=comm, momentum=0.0, ctx=_ctx(0, [[3, 1]]), iwds=(0.9, 0.1, 0.5),
                 iwds_mode="both")
    run_threads(1, fn)
    with pytest.raises(ValueError, match="--iwds-mode resample draws each minibatch itself"):
        FedAvgConfig(iwds=(0.9, 0.1, 0.5), iwds_mode="resample", virtual_client_size=8)
    with pytest.raises(ValueError, match="--iwds-mode: choose one of reweight, resample"):
        FedAvgConfig(iwds_mode="sample")


def test_default_mode_is_reweight_and_builder_passes_the_mode():
    assert FedAvgConfig().iwds_mode == "reweight"
    assert not _build(_cfg(iwds=(0.9, 0.1, 0.9))).resample
    algo = _build(_cfg(iwds=(0.9, 0.1, 0.9), iwds_mode="resample"))
    assert algo.resample and algo.label_weights() is None


def test_resample_with_the_trainer_on_label_skew():
    """The trainer's minibatch source carries the partition's labels; every drawn example belongs to
    the partition and the rarer classes are drawn more often than their share."""
    out = _train(2, lambda **kw: IWDS(momentum=0.9, iter_local=5, iwds=(0.99, 0.5, 0.9), iwds_mode="resample", **kw),
                 steps=10, partition="dirichlet")
    assert torch.equal(out[0][0], out[1][0]) and torch.isfinite(out[0][0]).all()
