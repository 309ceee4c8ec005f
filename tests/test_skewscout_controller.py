"""SkewScout controller (Quagmire §7.2, Eq. 1) on scripted (theta, AL, C) sequences whose
moves are worked out by hand. Grid = Gaia's T0 grid; CM = 1000 B; lambda_AL=50, lambda_C=1,
sigma_AL=0.05."""

import pytest

from geodml.skewscout.controller import Controller

GRID = (0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50)


def ctl(start=0.10, **kw):
    return Controller(GRID, start, model_exchange_bytes=1000, **kw)


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


def test_checkpoint_roundtrip():
    c = ctl()
    c.decide(0.30, 500)
    c2 = ctl()
    c2.load_state_dict(c.state_dict())
    assert c2.theta == c.theta and c2.al_memo == c.al_memo
    assert c2.decide(0.07, 1000).theta_after == c.decide(0.07, 1000).theta_after
