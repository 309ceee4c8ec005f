"""SkewScout controller (Quagmire §7.2, Eq. 1) on scripted (theta, AL, SE, C) sequences whose
moves are worked out by hand. Grid = Gaia's T0 grid; CM = 1000 B; lambda_AL=50, lambda_C=1,
sigma_AL=0.05.

Two parts: the paper's point-estimate rule (``confidence=0.5`` -> z = 0, ``window=1`` -> the most
recent value), which the bounded rule must reduce to; and the bounded rule on noisy sequences
(z = 2 exactly, so the bounds are mean -/+ 2 SE by hand)."""

import math
from statistics import NormalDist

import pytest

from geodml.config import SkewScoutConfig
from geodml.skewscout.controller import Controller, Pool, comm_ratio_for
from geodml.skewscout.traveling import accuracy_variance

GRID = (0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50)
Z2 = NormalDist().cdf(2.0)  # the confidence whose one-sided z is 2


def ctl(start=0.10, **kw):
    """The paper's rule: point estimates, most recent value."""
    return Controller(GRID, start, model_exchange_bytes=1000, **{"confidence": 0.5, "window": 1, **kw})


def bounded(start=0.10, **kw):
    """The noise-aware rule with z = 2 and a pool of 4 trips."""
    return Controller(GRID, start, model_exchange_bytes=1000, **{"confidence": Z2, "window": 4, **kw})


# ---- the paper's rule (confidence 0.5, window 1): the old controller's hand-worked sequences ---------

def test_high_accuracy_loss_tightens_then_memo_holds():
    c = ctl()
    # at 0.10: f = 50*(0.30-0.05) + 500/1000 = 13.0
    # 0.05 (unexplored, more comm): AL_est = min(0.30, 0.05) -> no penalty; C_est = 500*0.10/0.05 = 1000 -> f = 1.0
    # 0.20 (unexplored, less comm): AL_est = 0.30 -> 12.5; C_est = 250 -> f = 12.75      => 0.05
    d = c.decide(0.30, 500)
    assert d.objective == pytest.approx({0.05: 1.0, 0.10: 13.0, 0.20: 12.75})
    assert (d.theta_before, d.theta_after) == (0.10, 0.05) and set(d.estimated) == {0.05, 0.20}
    # at 0.05: AL=0.07, C=1000: f = 50*0.02 + 1 = 2.0; 0.02 est: AL 0.05 -> 0, C = 2500 -> 2.5;
    # 0.10 from the memo: 13.0                                                            => stay
    d = c.decide(0.07, 1000)
    assert d.objective == pytest.approx({0.02: 2.5, 0.05: 2.0, 0.10: 13.0}) and d.theta_after == 0.05
    # at 0.05: AL=0.04, C=1000: f = 1.0. Without the memo 0.10 would be estimated at
    # AL 0.04, C 500 -> f = 0.5 and win; the memo (AL 0.30) keeps it at 13.0             => stay
    d = c.decide(0.04, 1000)
    assert d.objective[0.10] == pytest.approx(13.0) and d.theta_after == 0.05
    assert 0.10 not in d.estimated


def test_low_accuracy_loss_loosens_step_by_step():
    c = ctl()
    # 0.10: AL 0.01 -> f = 0.5; 0.05 est: f = 1000/1000 = 1.0; 0.20 est: AL 0.01, C 250 -> 0.25 => 0.20
    assert c.decide(0.01, 500).theta_after == 0.20
    # 0.20: f = 0.25; 0.10 memo: 0.5; 0.30 est: C = 250*0.2/0.3 = 166.67 -> 0.1667        => 0.30
    d = c.decide(0.02, 250)
    assert d.objective[0.30] == pytest.approx(250 * 0.2 / 0.3 / 1000) and d.theta_after == 0.30
    assert c.theta == 0.30


def test_sigma_boundary():
    # AL exactly sigma: no penalty -> f(0.10) = 0.5, the looser 0.20 (est. 0.25) wins
    d = ctl().decide(0.05, 500)
    assert d.objective[0.10] == pytest.approx(0.5) and d.theta_after == 0.20
    # AL = sigma + 0.03: penalty 50*0.03 = 1.5 -> f(0.10) = 2.0; 0.20 est. AL 0.08 -> 1.5 + 0.25 = 1.75;
    # 0.05 est. AL <= sigma -> 1.0                                                        => 0.05
    d = ctl().decide(0.08, 500)
    assert d.objective == pytest.approx({0.05: 1.0, 0.10: 2.0, 0.20: 1.75}) and d.theta_after == 0.05


def test_grid_edges_and_start_snaps_to_grid():
    c = ctl(start=0.5)
    assert c.theta == 0.50
    assert c.decide(0.0, 100).theta_after == 0.50  # already the loosest; 0.40 costs more bytes
    c = ctl(start=0.011)
    assert c.theta == 0.02
    # tightest: f(0.02) = 50*0.45 + 0.1 = 22.6; 0.05 est. (AL assumed unchanged) = 22.5 + 0.04 = 22.54:
    # the optimistic estimate tries the looser neighbour once ...
    d = c.decide(0.5, 100)
    assert d.objective == pytest.approx({0.02: 22.6, 0.05: 22.54}) and d.theta_after == 0.05
    # ... and the memo brings it back when it measures worse (0.05: AL 0.6, C 40 -> 27.54 > 22.6)
    assert c.decide(0.6, 40).theta_after == 0.02


def test_stochastic_only_takes_improving_moves_and_annealing_cold_is_greedy():
    for seed in range(20):
        # improving neighbours of 0.10 (f 13.0): 0.05 (1.0) and 0.20 (12.75)
        assert ctl(search="stochastic", seed=seed).decide(0.30, 500).theta_after in (0.05, 0.20)
        # 0.10 with AL 0 and C 500: f 0.5; 0.05 est. 1.0 is worse, 0.20 est. 0.25 is the only improvement
        assert ctl(search="stochastic", seed=seed).decide(0.0, 500).theta_after == 0.20
        # temperature 0: a worse proposal (0.05) is never accepted, the better one (0.20) always
        assert ctl(search="annealing", temperature=0.0, seed=seed).decide(0.0, 500).theta_after in (0.10, 0.20)


def test_stochastic_picks_proportionally_to_improvement():
    # gains: 0.05 -> 13.0 - 1.0 = 12.0; 0.20 -> 13.0 - 12.75 = 0.25; P(0.05) = 12/12.25 = 0.98
    picks = [ctl(search="stochastic", seed=s).decide(0.30, 500).theta_after for s in range(400)]
    frac = picks.count(0.05) / len(picks)
    assert 0.95 <= frac <= 1.0


def test_bad_settings():
    with pytest.raises(ValueError, match="communication knob"):
        Controller((), 0.1, model_exchange_bytes=10)
    with pytest.raises(ValueError, match="search"):
        ctl(search="tabu")
    with pytest.raises(ValueError, match="al-confidence"):
        ctl(confidence=0.4)
    with pytest.raises(ValueError, match="accuracy_loss_se"):
        ctl().decide(0.1, 10, -0.01)


# ---- the pool ---------------------------------------------------------------------------------

def test_pool_standard_error_by_hand():
    p = Pool(window=3)
    p.add(0.09, 0.02, 1000)
    # one trip: its own SE
    assert (p.n, p.mean, p.se) == (1, pytest.approx(0.09), pytest.approx(0.02))
    p.add(0.03, 0.02, 3000)
    # mean 0.06; reported sqrt(0.02^2 + 0.02^2) / 2 = 0.014142; between trips sd = 0.042426, / sqrt 2 = 0.03
    assert p.mean == pytest.approx(0.06) and p.se == pytest.approx(0.03) and p.c == 2000
    p.add(0.045, 0.05, 2000)
    # mean 0.055; reported sqrt(0.0004 + 0.0004 + 0.0025) / 3 = 0.057446 / 3 = 0.019149;
    # between: squares of (0.035, -0.025, -0.01) sum 0.00195, /2 -> sd 0.031225, / sqrt 3 = 0.018028 -> 0.019149
    assert p.mean == pytest.approx(0.055) and p.se == pytest.approx(math.sqrt(0.0033) / 3)
    p.add(0.075, 0.0, 0)  # the window keeps the last 3: (0.03, 0.045, 0.075)
    assert p.als == [0.03, 0.045, 0.075] and p.mean == pytest.approx(0.05) and p.c == pytest.approx(5000 / 3)


# ---- the bounded rule on noisy sequences (z = 2) ------------------------------------------------

def test_noisy_trip_does_not_overshoot_where_the_point_rule_does():
    """True AL: about 0.12 at T0=10%, about 0.045 at 5% (enough). One noisy trip at 5% reads 0.09."""
    c = bounded()
    # d1 at 0.10: lo = 0.12 - 2*0.01 = 0.10 -> f = 50*0.05 + 0.5 = 3.0; 0.05 unexplored: hi = min(0.14, sigma)
    # -> no penalty, C 1000 -> 1.0; 0.20 unexplored: hi 0.14 -> 50*0.09 + 0.25 = 4.75         => 0.05
    d = c.decide(0.12, 500, 0.01)
    assert d.objective == pytest.approx({0.05: 1.0, 0.10: 3.0, 0.20: 4.75}) and d.theta_after == 0.05
    # d2 at 0.05 (new pool): AL 0.09 +- 0.02 -> lo 0.05 -> f = 0 + 1.0; 0.02 unexplored: hi = min(0.13, 0.05)
    # -> 2500/1000 = 2.5; 0.10 memo: hi 0.14 -> 4.5 + 0.5 = 5.0                               => stay
    d = c.decide(0.09, 1000, 0.02)
    assert d.objective == pytest.approx({0.02: 2.5, 0.05: 1.0, 0.10: 5.0}) and d.theta_after == 0.05
    assert d.pooled == pytest.approx({"mean": 0.09, "se": 0.02, "n": 1, "lo": 0.05, "hi": 0.13})
    # d3: pool (0.09, 0.03): mean 0.06, SE 0.03 (test_pool_standard_error_by_hand) -> lo 0, hi 0.12: stay
    d = c.decide(0.03, 1000, 0.02)
    assert d.pooled["lo"] == pytest.approx(0.0) and d.theta_after == 0.05
    # d4: pool (0.09, 0.03, 0.045): mean 0.055, SE max(0.011547, 0.018028) -> lo 0.018944: f 1.0, stay
    d = c.decide(0.045, 1000, 0.02)
    assert d.pooled["se"] == pytest.approx(0.018028, abs=1e-6) and d.theta_after == 0.05
    assert [h.theta_after for h in c.history] == [0.05, 0.05, 0.05, 0.05]

    # The paper's point rule on the same trips walks on to 2%: d2 at 0.05 has f = 50*0.04 + 1 = 3.0 > 2.5
    p = ctl()
    assert p.decide(0.12, 500).theta_after == 0.05
    assert p.decide(0.09, 1000).theta_after == 0.02


def test_clear_excess_still_tightens_at_once():
    c = bounded(start=0.05)
    # AL 0.20 +- 0.01 at 0.05: lo 0.18 -> f = 50*0.13 + 1.0 = 7.5; 0.02 est. 2.5                => 0.02
    d = c.decide(0.20, 1000, 0.01)
    assert d.objective[0.05] == pytest.approx(7.5) and d.theta_after == 0.02


def test_loosens_only_once_the_upper_bound_is_below_sigma():
    c = bounded()
    # d1 at 0.10: AL 0.03 +- 0.02 -> lo -0.01, hi 0.07. f(0.10) = 0.5; 0.20 unexplored at hi 0.07:
    # 50*0.02 + 0.25 = 1.25; 0.05: 1.0                                                         => stay
    d = c.decide(0.03, 500, 0.02)
    assert d.objective == pytest.approx({0.05: 1.0, 0.10: 0.5, 0.20: 1.25}) and d.theta_after == 0.10
    # (the point rule would loosen at once: 0.20 est. AL 0.03 -> 0.25 < 0.5)
    assert ctl().decide(0.03, 500).theta_after == 0.20
    # d2: pool (0.03, 0.01): mean 0.02, SE max(sqrt(0.0008)/2, 0.01) = 0.014142 -> hi 0.048284 < sigma;
    # 0.20 at hi: no penalty, C 250 -> 0.25 < 0.5                                              => 0.20
    d = c.decide(0.01, 500, 0.02)
    assert d.pooled["hi"] == pytest.approx(0.02 + 2 * math.sqrt(0.0008) / 2)
    assert d.objective[0.20] == pytest.approx(0.25) and d.theta_after == 0.20


def test_memo_of_a_bad_looser_theta_blocks_the_way_back():
    c = bounded(start=0.20)
    # at 0.20: AL 0.15 +- 0.01 -> lo 0.13: f = 4.0 + 0.25 = 4.25; 0.10 est.: hi min(0.17, 0.05) -> 0.5  => 0.10
    assert c.decide(0.15, 250, 0.01).theta_after == 0.10
    # at 0.10: AL 0.0 +- 0.005 -> hi 0.01; f = 0.5; 0.20 memo hi 0.17 -> 6.0 + 0.25; 0.05 est. 1.0       => stay
    d = c.decide(0.0, 500, 0.005)
    assert d.objective[0.20] == pytest.approx(6.25) and d.theta_after == 0.10 and 0.20 not in d.estimated


def test_a_new_visit_restarts_the_pool():
    c = bounded(window=2)
    c.decide(0.30, 500, 0.01)  # 0.10 -> 0.05
    c.decide(0.20, 1000, 0.01)  # at 0.05: lo 0.18 -> f 7.5 > 0.02's 2.5                         => 0.02
    assert c.theta == 0.02
    # at 0.02: AL 0.0 +- 0.001 -> f = 2.5; 0.05 memo hi 0.22 -> 8.5 + 1.0                         => stay
    assert c.decide(0.0, 2500, 0.001).theta_after == 0.02
    assert c.memo[2].als == [0.30] and c.memo[1].als == [0.20] and c.memo[0].als == [0.0]
    c.decide(0.0, 2500, 0.001)
    c.decide(0.0, 2500, 0.001)
    assert c.memo[0].als == [0.0, 0.0]  # window 2


def test_checkpoint_roundtrip():
    c = bounded()
    c.decide(0.30, 500, 0.01)
    c.decide(0.09, 1000, 0.02)
    c2 = bounded()
    c2.load_state_dict(c.state_dict())
    assert c2.theta == c.theta and c2.memo == c.memo and c2.last_index == c.last_index
    # the restored controller continues the same pool (0.05's second trip)
    assert c2.decide(0.03, 1000, 0.02).pooled == c.decide(0.03, 1000, 0.02).pooled
    assert c.memo[1].n == 2


# ---- the measurement and the cadence -------------------------------------------------------------

def test_accuracy_variance_by_hand():
    # 98 of 100: p~ = 99/102 = 0.970588; var = 0.970588 * 0.029412 / 100 = 0.000285467
    assert accuracy_variance(98, 100) == pytest.approx(99 / 102 * 3 / 102 / 100)
    assert accuracy_variance(0, 1) == pytest.approx(2 / 9)  # p~ = 1/3
    assert accuracy_variance(100, 100) > 0  # a perfect trip still reports an error


def test_samples_sized_for_the_standard_error():
    # ceil(0.5 / (K * se^2)): K=5, se 0.01 -> 1000; K=3 -> 1666.67 -> 1667; se 0.02, K=5 -> 250
    assert SkewScoutConfig().samples(5) == 1000
    assert SkewScoutConfig().samples(3) == 1667
    assert SkewScoutConfig(travel_se=0.02).samples(5) == 250
    assert SkewScoutConfig(travel_samples=100).samples(5) == 100
    # worst case at n = 1000, K = 5: sqrt(5 * 2 * 0.25 / 1000) / 5 = 0.01
    assert math.sqrt(5 * 2 * 0.25 / 1000) / 5 == pytest.approx(0.01)


def test_travel_cadence_in_steps_or_decisions():
    assert SkewScoutConfig().interval_steps(64000) == 500  # the paper's default
    assert SkewScoutConfig(travel_every=100).interval_steps(64000) == 100
    assert SkewScoutConfig(travel_decisions=128).interval_steps(64000) == 500  # the paper's 128 decisions
    assert SkewScoutConfig(travel_decisions=128).interval_steps(1200) == 9  # 1200 // 128: 133 decisions
    assert SkewScoutConfig(travel_decisions=128).interval_steps(10) == 1  # more decisions than steps: every step
    with pytest.raises(ValueError, match="give one"):
        SkewScoutConfig(travel_every=500, travel_decisions=128)
    for bad in ({"travel_decisions": 0}, {"travel_every": True}, {"travel_se": 0.0}, {"al_confidence": 1.0},
                {"skewscout_grid": (0.1, 0.1)}, {"skewscout_grid": (-0.1,)}):
        with pytest.raises(ValueError):
            SkewScoutConfig(**bad)


def test_descending_knob_estimates_more_bytes_for_the_tighter_neighbour():
    """DGC's E_warm grid runs 8, 4, 2 (most communication first): a longer warm-up costs more, so bytes ~ theta."""
    grid = (8.0, 4.0, 2.0)
    c = Controller(grid, 4.0, model_exchange_bytes=1000, confidence=0.5, window=1, comm_ratio=comm_ratio_for(grid))
    # at 4: AL 0 -> f = 400/1000 = 0.4; 8 est. C = 400 * 8/4 = 800 -> 0.8; 2 est. C = 200 -> 0.2   => 2
    d = c.decide(0.0, 400)
    assert d.objective == pytest.approx({8.0: 0.8, 4.0: 0.4, 2.0: 0.2}) and d.theta_after == 2.0
    assert comm_ratio_for(GRID)(0.1, 0.05) == 2.0  # T0: halving it doubles the bytes
